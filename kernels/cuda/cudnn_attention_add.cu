// cudnn_attention_add: dst += src over bf16 arrays, the one kernel cudnn_attention
// needs of its own: cuDNN overwrites its gradient outputs, the attention contract
// adds into them. Each element is one float add rounded once, so the result does
// not depend on the launch shape.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/element_types.cuh"

namespace swarm::cuda::cudnn_attention_detail {
namespace {

__global__ void add_into_kernel(__nv_bfloat16* dst, const __nv_bfloat16* src, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    store_float(dst + i, load_float(dst + i) + load_float(src + i));
  }
}

}  // namespace

// Declared where it is used, in cudnn_attention.cc.
Status add_into(bf16* dst, const bf16* src, int64_t n, cudaStream_t stream) {
  if (n <= 0) return Status::ok();
  if (dst == nullptr || src == nullptr) return invalid_argument("cudnn_attention add_into: null pointer");
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t{1} << 16);
  add_into_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(device_cast(dst), device_cast(src), n);
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::ok();
}

}  // namespace swarm::cuda::cudnn_attention_detail
