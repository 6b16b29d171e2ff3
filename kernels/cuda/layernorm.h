// layernorm (CUDA): forward and backward over the last axis, f32, with the CPU
// backend's contract (kernels/cpu/ops.h): forward saves mean and rstd per row;
// backward ADDS into dinp, dweight and dbias.
//
// Design: one warp per row. Each lane takes a strided share of the row and keeps
// Welford statistics (kernels/common/row_stats.h); lanes merge in a fixed butterfly,
// so results do not depend on scheduling. dweight and dbias are column sums: one
// thread per column walks the rows in order, so they are deterministic too.
//
//   SWARM_RETURN_IF_ERROR(swarm::cuda::layernorm_forward(y, mean, rstd, x, w, b, N, C, stream));
#pragma once

#include <cuda_runtime_api.h>

#include "swarm/core/status.h"

namespace swarm::cuda {

// All pointers are device pointers. invalid_argument for N < 0, C < 1 or a null pointer.
Status layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                         const float* bias, int N, int C, cudaStream_t stream);

Status layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, const float* mean, const float* rstd, int N, int C,
                          cudaStream_t stream);

}  // namespace swarm::cuda
