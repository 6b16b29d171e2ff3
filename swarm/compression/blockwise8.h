// blockwise8: the CPU 8-bit blockwise codec (DESIGN.md §5.5 and §10, "8-bit codec").
//
// Values are cut into blocks of 4096 (the last one may be shorter). Each block
// stores its absolute maximum as a float, and each value the index of the code
// nearest to value / absmax in the 256-entry dynamic-exponent codebook
// (codebook8.h). Decoding multiplies the code by the absmax. The CUDA kernels
// (kernels/cuda/quantize.h) run the same per-value functions from codebook8.h,
// so both backends produce the same bytes.
//
// Error per value: at most absmax × (half the largest gap between neighbouring
// codes) = absmax × 0.0105469 (the gap next to -1.0), up to float rounding.
// Special values: an all-zero block stores absmax 0 and the zero code; a block
// holding any NaN or ±inf stores absmax NaN and the zero code everywhere, and
// so decodes to NaN everywhere.
//
//   std::vector<uint8_t> codes(n);
//   std::vector<float> absmax(swarm::compression::blockwise8_num_blocks(n));
//   SWARM_RETURN_IF_ERROR(swarm::compression::quantize_blockwise8(values, codes, absmax));
//   SWARM_RETURN_IF_ERROR(swarm::compression::dequantize_blockwise8(codes, absmax, out));
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "swarm/core/codebook8.h"
#include "swarm/core/status.h"

namespace swarm::compression {

// Encoded size of n values: one byte each plus one float per block. The same
// count as wire's expected_payload_bytes(f32, n, Codec::blockwise8).
constexpr int64_t blockwise8_encoded_bytes(int64_t n) {
  return n <= 0 ? 0 : n + 4 * blockwise8_num_blocks(n);
}

// invalid_argument unless codes.size() == values.size() and
// absmax.size() == blockwise8_num_blocks(values.size()).
Status quantize_blockwise8(std::span<const float> values, std::span<uint8_t> codes, std::span<float> absmax);

// invalid_argument unless values.size() == codes.size() and
// absmax.size() == blockwise8_num_blocks(codes.size()).
Status dequantize_blockwise8(std::span<const uint8_t> codes, std::span<const float> absmax,
                             std::span<float> values);

struct Blockwise8 {
  std::vector<uint8_t> codes;
  std::vector<float> absmax;
};

// Allocating forms, for callers that do not manage buffers.
Blockwise8 quantize_blockwise8(std::span<const float> values);
std::vector<float> dequantize_blockwise8(const Blockwise8& encoded);  // empty if the sizes disagree

}  // namespace swarm::compression
