#include "swarm/compression/blockwise8.h"

#include <algorithm>

namespace swarm::compression {
namespace {

Status check_sizes(const char* what, std::size_t values, std::size_t codes, std::size_t absmax) {
  const auto blocks = static_cast<std::size_t>(blockwise8_num_blocks(static_cast<int64_t>(codes)));
  if (values != codes || absmax != blocks) {
    return invalid_argument("{}: {} values, {} codes and {} absmax entries; want equal values and codes and {} "
                            "absmax entries (one per {} values)",
                            what, values, codes, absmax, blocks, kBlockwise8BlockSize);
  }
  return Status::ok();
}

}  // namespace

Status quantize_blockwise8(std::span<const float> values, std::span<uint8_t> codes, std::span<float> absmax) {
  SWARM_RETURN_IF_ERROR(check_sizes("quantize_blockwise8", values.size(), codes.size(), absmax.size()));
  const std::size_t block = static_cast<std::size_t>(kBlockwise8BlockSize);
  for (std::size_t b = 0; b < absmax.size(); ++b) {
    const std::size_t begin = b * block;
    const std::size_t end = std::min(values.size(), begin + block);
    AbsmaxAccumulator accumulator;
    for (std::size_t i = begin; i < end; ++i) accumulator.add(values[i]);
    const float scale = accumulator.result();
    absmax[b] = scale;
    for (std::size_t i = begin; i < end; ++i) codes[i] = quantize_value8(kCodebook8, values[i], scale);
  }
  return Status::ok();
}

Status dequantize_blockwise8(std::span<const uint8_t> codes, std::span<const float> absmax,
                             std::span<float> values) {
  SWARM_RETURN_IF_ERROR(check_sizes("dequantize_blockwise8", values.size(), codes.size(), absmax.size()));
  const std::size_t block = static_cast<std::size_t>(kBlockwise8BlockSize);
  for (std::size_t i = 0; i < codes.size(); ++i) {
    values[i] = dequantize_value8(kCodebook8, codes[i], absmax[i / block]);
  }
  return Status::ok();
}

Blockwise8 quantize_blockwise8(std::span<const float> values) {
  Blockwise8 encoded;
  encoded.codes.resize(values.size());
  encoded.absmax.resize(static_cast<std::size_t>(blockwise8_num_blocks(static_cast<int64_t>(values.size()))));
  // Sizes match by construction, so this cannot fail.
  Status status = quantize_blockwise8(values, encoded.codes, encoded.absmax);
  (void)status;
  return encoded;
}

std::vector<float> dequantize_blockwise8(const Blockwise8& encoded) {
  std::vector<float> values(encoded.codes.size());
  if (!dequantize_blockwise8(encoded.codes, encoded.absmax, values).is_ok()) return {};
  return values;
}

}  // namespace swarm::compression
