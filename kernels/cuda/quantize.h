// quantize (CUDA): the 8-bit blockwise codec on the device, byte for byte the
// CPU codec's output (swarm/compression/blockwise8.h).
//
// Design: one thread block of 256 threads per block of 4096 values, so the
// absmax is a block-local max (exact and order-free: the same bits every run)
// and nothing crosses blocks. Each thread keeps its 16 values in registers
// between the absmax reduction and the encoding, so values are read once. The
// per-value math is the SWARM_HOST_DEVICE code of swarm/core/codebook8.h
// that the CPU codec runs; the codebook sits in __constant__ memory and each
// block copies it into shared memory, where the lanes' diverging binary-search
// probes cost bank conflicts instead of constant-cache serialization. Full
// blocks with aligned pointers use 16-byte (float) or 8-byte (bf16) loads.
//
//   SWARM_RETURN_IF_ERROR(swarm::cuda::quantize_blockwise8(codes, absmax, values, n, stream));
//   SWARM_RETURN_IF_ERROR(swarm::cuda::dequantize_blockwise8(values, codes, absmax, n, stream));
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "swarm/core/dtype.h"
#include "swarm/core/status.h"

namespace swarm::cuda {

// All pointers are device pointers: n codes, ceil(n / 4096) absmax entries
// (swarm::compression::blockwise8_num_blocks), n values. invalid_argument for
// n < 0 or a null pointer when n > 0; n == 0 launches nothing.
Status quantize_blockwise8(uint8_t* codes, float* absmax, const float* values, int64_t n, cudaStream_t stream);
Status quantize_blockwise8(uint8_t* codes, float* absmax, const bf16* values, int64_t n, cudaStream_t stream);

// bf16 output is the float result rounded to nearest even.
Status dequantize_blockwise8(float* values, const uint8_t* codes, const float* absmax, int64_t n,
                             cudaStream_t stream);
Status dequantize_blockwise8(bf16* values, const uint8_t* codes, const float* absmax, int64_t n,
                             cudaStream_t stream);

}  // namespace swarm::cuda
