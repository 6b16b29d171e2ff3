// element_types: how the host-side element types map onto CUDA's, inside .cu files only.
//
// Launcher headers take swarm::bf16 (a 16-bit host struct, swarm/core/dtype.h) so
// C++ code never needs cuda_bf16.h; the .cu side reinterprets it as
// __nv_bfloat16, which has the same size and the same round-to-nearest-even
// conversion from float. Arithmetic is always in float: load_float/store_float
// convert at the memory boundary.
//
//   template <typename T> __global__ void scale(T* x, int n) {
//     int i = blockIdx.x * blockDim.x + threadIdx.x;
//     if (i < n) store_float(x + i, 2.0f * load_float(x + i));
//   }
//   scale<<<g, b, 0, stream>>>(device_cast(host_typed_ptr), n);
#pragma once

#include <cuda_bf16.h>

#include <type_traits>

#include "swarm/core/dtype.h"

namespace swarm::cuda {

static_assert(sizeof(swarm::bf16) == sizeof(__nv_bfloat16));

template <typename T>
struct device_type {
  using type = T;
};
template <>
struct device_type<swarm::bf16> {
  using type = __nv_bfloat16;
};
template <>
struct device_type<const swarm::bf16> {
  using type = const __nv_bfloat16;
};

// swarm::bf16* -> __nv_bfloat16*, float* -> float*, constness kept.
template <typename T>
typename device_type<T>::type* device_cast(T* p) {
  return reinterpret_cast<typename device_type<T>::type*>(p);
}

__device__ __forceinline__ float load_float(const float* p) { return *p; }
__device__ __forceinline__ float load_float(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void store_float(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_float(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

}  // namespace swarm::cuda
