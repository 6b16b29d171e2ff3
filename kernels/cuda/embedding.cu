// See embedding.h for the design.
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/element_types.cuh"
#include "kernels/cuda/embedding.h"

namespace swarm::cuda {
namespace {

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kVectorBytes = 16;
constexpr int kRowThreads = 128;            // forward: one block per (b, t) row
constexpr int kWarpsPerBlock = 4;           // backward dwte: one warp per sorted position
constexpr int kColumnsPerLane = 8;          // ... covering this many columns per lane,
constexpr int kColumnsPerWarp = kWarp * kColumnsPerLane;  // a grid.y slice of C this wide
constexpr int kMaxColumnSlices = 65535;     // grid.y limit
constexpr int kFlatThreads = 256;
constexpr int64_t kMaxFlatBlocks = 1 << 15;

template <typename E, int kCount>
struct alignas(kVectorBytes) Pack {
  E v[kCount];
};

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kVectorBytes == 0; }

template <typename D>
__global__ void embedding_forward_kernel(D* out, const int32_t* tokens, const D* wte, const D* wpe, int T, int C,
                                         int V, bool vectorized) {
  const int64_t row = blockIdx.x;  // b * T + t
  const int64_t t = row % T;
  const int32_t token = tokens[row];
  const bool valid = token >= 0 && token < V;  // the same for the whole block
  D* y = out + row * C;
  const D* token_row = wte + (valid ? static_cast<int64_t>(token) * C : 0);
  const D* position_row = wpe + t * C;
  if (vectorized) {
    constexpr int kVec = kVectorBytes / sizeof(D);
    using P = Pack<D, kVec>;
    const int packs = C / kVec;
    for (int p = threadIdx.x; p < packs; p += blockDim.x) {
      P sum;
      if (valid) {
        const P a = reinterpret_cast<const P*>(token_row)[p];
        const P b = reinterpret_cast<const P*>(position_row)[p];
#pragma unroll
        for (int k = 0; k < kVec; ++k) sum.v[k] = from_float<D>(to_float(a.v[k]) + to_float(b.v[k]));
      } else {
#pragma unroll
        for (int k = 0; k < kVec; ++k) sum.v[k] = from_float<D>(0.0f);
      }
      reinterpret_cast<P*>(y)[p] = sum;
    }
  } else {
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      y[c] = from_float<D>(valid ? to_float(token_row[c]) + to_float(position_row[c]) : 0.0f);
    }
  }
}

// Sort input: key = token, or V for a token outside [0, V) so those sort last;
// value = position b * T + t.
__global__ void sort_input_kernel(uint32_t* keys, int32_t* positions, const int32_t* tokens, int BT, int V) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < BT; i += stride) {
    const int32_t token = tokens[i];
    keys[i] = (token >= 0 && token < V) ? static_cast<uint32_t>(token) : static_cast<uint32_t>(V);
    positions[i] = static_cast<int32_t>(i);
  }
}

// One warp per sorted index i; the warp at the first index of a token's run adds
// that run's dout rows, in position order, onto dwte[token] (columns of slice
// blockIdx.y). Every other warp leaves at once.
template <typename D>
__global__ void token_gradient_kernel(float* dwte, const D* dout, const uint32_t* sorted_tokens,
                                      const int32_t* sorted_positions, int BT, int C, int V) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  // Every exit below is uniform across the warp, so the shuffles see all 32 lanes.
  if (i >= BT) return;
  const uint32_t token = sorted_tokens[i];
  if (token >= static_cast<uint32_t>(V)) return;     // an out-of-range token: skipped
  if (i > 0 && sorted_tokens[i - 1] == token) return;  // not the first of its run
  const int first_column = blockIdx.y * kColumnsPerWarp + lane;
  float* grad = dwte + static_cast<int64_t>(token) * C;
  float acc[kColumnsPerLane];
#pragma unroll
  for (int k = 0; k < kColumnsPerLane; ++k) {
    const int c = first_column + k * kWarp;
    acc[k] = c < C ? grad[c] : 0.0f;
  }
  // The run is read 32 entries at a time so that row addresses do not wait on each
  // other; the adds stay in position order.
  for (int64_t base = i; base < BT; base += kWarp) {
    const int64_t j = base + lane;
    const bool in_run = j < BT && sorted_tokens[j] == token;
    const int32_t position = in_run ? sorted_positions[j] : 0;
    const int count = __popc(__ballot_sync(kFullMask, in_run));  // a prefix of the lanes: keys are sorted
    for (int r = 0; r < count; ++r) {
      const D* dy = dout + static_cast<int64_t>(__shfl_sync(kFullMask, position, r)) * C;
#pragma unroll
      for (int k = 0; k < kColumnsPerLane; ++k) {
        const int c = first_column + k * kWarp;
        if (c < C) acc[k] += to_float(dy[c]);
      }
    }
    if (count < kWarp) break;
  }
#pragma unroll
  for (int k = 0; k < kColumnsPerLane; ++k) {
    const int c = first_column + k * kWarp;
    if (c < C) grad[c] = acc[k];
  }
}

// dwpe[t, c] += sum over b in order of dout[b, t, c]; one thread per (t, c). Rows
// with an out-of-range token are skipped: forward did not add wpe to them.
template <typename D>
__global__ void position_gradient_kernel(float* dwpe, const D* dout, const int32_t* tokens, int B, int T, int C,
                                         int V) {
  const int64_t TC = static_cast<int64_t>(T) * C;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < TC; idx += stride) {
    const int64_t t = idx / C;
    float acc = dwpe[idx];
    for (int b = 0; b < B; ++b) {
      const int32_t token = tokens[b * static_cast<int64_t>(T) + t];
      if (token >= 0 && token < V) acc += to_float(dout[b * TC + idx]);
    }
    dwpe[idx] = acc;
  }
}

Status check_shape(const char* op, int B, int T, int C, int V, std::initializer_list<const void*> pointers) {
  if (B < 0 || T < 0 || C < 1 || V < 1) {
    return invalid_argument("{}: need B >= 0, T >= 0, C >= 1, V >= 1, got B={} T={} C={} V={}", op, B, T, C, V);
  }
  const int64_t rows = static_cast<int64_t>(B) * T;
  if (rows > INT32_MAX) return invalid_argument("{}: B * T = {} exceeds the int range", op, rows);
  for (const void* p : pointers) {
    if (p == nullptr && rows > 0) return invalid_argument("{}: a null device pointer", op);
  }
  return Status::ok();
}

int64_t flat_blocks(int64_t work) {
  return std::clamp<int64_t>((work + kFlatThreads - 1) / kFlatThreads, 1, kMaxFlatBlocks);
}

int64_t round_up(int64_t bytes) { return (bytes + 255) / 256 * 256; }

// Device scratch from cudaMallocAsync, freed on the stream on every path.
class StreamScratch {
 public:
  explicit StreamScratch(cudaStream_t stream) : stream_(stream) {}
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  ~StreamScratch() {
    if (ptr_ != nullptr) (void)cudaFreeAsync(ptr_, stream_);  // an error path: the first error is reported
  }
  Status allocate(size_t bytes) {
    SWARM_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&ptr_, bytes, stream_));
    return Status::ok();
  }
  Status release() {
    void* p = ptr_;
    ptr_ = nullptr;
    SWARM_CUDA_RETURN_IF_ERROR(cudaFreeAsync(p, stream_));
    return Status::ok();
  }
  char* get() const { return static_cast<char*>(ptr_); }

 private:
  cudaStream_t stream_;
  void* ptr_ = nullptr;
};

template <typename T>
Status embedding_forward_impl(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int T_, int C, int V,
                              cudaStream_t stream) {
  SWARM_RETURN_IF_ERROR(check_shape("embedding_forward", B, T_, C, V, {out, tokens, wte, wpe}));
  const int64_t rows = static_cast<int64_t>(B) * T_;
  if (rows == 0) return Status::ok();
  using D = typename device_type<T>::type;
  constexpr int kVec = kVectorBytes / sizeof(D);
  const bool vectorized = C % kVec == 0 && aligned(out) && aligned(wte) && aligned(wpe);
  embedding_forward_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
      device_cast(out), tokens, device_cast(wte), device_cast(wpe), T_, C, V, vectorized);
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::ok();
}

template <typename T>
Status embedding_backward_impl(float* dwte, float* dwpe, const T* dout, const int32_t* tokens, int B, int T_, int C,
                               int V, cudaStream_t stream) {
  SWARM_RETURN_IF_ERROR(check_shape("embedding_backward", B, T_, C, V, {dwte, dwpe, dout, tokens}));
  const int64_t rows = static_cast<int64_t>(B) * T_;
  if (rows == 0) return Status::ok();
  const int64_t column_slices = (static_cast<int64_t>(C) + kColumnsPerWarp - 1) / kColumnsPerWarp;
  if (column_slices > kMaxColumnSlices) {
    return unimplemented("embedding_backward: C = {} is beyond {}", C, int64_t{kMaxColumnSlices} * kColumnsPerWarp);
  }
  const int BT = static_cast<int>(rows);
  const auto* d_dout = device_cast(dout);

  // Keys lie in [0, V]: sort only the bits that V needs.
  int end_bit = 0;
  while ((int64_t{1} << end_bit) <= V) ++end_bit;

  size_t sort_bytes = 0;
  SWARM_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), BT, 0, end_bit, stream));
  const int64_t index_bytes = round_up(static_cast<int64_t>(BT) * 4);
  StreamScratch scratch(stream);
  SWARM_RETURN_IF_ERROR(scratch.allocate(static_cast<size_t>(4 * index_bytes + round_up(sort_bytes))));
  auto* keys = reinterpret_cast<uint32_t*>(scratch.get());
  auto* positions = reinterpret_cast<int32_t*>(scratch.get() + index_bytes);
  auto* sorted_keys = reinterpret_cast<uint32_t*>(scratch.get() + 2 * index_bytes);
  auto* sorted_positions = reinterpret_cast<int32_t*>(scratch.get() + 3 * index_bytes);
  void* sort_storage = scratch.get() + 4 * index_bytes;

  sort_input_kernel<<<static_cast<unsigned>(flat_blocks(BT)), kFlatThreads, 0, stream>>>(keys, positions, tokens, BT,
                                                                                         V);
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  SWARM_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(sort_storage, sort_bytes, keys, sorted_keys, positions,
                                                             sorted_positions, BT, 0, end_bit, stream));
  const dim3 token_grid(static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock),
                        static_cast<unsigned>(column_slices));
  token_gradient_kernel<<<token_grid, kWarpsPerBlock * kWarp, 0, stream>>>(dwte, d_dout, sorted_keys,
                                                                           sorted_positions, BT, C, V);
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  SWARM_RETURN_IF_ERROR(scratch.release());

  const int64_t TC = static_cast<int64_t>(T_) * C;
  position_gradient_kernel<<<static_cast<unsigned>(flat_blocks(TC)), kFlatThreads, 0, stream>>>(dwpe, d_dout, tokens, B,
                                                                                                T_, C, V);
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::ok();
}

}  // namespace

Status embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C,
                         int V, cudaStream_t stream) {
  return embedding_forward_impl(out, tokens, wte, wpe, B, T, C, V, stream);
}
Status embedding_forward(swarm::bf16* out, const int32_t* tokens, const swarm::bf16* wte, const swarm::bf16* wpe,
                         int B, int T, int C, int V, cudaStream_t stream) {
  return embedding_forward_impl(out, tokens, wte, wpe, B, T, C, V, stream);
}

Status embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C,
                          int V, cudaStream_t stream) {
  return embedding_backward_impl(dwte, dwpe, dout, tokens, B, T, C, V, stream);
}
Status embedding_backward(float* dwte, float* dwpe, const swarm::bf16* dout, const int32_t* tokens, int B, int T,
                          int C, int V, cudaStream_t stream) {
  return embedding_backward_impl(dwte, dwpe, dout, tokens, B, T, C, V, stream);
}

}  // namespace swarm::cuda
