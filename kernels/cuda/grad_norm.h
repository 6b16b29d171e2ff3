// grad_norm (CUDA): the parameter list a device training step updates, and the global gradient
// norm over it, bit-identical to swarm::optim::global_grad_norm on the CPU.
//
// Design: the CPU sums squares in double, sequentially within fixed chunks of kNormChunk
// elements, then the chunks of a tensor in order, then the tensors in order. The device does
// exactly that: one thread per chunk (the product of two floats is exact in double, so only the
// order of the additions matters, and it is the CPU's), then one block adds the chunks of each
// tensor in order and one thread adds the tensors in order. The grid follows the tensor sizes,
// never the device, so every GPU and the CPU get the same bits: a replica may run either.
// Double rather than a float tree because the CPU does, and because 2^30 squares summed in
// float would lose the small gradients. The price: each chunk is one dependent chain of 16384
// additions (tens of microseconds whatever the model size), and neighbouring threads read 64 KiB
// apart, which leans on L1 (16-byte loads where the tensor is aligned).
//
// The result stays in device memory: the optimizer kernels read the clip coefficient and the
// refusal flag from it, so a training step never waits for the host.
//
//   SWARM_ASSIGN_OR_RETURN(auto list, swarm::cuda::DeviceParamList::create(params));   // once
//   SWARM_RETURN_IF_ERROR(swarm::cuda::global_grad_norm(list, config.clip_norm, d_norm, stream));
#pragma once

#include <cuda_runtime_api.h>
#include <vector_types.h>  // float4

#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "swarm/core/dtype.h"
#include "swarm/core/status.h"

namespace swarm::cuda {

// One parameter tensor; every pointer is a device pointer. Buffers of different params (and of
// one param) must not overlap.
struct DeviceParam {
  float* weight = nullptr;          // f32 master weights, updated in place
  const float* grad = nullptr;      // f32, read only (clipping is applied on the fly)
  float* m = nullptr;               // Adam moments: zero before the first step
  float* v = nullptr;
  swarm::bf16* compute_copy = nullptr;  // optional: set to bf16(weight) by every update; null if unused
  int64_t numel = 0;
  bool apply_weight_decay = true;   // false for biases and norm gains
};

// Lives in device memory (the caller allocates it, zeroed). global_grad_norm writes it; the
// optimizer steps read it.
struct GradNormResult {
  float norm = 0.0f;              // as swarm::optim::global_grad_norm, bit for bit
  float clip_coefficient = 1.0f;  // swarm::optim::clip_coefficient(norm, clip_norm)
  uint32_t refused = 0;           // 1 when norm is not finite: the next optimizer step changes nothing
  uint32_t refused_steps = 0;     // how many norms were refused so far; never reset by the kernels
};

// The CPU optimizer's norm chunk (optimizer.cc); the bits depend on it.
inline constexpr int64_t kNormChunk = int64_t{1} << 14;

SWARM_HOST_DEVICE inline int64_t norm_chunk_count(int64_t numel) { return (numel + kNormChunk - 1) / kNormChunk; }

struct ChunkRange {
  int64_t begin = 0;
  int64_t end = 0;
};

// The elements of chunk `chunk` (counted within its param) of a param with `numel` elements.
SWARM_HOST_DEVICE inline ChunkRange chunk_range(int64_t numel, int64_t chunk) {
  const int64_t begin = chunk * kNormChunk;
  const int64_t end = begin + kNormChunk < numel ? begin + kNormChunk : numel;
  return {begin, end};
}

// Sum of x[i]^2 over [begin, end) in double, in index order: the CPU's per-chunk sum. Each square
// is exact in double, so only the order of the additions decides the bits.
SWARM_HOST_DEVICE inline double sum_of_squares_in_order(const float* x, int64_t begin, int64_t end) {
  double sum = 0.0;
  for (int64_t i = begin; i < end; ++i) sum += static_cast<double>(x[i]) * x[i];
  return sum;
}

// Four floats at once from a 16-byte aligned address that nothing writes while the kernel runs
// (the read-only cache on the device; memcpy on the host: no aliasing games).
SWARM_HOST_DEVICE inline float4 load_float4(const float* p) {
#if defined(__CUDA_ARCH__)
  return __ldg(reinterpret_cast<const float4*>(p));
#else
  float4 q;
  std::memcpy(&q, p, sizeof(q));
  return q;
#endif
}

SWARM_HOST_DEVICE inline bool is_16_byte_aligned(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & uintptr_t{15}) == 0;
}

// sum_of_squares_in_order with 16-byte loads where x + begin is aligned: the same additions in
// the same order, a quarter of the load instructions.
SWARM_HOST_DEVICE inline double sum_of_squares_vectorized(const float* x, int64_t begin, int64_t end) {
  double sum = 0.0;
  int64_t i = begin;
  if (is_16_byte_aligned(x + begin)) {
    for (; i + 4 <= end; i += 4) {
      const float4 q = load_float4(x + i);
      sum += static_cast<double>(q.x) * q.x;
      sum += static_cast<double>(q.y) * q.y;
      sum += static_cast<double>(q.z) * q.z;
      sum += static_cast<double>(q.w) * q.w;
    }
  }
  for (; i < end; ++i) sum += static_cast<double>(x[i]) * x[i];
  return sum;
}

// Where each param's chunks start in the flat chunk numbering: first_chunk[k] for param k, and
// first_chunk[size] = the total. Host side of DeviceParamList, exposed for tests.
std::vector<int64_t> chunk_starts(std::span<const DeviceParam> params);

// The params of one model (or stage), uploaded once, plus the scratch its reductions need. Calls
// that use one list must be ordered on one stream: they share the scratch.
class DeviceParamList {
 public:
  DeviceParamList() = default;  // empty: no params, no device memory
  DeviceParamList(DeviceParamList&& other) noexcept;
  DeviceParamList& operator=(DeviceParamList&& other) noexcept;
  DeviceParamList(const DeviceParamList&) = delete;
  DeviceParamList& operator=(const DeviceParamList&) = delete;
  ~DeviceParamList();

  // Checks the params (invalid_argument: a negative numel, a null buffer where numel > 0,
  // overlapping buffers), then uploads them. Setup, not a step: this allocates and synchronizes.
  // An empty list touches no device.
  static Result<DeviceParamList> create(std::span<const DeviceParam> params);

  int64_t size() const { return static_cast<int64_t>(host_params_.size()); }
  int64_t chunk_count() const { return chunk_count_; }
  const std::vector<DeviceParam>& params() const { return host_params_; }

  // Device arrays, for the kernels.
  struct DeviceArrays {
    const DeviceParam* params = nullptr;    // [size]
    const int64_t* first_chunk = nullptr;   // [size + 1]
    const int32_t* chunk_param = nullptr;   // [chunk_count]: the param each chunk belongs to
    double* chunk_sums = nullptr;           // [2 * chunk_count] scratch
    double* param_sums = nullptr;           // [size] scratch
    float* param_scale = nullptr;           // [size] scratch
  };
  const DeviceArrays& device_arrays() const { return device_; }

 private:
  void release();

  std::vector<DeviceParam> host_params_;
  int64_t chunk_count_ = 0;
  void* allocation_ = nullptr;  // one cudaMalloc holding every DeviceArrays array
  DeviceArrays device_;
};

// Writes the norm of all grads, its clip coefficient (clip_norm <= 0: no clipping) and whether
// the step must be refused into *result (device memory). invalid_argument for a null result or
// a non-finite clip_norm.
Status global_grad_norm(const DeviceParamList& params, float clip_norm, GradNormResult* result,
                        cudaStream_t stream);

}  // namespace swarm::cuda
