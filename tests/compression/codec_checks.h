// codec_checks: what the codec tests share: encode and decode that must
// succeed, the element-by-element check against a codec's declared bound, and
// random inputs.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "swarm/api/codec.h"

namespace swarm::compression::testing {

template <Codec C>
std::vector<std::byte> encode_ok(std::span<const float> values) {
  auto bytes = C::encoded_bytes(values.size());
  REQUIRE(bytes.is_ok());
  std::vector<std::byte> frame(*bytes);
  const Status status = C::encode(values, frame);
  INFO(status.to_string());
  REQUIRE(status.is_ok());
  return frame;
}

template <Codec C>
std::vector<float> decode_ok(std::span<const std::byte> frame, std::size_t n) {
  std::vector<float> values(n, -12345.0f);
  const Status status = C::decode(frame, values);
  INFO(status.to_string());
  REQUIRE(status.is_ok());
  return values;
}

template <Codec C>
Status encode_status(std::span<const float> values) {
  std::vector<std::byte> frame(*C::encoded_bytes(values.size()));
  return C::encode(values, frame);
}

// The values that share one absmax: the codec's block, or (codecs without
// blocks ignore the absmax) 4096.
template <Codec C>
constexpr std::size_t block_of() {
  if constexpr (requires { C::kBlockSize; }) {
    return static_cast<std::size_t>(C::kBlockSize);
  } else {
    return 4096;
  }
}

// Encodes and decodes `values` and checks every element against the codec's
// declared bound, given its block's absmax. Returns the decoded values.
template <Codec C>
std::vector<float> check_bound(const std::vector<float>& values) {
  const std::vector<std::byte> frame = encode_ok<C>(values);
  const std::vector<float> decoded = decode_ok<C>(frame, values.size());
  std::size_t failures = 0;
  std::size_t first = 0;
  double first_error = 0, first_bound = 0;
  constexpr std::size_t block = block_of<C>();
  for (std::size_t begin = 0; begin < values.size(); begin += block) {
    const std::size_t end = std::min(values.size(), begin + block);
    float absmax = 0;
    for (std::size_t i = begin; i < end; ++i) absmax = std::max(absmax, std::fabs(values[i]));
    for (std::size_t i = begin; i < end; ++i) {
      const double error = std::fabs(double(decoded[i]) - double(values[i]));  // exact in double
      const double bound = C::max_abs_error(absmax, values[i]);
      if (!std::isfinite(decoded[i]) || !(error <= bound)) {
        if (failures++ == 0) {
          first = i;
          first_error = error;
          first_bound = bound;
        }
      }
    }
  }
  if (failures != 0) {
    FAIL_CHECK(codec_name(C::id) << ": " << failures << " values beyond the bound; first at " << first << ": value "
                                 << values[first] << " decoded " << decoded[first] << " error " << first_error
                                 << " bound " << first_bound);
  }
  return decoded;
}

std::vector<float> random_normal(std::size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng) * scale;
  return v;
}

}  // namespace swarm::compression::testing
