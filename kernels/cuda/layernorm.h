// layernorm (CUDA): forward and backward over the last axis, for float and bf16
// values, with the CPU backend's contract (kernels/cpu/ops.h): forward saves
// float mean and rstd per row; backward ADDS into dinp, and into the float
// dweight and dbias. Plus the fused residual + layernorm forward, which pays
// because the sum is read back from registers instead of from memory.
//
// Design: one warp per row. Each lane takes a strided share of the row and keeps
// Welford statistics (kernels/common/row_stats.h); lanes merge in a fixed
// butterfly, so results do not depend on scheduling. dweight and dbias are column
// sums over N rows: blocks sum fixed chunks of rows in order, then one pass adds
// the chunk partials in chunk order. The chunking depends only on N, never on the
// device, so the bits are the same on every GPU and every run.
//
//   SWARM_RETURN_IF_ERROR(swarm::cuda::layernorm_forward(y, mean, rstd, x, w, b, N, C, stream));
#pragma once

#include <cuda_runtime_api.h>

#include "swarm/core/dtype.h"
#include "swarm/core/status.h"

namespace swarm::cuda {

// All pointers are device pointers. invalid_argument for N < 0, C < 1 or a null pointer.
Status layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                         const float* bias, int N, int C, cudaStream_t stream);
Status layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* weight,
                         const bf16* bias, int N, int C, cudaStream_t stream);

// residual = a + b (rounded to the value type), out = layernorm(residual).
Status residual_layernorm_forward(float* residual, float* out, float* mean, float* rstd, const float* a,
                                  const float* b, const float* weight, const float* bias, int N, int C,
                                  cudaStream_t stream);
Status residual_layernorm_forward(bf16* residual, bf16* out, float* mean, float* rstd, const bf16* a,
                                  const bf16* b, const bf16* weight, const bf16* bias, int N, int C,
                                  cudaStream_t stream);

// Column sums use scratch device memory taken from the stream-ordered pool.
Status layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, const float* mean, const float* rstd, int N, int C,
                          cudaStream_t stream);
Status layernorm_backward(bf16* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp,
                          const bf16* weight, const float* mean, const float* rstd, int N, int C,
                          cudaStream_t stream);

}  // namespace swarm::cuda
