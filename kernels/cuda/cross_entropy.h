// cross_entropy (CUDA): fused softmax cross-entropy over rows of logits, forward and
// backward in one kernel, with the CPU backend's contract (kernels/cpu/ops.h).
//
// Design: one block per row. A single pass reads the row once, each thread keeping
// an online (max, sum of exp) pair (kernels/common/online_softmax.h) over a strided
// share; the pairs merge in a fixed tree (warp butterfly, then warp 0 over the
// warps), so every run gives the same bits. A second pass writes dlogits; the row
// is usually still in L2. Loads are 16 bytes wide from the first aligned element of
// the row, so rows of odd length (V = 50257) vectorize too.
//
//   SWARM_RETURN_IF_ERROR(swarm::cuda::cross_entropy_forward_backward(losses, dlogits, logits, targets,
//                                                                     N, V, 1.0f / N, stream));
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "swarm/core/dtype.h"
#include "swarm/core/status.h"

namespace swarm::cuda {

// All pointers are device pointers: losses [N] (float), logits and dlogits [N, V],
// targets [N]. losses[i] = -log softmax(logits_i)[targets[i]]. dlogits, if not
// null, is OVERWRITTEN (not added to) with (softmax - onehot(target)) * dloss_scale;
// it may be the same buffer as logits (computed in place).
//
// A target outside [0, V) gives a NaN loss and, if dlogits is not null, a zero
// dlogits row; nothing is read out of bounds. Callers validate targets first.
//
// invalid_argument for N < 0, V < 1, or a null losses/logits/targets when N > 0.
Status cross_entropy_forward_backward(float* losses, float* dlogits, const float* logits, const int32_t* targets,
                                      int N, int V, float dloss_scale, cudaStream_t stream);
Status cross_entropy_forward_backward(float* losses, swarm::bf16* dlogits, const swarm::bf16* logits,
                                      const int32_t* targets, int N, int V, float dloss_scale, cudaStream_t stream);

}  // namespace swarm::cuda
