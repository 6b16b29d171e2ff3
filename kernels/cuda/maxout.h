// maxout (CUDA): the compression of a boundary layer, float and bf16, with the
// CPU backend's contract (kernels/cpu/ops.h): out[n, j] = max over g < k of
// inp[n, g * C/k + j]; backward ADDS dout[n, j] into dinp at the first g
// reaching the maximum (a NaN counts as the maximum), recomputed from inp.
//
// Design: llm.c style, one thread per output element (n, j). The thread reads
// the k strided inputs of its column (adjacent threads read adjacent addresses,
// so loads coalesce), and in backward writes the one input element it owns:
// each input feeds exactly one output, so there are no atomics and no races,
// and the bits are the same on every launch shape. Comparisons are in float
// (bf16 widens exactly); forward copies the winning value unrounded, backward
// rounds the sum once.
//
//   SWARM_RETURN_IF_ERROR(swarm::cuda::maxout_forward(wire, ln, N, C, k, stream));
#pragma once

#include <cuda_runtime_api.h>

#include "swarm/core/dtype.h"
#include "swarm/core/status.h"

namespace swarm::cuda {

// All pointers are device pointers. invalid_argument for N < 0, C < 1, k < 1,
// C % k != 0 or a null pointer when N > 0; N == 0 does nothing.
Status maxout_forward(float* out, const float* inp, int N, int C, int k, cudaStream_t stream);
Status maxout_forward(bf16* out, const bf16* inp, int N, int C, int k, cudaStream_t stream);

Status maxout_backward(float* dinp, const float* dout, const float* inp, int N, int C, int k, cudaStream_t stream);
Status maxout_backward(bf16* dinp, const bf16* dout, const bf16* inp, int N, int C, int k, cudaStream_t stream);

}  // namespace swarm::cuda
