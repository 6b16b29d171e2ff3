// See quantize.h for the design.
#include <climits>
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/element_types.cuh"
#include "kernels/cuda/quantize.h"
#include "swarm/core/codebook8.h"

namespace swarm::cuda {
namespace {

using compression::AbsmaxAccumulator;
using compression::kBlockwise8BlockSize;
using compression::kCodebook8Size;

constexpr int kThreads = 256;
constexpr int kWarp = 32;
constexpr int kWarps = kThreads / kWarp;
constexpr int kValuesPerThread = static_cast<int>(kBlockwise8BlockSize) / kThreads;  // 16
constexpr int kVectorWidth = 4;                                                       // values per vector access
constexpr int kVectorSteps = kValuesPerThread / kVectorWidth;                         // 4
static_assert(kThreads == kCodebook8Size, "each thread copies one codebook entry into shared memory");
static_assert(kThreads * kValuesPerThread == kBlockwise8BlockSize);
static_assert(kVectorSteps * kVectorWidth == kValuesPerThread);

__constant__ float c_codebook[kCodebook8Size] = SWARM_CODEBOOK8_INITIALIZER;

// Four consecutive values at p, which is 16-byte (float) or 8-byte (bf16) aligned.
__device__ __forceinline__ void load4(const float* p, float out[4]) {
  const float4 q = *reinterpret_cast<const float4*>(p);
  out[0] = q.x;
  out[1] = q.y;
  out[2] = q.z;
  out[3] = q.w;
}
__device__ __forceinline__ void load4(const __nv_bfloat16* p, float out[4]) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);  // little endian: element 0 in the low half
  out[0] = __uint_as_float(raw.x << 16);
  out[1] = __uint_as_float(raw.x & 0xffff0000u);
  out[2] = __uint_as_float(raw.y << 16);
  out[3] = __uint_as_float(raw.y & 0xffff0000u);
}
__device__ __forceinline__ void store4(float* p, const float in[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(in[0], in[1], in[2], in[3]);
}
__device__ __forceinline__ void store4(__nv_bfloat16* p, const float in[4]) {
  uint32_t bits[4];
  for (int e = 0; e < 4; ++e) bits[e] = __bfloat16_as_ushort(__float2bfloat16_rn(in[e]));
  *reinterpret_cast<uint2*>(p) = make_uint2(bits[0] | (bits[1] << 16), bits[2] | (bits[3] << 16));
}

// Thread t owns, in the vector layout, values [k*1024 + 4t, k*1024 + 4t + 4) for k = 0..3
// (a warp touches 512 contiguous bytes of floats per step); in the scalar layout, values
// k*256 + t for k = 0..15. Both layouts cover the block once; each kernel uses one
// layout for loads and stores alike.
__device__ __forceinline__ int vector_offset(int step, int lane_in_block, int e) {
  return step * (kThreads * kVectorWidth) + lane_in_block * kVectorWidth + e;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    quantize_kernel(uint8_t* __restrict__ codes, float* __restrict__ absmax, const T* __restrict__ values,
                    int64_t n, bool vectorized) {
  __shared__ float table[kCodebook8Size];
  __shared__ float warp_max[kWarps];
  __shared__ int warp_nonfinite[kWarps];

  const int tid = threadIdx.x;
  table[tid] = c_codebook[tid];

  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kBlockwise8BlockSize;
  const int64_t remaining = n - begin;
  const int count = remaining < kBlockwise8BlockSize ? static_cast<int>(remaining)
                                                     : static_cast<int>(kBlockwise8BlockSize);
  const bool use_vectors = vectorized && count == kBlockwise8BlockSize;
  const T* block_values = values + begin;

  float v[kValuesPerThread];
  if (use_vectors) {
#pragma unroll
    for (int k = 0; k < kVectorSteps; ++k) load4(block_values + vector_offset(k, tid, 0), v + k * kVectorWidth);
  } else {
#pragma unroll
    for (int k = 0; k < kValuesPerThread; ++k) {
      const int i = k * kThreads + tid;
      v[k] = i < count ? load_float(block_values + i) : 0.0f;  // a padding 0 leaves the absmax as it is
    }
  }

  AbsmaxAccumulator local;
#pragma unroll
  for (int k = 0; k < kValuesPerThread; ++k) local.add(v[k]);
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    AbsmaxAccumulator other;
    other.max = __shfl_xor_sync(0xffffffffu, local.max, offset);
    other.nonfinite = __shfl_xor_sync(0xffffffffu, static_cast<int>(local.nonfinite), offset) != 0;
    local.merge(other);
  }
  if (tid % kWarp == 0) {
    warp_max[tid / kWarp] = local.max;
    warp_nonfinite[tid / kWarp] = local.nonfinite ? 1 : 0;
  }
  __syncthreads();  // publishes warp results and the shared codebook

  AbsmaxAccumulator block;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    AbsmaxAccumulator other;
    other.max = warp_max[w];
    other.nonfinite = warp_nonfinite[w] != 0;
    block.merge(other);
  }
  const float scale = block.result();
  if (tid == 0) absmax[blockIdx.x] = scale;

  uint8_t* block_codes = codes + begin;
  if (use_vectors) {
#pragma unroll
    for (int k = 0; k < kVectorSteps; ++k) {
      uint32_t packed = 0;
#pragma unroll
      for (int e = 0; e < kVectorWidth; ++e) {
        packed |= static_cast<uint32_t>(compression::quantize_value8(table, v[k * kVectorWidth + e], scale)) << (8 * e);
      }
      *reinterpret_cast<uint32_t*>(block_codes + vector_offset(k, tid, 0)) = packed;
    }
  } else {
#pragma unroll
    for (int k = 0; k < kValuesPerThread; ++k) {
      const int i = k * kThreads + tid;
      if (i < count) block_codes[i] = compression::quantize_value8(table, v[k], scale);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    dequantize_kernel(T* __restrict__ values, const uint8_t* __restrict__ codes, const float* __restrict__ absmax,
                      int64_t n, bool vectorized) {
  __shared__ float table[kCodebook8Size];
  const int tid = threadIdx.x;
  table[tid] = c_codebook[tid];
  __syncthreads();

  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kBlockwise8BlockSize;
  const int64_t remaining = n - begin;
  const int count = remaining < kBlockwise8BlockSize ? static_cast<int>(remaining)
                                                     : static_cast<int>(kBlockwise8BlockSize);
  const float scale = absmax[blockIdx.x];
  const uint8_t* block_codes = codes + begin;
  T* block_values = values + begin;

  if (vectorized && count == kBlockwise8BlockSize) {
#pragma unroll
    for (int k = 0; k < kVectorSteps; ++k) {
      const uint32_t packed = *reinterpret_cast<const uint32_t*>(block_codes + vector_offset(k, tid, 0));
      float out[kVectorWidth];
#pragma unroll
      for (int e = 0; e < kVectorWidth; ++e) {
        out[e] = compression::dequantize_value8(table, static_cast<uint8_t>(packed >> (8 * e)), scale);
      }
      store4(block_values + vector_offset(k, tid, 0), out);
    }
  } else {
#pragma unroll
    for (int k = 0; k < kValuesPerThread; ++k) {
      const int i = k * kThreads + tid;
      if (i < count) store_float(block_values + i, compression::dequantize_value8(table, block_codes[i], scale));
    }
  }
}

bool aligned(const void* p, std::size_t alignment) { return reinterpret_cast<std::uintptr_t>(p) % alignment == 0; }

Status check_arguments(const char* what, int64_t n, const void* a, const void* b, const void* c) {
  if (n < 0) return invalid_argument("{}: n must be >= 0, got {}", what, n);
  if (n > 0 && (a == nullptr || b == nullptr || c == nullptr)) return invalid_argument("{}: a null device pointer", what);
  if (compression::blockwise8_num_blocks(n) > INT_MAX) {
    return unimplemented("{}: {} values need more than 2^31-1 blocks of {}", what, n, kBlockwise8BlockSize);
  }
  return Status::ok();
}

template <typename T>
Status launch_quantize(uint8_t* codes, float* absmax, const T* values, int64_t n, cudaStream_t stream) {
  SWARM_RETURN_IF_ERROR(check_arguments("quantize_blockwise8", n, codes, absmax, values));
  if (n == 0) return Status::ok();
  const auto blocks = static_cast<unsigned>(compression::blockwise8_num_blocks(n));
  const bool vectorized = aligned(values, kVectorWidth * sizeof(T)) && aligned(codes, kVectorWidth);
  quantize_kernel<<<blocks, kThreads, 0, stream>>>(codes, absmax, device_cast(values), n, vectorized);
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::ok();
}

template <typename T>
Status launch_dequantize(T* values, const uint8_t* codes, const float* absmax, int64_t n, cudaStream_t stream) {
  SWARM_RETURN_IF_ERROR(check_arguments("dequantize_blockwise8", n, values, codes, absmax));
  if (n == 0) return Status::ok();
  const auto blocks = static_cast<unsigned>(compression::blockwise8_num_blocks(n));
  const bool vectorized = aligned(values, kVectorWidth * sizeof(T)) && aligned(codes, kVectorWidth);
  dequantize_kernel<<<blocks, kThreads, 0, stream>>>(device_cast(values), codes, absmax, n, vectorized);
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::ok();
}

}  // namespace

Status quantize_blockwise8(uint8_t* codes, float* absmax, const float* values, int64_t n, cudaStream_t stream) {
  return launch_quantize(codes, absmax, values, n, stream);
}
Status quantize_blockwise8(uint8_t* codes, float* absmax, const bf16* values, int64_t n, cudaStream_t stream) {
  return launch_quantize(codes, absmax, values, n, stream);
}
Status dequantize_blockwise8(float* values, const uint8_t* codes, const float* absmax, int64_t n,
                             cudaStream_t stream) {
  return launch_dequantize(values, codes, absmax, n, stream);
}
Status dequantize_blockwise8(bf16* values, const uint8_t* codes, const float* absmax, int64_t n,
                             cudaStream_t stream) {
  return launch_dequantize(values, codes, absmax, n, stream);
}

}  // namespace swarm::cuda
