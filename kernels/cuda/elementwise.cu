// See elementwise.h for the design.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/common/gelu.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/element_types.cuh"
#include "kernels/cuda/elementwise.h"

namespace swarm::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1 << 15;  // beyond this the grid-stride loop takes over
constexpr int kVectorBytes = 16;

// kCount elements moved as one 16-byte-aligned unit (two units for 8 floats).
template <typename E, int kCount>
struct alignas(kVectorBytes) Pack {
  E v[kCount];
};

// Elements per vector step: 16 bytes of the narrower type.
template <typename Out, typename In>
constexpr int vector_width() {
  return kVectorBytes / (sizeof(Out) < sizeof(In) ? sizeof(Out) : sizeof(In));
}

// Exact for every bf16, NaN payloads included: the hardware conversion on sm_90
// (cvt.f32.bf16) is not documented to keep them, and convert promises bits.
__device__ __forceinline__ float widen(float x) { return x; }
__device__ __forceinline__ float widen(__nv_bfloat16 x) {
  return __uint_as_float(static_cast<uint32_t>(__bfloat16_as_ushort(x)) << 16);
}

// out[i] = op(in[0][i], ..., in[kInputs - 1][i]) for i < n; inputs may alias out.
// op takes kInputs floats and returns an Out.
template <int kInputs, typename Out, typename In, typename Op>
__global__ void map_kernel(Out* out, const In* in0, const In* in1, const In* in2, int64_t n, bool vectorized,
                           Op op) {
  constexpr int kVec = vector_width<Out, In>();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t scalar_begin = 0;
  if (vectorized) {
    const int64_t packs = n / kVec;
    for (int64_t p = first; p < packs; p += stride) {
      Pack<In, kVec> a, b, c;
      if constexpr (kInputs >= 1) a = reinterpret_cast<const Pack<In, kVec>*>(in0)[p];
      if constexpr (kInputs >= 2) b = reinterpret_cast<const Pack<In, kVec>*>(in1)[p];
      if constexpr (kInputs >= 3) c = reinterpret_cast<const Pack<In, kVec>*>(in2)[p];
      Pack<Out, kVec> y;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        if constexpr (kInputs == 1) y.v[k] = op(widen(a.v[k]));
        if constexpr (kInputs == 2) y.v[k] = op(widen(a.v[k]), widen(b.v[k]));
        if constexpr (kInputs == 3) y.v[k] = op(widen(a.v[k]), widen(b.v[k]), widen(c.v[k]));
      }
      reinterpret_cast<Pack<Out, kVec>*>(out)[p] = y;
    }
    scalar_begin = packs * kVec;
  }
  for (int64_t i = scalar_begin + first; i < n; i += stride) {
    if constexpr (kInputs == 1) out[i] = op(widen(in0[i]));
    if constexpr (kInputs == 2) out[i] = op(widen(in0[i]), widen(in1[i]));
    if constexpr (kInputs == 3) out[i] = op(widen(in0[i]), widen(in1[i]), widen(in2[i]));
  }
}

template <typename Out>
struct GeluForwardOp {
  __device__ Out operator()(float x) const { return from_float<Out>(kernels::gelu_tanh(x)); }
};

// (dinp, inp, dout) -> dinp + gelu'(inp) * dout, in the CPU's order.
template <typename Out>
struct GeluBackwardOp {
  __device__ Out operator()(float dinp, float x, float dout) const {
    return from_float<Out>(dinp + dout * kernels::gelu_tanh_derivative(x));
  }
};

template <typename Out>
struct AddOp {
  __device__ Out operator()(float a, float b) const { return from_float<Out>(a + b); }
};

// swarm::bf16::from_float bit for bit; the hardware conversion would give every NaN
// the canonical pattern instead of keeping sign and payload.
struct ToBf16Op {
  __device__ __nv_bfloat16 operator()(float x) const {
    const uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __ushort_as_bfloat16(static_cast<unsigned short>((u >> 16) | 0x40u));
    const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return __ushort_as_bfloat16(static_cast<unsigned short>((u + rounding) >> 16));
  }
};

struct ToFloatOp {
  __device__ float operator()(float x) const { return x; }
};

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kVectorBytes == 0; }

// Checks n and the first `count` pointers.
Status check_args(const char* op, int64_t n, const void* const* pointers, int count) {
  if (n < 0) return invalid_argument("{}: n must be >= 0, got {}", op, n);
  for (int i = 0; i < count; ++i) {
    if (pointers[i] == nullptr && n > 0) return invalid_argument("{}: a null device pointer", op);
  }
  return Status::ok();
}

// Checks the arguments, then runs map_kernel over host-typed pointers (swarm::bf16 or
// float); unused inputs are nullptr.
template <int kInputs, typename HostOut, typename HostIn, typename Op>
Status launch_map(const char* name, HostOut* out, const HostIn* in0, const HostIn* in1, const HostIn* in2, int64_t n,
                  cudaStream_t stream, Op op) {
  const void* const pointers[] = {out, in0, in1, in2};
  SWARM_RETURN_IF_ERROR(check_args(name, n, pointers, 1 + kInputs));
  if (n == 0) return Status::ok();
  auto* d_out = device_cast(out);
  auto* d_in0 = device_cast(in0);
  auto* d_in1 = device_cast(in1);
  auto* d_in2 = device_cast(in2);
  using DeviceOut = std::remove_pointer_t<decltype(d_out)>;
  using DeviceIn = std::remove_const_t<std::remove_pointer_t<decltype(d_in0)>>;
  constexpr int kVec = vector_width<DeviceOut, DeviceIn>();
  const bool vectorized = aligned(out) && aligned(in0) && (kInputs < 2 || aligned(in1)) && (kInputs < 3 || aligned(in2));
  const int64_t work = vectorized ? n / kVec + n % kVec : n;
  const int64_t blocks = std::min<int64_t>((work + kThreads - 1) / kThreads, kMaxBlocks);
  map_kernel<kInputs><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(d_out, d_in0, d_in1, d_in2, n,
                                                                              vectorized, op);
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::ok();
}

template <typename T>
Status gelu_forward_impl(T* out, const T* inp, int64_t n, cudaStream_t stream) {
  using D = typename device_type<T>::type;
  return launch_map<1>("gelu_forward", out, inp, static_cast<const T*>(nullptr), static_cast<const T*>(nullptr), n,
                       stream, GeluForwardOp<D>{});
}

template <typename T>
Status gelu_backward_impl(T* dinp, const T* inp, const T* dout, int64_t n, cudaStream_t stream) {
  using D = typename device_type<T>::type;
  return launch_map<3>("gelu_backward", dinp, static_cast<const T*>(dinp), inp, dout, n, stream, GeluBackwardOp<D>{});
}

template <typename T>
Status residual_forward_impl(T* out, const T* a, const T* b, int64_t n, cudaStream_t stream) {
  using D = typename device_type<T>::type;
  return launch_map<2>("residual_forward", out, a, b, static_cast<const T*>(nullptr), n, stream, AddOp<D>{});
}

template <typename T>
Status accumulate_impl(T* dst, const T* src, int64_t n, cudaStream_t stream) {
  using D = typename device_type<T>::type;
  return launch_map<2>("accumulate", dst, static_cast<const T*>(dst), src, static_cast<const T*>(nullptr), n, stream,
                       AddOp<D>{});
}

template <typename T>
Status fill_zero_impl(T* dst, int64_t n, cudaStream_t stream) {
  const void* const pointers[] = {dst};
  SWARM_RETURN_IF_ERROR(check_args("fill_zero", n, pointers, 1));
  if (n == 0) return Status::ok();
  // All-zero bits are +0 in float and in bf16.
  SWARM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dst, 0, static_cast<size_t>(n) * sizeof(T), stream));
  return Status::ok();
}

}  // namespace

Status gelu_forward(float* out, const float* inp, int64_t n, cudaStream_t stream) {
  return gelu_forward_impl(out, inp, n, stream);
}
Status gelu_forward(swarm::bf16* out, const swarm::bf16* inp, int64_t n, cudaStream_t stream) {
  return gelu_forward_impl(out, inp, n, stream);
}

Status gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n, cudaStream_t stream) {
  return gelu_backward_impl(dinp, inp, dout, n, stream);
}
Status gelu_backward(swarm::bf16* dinp, const swarm::bf16* inp, const swarm::bf16* dout, int64_t n,
                     cudaStream_t stream) {
  return gelu_backward_impl(dinp, inp, dout, n, stream);
}

Status residual_forward(float* out, const float* a, const float* b, int64_t n, cudaStream_t stream) {
  return residual_forward_impl(out, a, b, n, stream);
}
Status residual_forward(swarm::bf16* out, const swarm::bf16* a, const swarm::bf16* b, int64_t n,
                        cudaStream_t stream) {
  return residual_forward_impl(out, a, b, n, stream);
}

Status accumulate(float* dst, const float* src, int64_t n, cudaStream_t stream) {
  return accumulate_impl(dst, src, n, stream);
}
Status accumulate(swarm::bf16* dst, const swarm::bf16* src, int64_t n, cudaStream_t stream) {
  return accumulate_impl(dst, src, n, stream);
}

Status fill_zero(float* dst, int64_t n, cudaStream_t stream) { return fill_zero_impl(dst, n, stream); }
Status fill_zero(swarm::bf16* dst, int64_t n, cudaStream_t stream) { return fill_zero_impl(dst, n, stream); }

Status convert(swarm::bf16* dst, const float* src, int64_t n, cudaStream_t stream) {
  return launch_map<1>("convert", dst, src, static_cast<const float*>(nullptr), static_cast<const float*>(nullptr), n,
                       stream, ToBf16Op{});
}
Status convert(float* dst, const swarm::bf16* src, int64_t n, cudaStream_t stream) {
  return launch_map<1>("convert", dst, src, static_cast<const swarm::bf16*>(nullptr),
                       static_cast<const swarm::bf16*>(nullptr), n, stream, ToFloatOp{});
}

}  // namespace swarm::cuda
