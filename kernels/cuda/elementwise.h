// elementwise (CUDA): GELU, residual add, accumulate, zero fill and f32 <-> bf16
// conversion, with the CPU backend's contract (kernels/cpu/ops.h): gelu_backward
// ADDS into dinp.
//
// Design: memory-bound, so one grid-stride kernel moves 16 bytes per load where
// every pointer is 16-byte aligned (4 floats or 8 bf16s), finishing with a scalar
// tail; unaligned pointers take the scalar path throughout. Math is in float
// (GELU from kernels/common/gelu.h, shared with the CPU tests); bf16 results round
// to nearest even. Outputs may alias inputs element for element (e.g. out == a).
//
//   SWARM_RETURN_IF_ERROR(swarm::cuda::gelu_forward(h, pre, n, stream));
//   SWARM_RETURN_IF_ERROR(swarm::cuda::convert(h_bf16, h_f32, n, stream));
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "swarm/core/dtype.h"
#include "swarm/core/status.h"

namespace swarm::cuda {

// All pointers are device pointers; n counts elements. invalid_argument for n < 0
// or a null pointer when n > 0; n == 0 does nothing.

Status gelu_forward(float* out, const float* inp, int64_t n, cudaStream_t stream);
Status gelu_forward(swarm::bf16* out, const swarm::bf16* inp, int64_t n, cudaStream_t stream);

// dinp += gelu'(inp) * dout
Status gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n, cudaStream_t stream);
Status gelu_backward(swarm::bf16* dinp, const swarm::bf16* inp, const swarm::bf16* dout, int64_t n,
                     cudaStream_t stream);

// out = a + b
Status residual_forward(float* out, const float* a, const float* b, int64_t n, cudaStream_t stream);
Status residual_forward(swarm::bf16* out, const swarm::bf16* a, const swarm::bf16* b, int64_t n,
                        cudaStream_t stream);

// dst += src
Status accumulate(float* dst, const float* src, int64_t n, cudaStream_t stream);
Status accumulate(swarm::bf16* dst, const swarm::bf16* src, int64_t n, cudaStream_t stream);

Status fill_zero(float* dst, int64_t n, cudaStream_t stream);
Status fill_zero(swarm::bf16* dst, int64_t n, cudaStream_t stream);

// Round to nearest even: the same bits as swarm::bf16::from_float, NaNs included
// (sign and payload kept, quiet bit set).
Status convert(swarm::bf16* dst, const float* src, int64_t n, cudaStream_t stream);
// Exact.
Status convert(float* dst, const swarm::bf16* src, int64_t n, cudaStream_t stream);

}  // namespace swarm::cuda
