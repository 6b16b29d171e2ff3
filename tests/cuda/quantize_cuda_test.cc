// CUDA 8-bit blockwise codec against the CPU codec (swarm/compression). The
// tolerance is zero: both run the same per-value code (codebook8.h) with IEEE
// division and multiplication, so codes and absmax must be bitwise equal, and
// so must the dequantized values (bf16 output: the CPU float rounded to bf16).
// NaN blocks are compared as "both NaN", since NaN payload bits may differ.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <doctest/doctest.h>

#include "kernels/cuda/quantize.h"
#include "swarm/compression/blockwise8.h"
#include "tests/cuda/cuda_test_util.h"

namespace swarm::cuda {
namespace {

using compression::kBlockwise8BlockSize;
using testing::DeviceArray;

bool same_float(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

int count_float_mismatches(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return -1;
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) bad += !same_float(got[i], want[i]);
  return bad;
}

// Normal values whose scale changes per block, with the special cases planted:
// an all-zero block, a NaN block, an inf block, -0s, and exact code midpoints
// (ties of the nearest-code rule) in a block whose absmax is 1.
std::vector<float> codec_input(std::size_t n, uint32_t seed) {
  auto v = testing::random_vector(n, seed);
  const std::size_t blocks = (n + kBlockwise8BlockSize - 1) / kBlockwise8BlockSize;
  for (std::size_t b = 0; b < blocks; ++b) {
    const float scale = std::pow(10.0f, static_cast<float>(static_cast<int>(b % 9) - 4));  // 1e-4 .. 1e4
    for (std::size_t i = b * kBlockwise8BlockSize; i < std::min(n, (b + 1) * kBlockwise8BlockSize); ++i) v[i] *= scale;
  }
  if (n > 3 * kBlockwise8BlockSize) {
    std::fill(v.begin(), v.begin() + kBlockwise8BlockSize, 0.0f);  // block 0: all zero
    v[5] = -0.0f;
    v[kBlockwise8BlockSize + 7] = std::numeric_limits<float>::quiet_NaN();  // block 1
    v[2 * kBlockwise8BlockSize + 9] = -INFINITY;                            // block 2
    // Block 3: absmax 1 and every midpoint between neighbouring codes.
    const std::size_t base = 3 * kBlockwise8BlockSize;
    v[base] = 1.0f;
    for (int i = 0; i + 1 < compression::kCodebook8Size && base + 1 + i < n; ++i) {
      const float a = compression::kCodebook8[i], b = compression::kCodebook8[i + 1];
      v[base + 1 + i] = a + (b - a) / 2.0f;
    }
  }
  return v;
}

template <typename T>
void check_against_cpu(std::size_t n, std::size_t offset, uint32_t seed) {
  INFO("n=" << n << " offset=" << offset << (sizeof(T) == 2 ? " bf16" : " f32"));
  const std::vector<float> input = codec_input(n, seed);
  std::vector<T> device_input(offset + n);
  std::vector<float> cpu_input = input;
  if constexpr (sizeof(T) == 2) {
    cpu_input = testing::round_through_bf16(input);
    const auto rounded = testing::to_bf16(input);
    std::copy(rounded.begin(), rounded.end(), device_input.begin() + offset);
  } else {
    std::copy(input.begin(), input.end(), device_input.begin() + offset);
  }
  const compression::Blockwise8 want = compression::quantize_blockwise8(cpu_input);
  const std::vector<float> want_values = compression::dequantize_blockwise8(want);

  const std::size_t blocks = want.absmax.size();
  DeviceArray<T> d_values(device_input);
  DeviceArray<uint8_t> d_codes(offset + n, uint8_t{0xAB});
  DeviceArray<float> d_absmax(blocks + 1, -7.0f);  // one spare entry that must stay untouched
  REQUIRE(quantize_blockwise8(d_codes.get() + offset, d_absmax.get(), d_values.get() + offset,
                              static_cast<int64_t>(n), nullptr)
              .is_ok());
  const auto codes = d_codes.to_host();
  const auto absmax = d_absmax.to_host();
  int code_mismatches = 0;
  for (std::size_t i = 0; i < offset; ++i) code_mismatches += codes[i] != 0xAB;  // nothing written before
  for (std::size_t i = 0; i < n; ++i) code_mismatches += codes[offset + i] != want.codes[i];
  CHECK(code_mismatches == 0);
  int absmax_mismatches = 0;
  for (std::size_t b = 0; b < blocks; ++b) absmax_mismatches += !same_float(absmax[b], want.absmax[b]);
  CHECK(absmax_mismatches == 0);
  CHECK(absmax[blocks] == -7.0f);

  // Determinism: the same input again gives the same bytes.
  DeviceArray<uint8_t> again_codes(offset + n, uint8_t{0xAB});
  DeviceArray<float> again_absmax(blocks + 1, -7.0f);
  REQUIRE(quantize_blockwise8(again_codes.get() + offset, again_absmax.get(), d_values.get() + offset,
                              static_cast<int64_t>(n), nullptr)
              .is_ok());
  CHECK(again_codes.to_host() == codes);
  CHECK(count_float_mismatches(again_absmax.to_host(), absmax) == 0);

  // Dequantize the CPU's encoding on the device.
  std::vector<uint8_t> cpu_codes(offset + n, 0);
  std::copy(want.codes.begin(), want.codes.end(), cpu_codes.begin() + offset);
  DeviceArray<uint8_t> d_cpu_codes(cpu_codes);
  DeviceArray<float> d_cpu_absmax(want.absmax);
  DeviceArray<T> d_out(offset + n);
  REQUIRE(dequantize_blockwise8(d_out.get() + offset, d_cpu_codes.get() + offset, d_cpu_absmax.get(),
                                static_cast<int64_t>(n), nullptr)
              .is_ok());
  const auto out = d_out.to_host();
  int value_mismatches = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if constexpr (sizeof(T) == 2) {
      const bf16 want_bf16 = bf16::from_float(want_values[i]);
      const bool both_nan = std::isnan(out[offset + i].to_float()) && std::isnan(want_values[i]);
      value_mismatches += !(both_nan || out[offset + i] == want_bf16);
    } else {
      value_mismatches += !same_float(out[offset + i], want_values[i]);
    }
  }
  CHECK(value_mismatches == 0);
}

TEST_CASE("CUDA blockwise8 quantize and dequantize equal the CPU codec bit for bit") {
  if (testing::skip_without_device()) return;
  const std::size_t sizes[] = {1, 4095, 4096, 4097, 4 * 4096 + 5, 64 * 4096, (1 << 20) + 123};
  uint32_t seed = 1;
  for (std::size_t n : sizes) {
    // offset 0: aligned, full blocks take the vector path; offset 1: every access is scalar.
    for (std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
      check_against_cpu<float>(n, offset, seed++);
      check_against_cpu<bf16>(n, offset, seed++);
    }
  }
}

TEST_CASE("CUDA blockwise8 refuses bad arguments with a status, before touching the device") {
  // No device needed: the argument check comes first.
  uint8_t* codes = nullptr;
  float* absmax = nullptr;
  const float* values = nullptr;
  CHECK(quantize_blockwise8(codes, absmax, values, -1, nullptr).code() == StatusCode::invalid_argument);
  CHECK(quantize_blockwise8(codes, absmax, values, 10, nullptr).code() == StatusCode::invalid_argument);
  CHECK(quantize_blockwise8(codes, absmax, static_cast<const bf16*>(nullptr), 10, nullptr).code() ==
        StatusCode::invalid_argument);
  CHECK(dequantize_blockwise8(static_cast<float*>(nullptr), codes, absmax, 10, nullptr).code() ==
        StatusCode::invalid_argument);
  CHECK(dequantize_blockwise8(static_cast<bf16*>(nullptr), codes, absmax, -3, nullptr).code() ==
        StatusCode::invalid_argument);
  CHECK(quantize_blockwise8(codes, absmax, values, 0, nullptr).is_ok());  // empty: nothing to launch
  CHECK(dequantize_blockwise8(static_cast<float*>(nullptr), codes, absmax, 0, nullptr).is_ok());
  // More blocks than a grid holds: refused as unimplemented, not launched.
  auto* fake = reinterpret_cast<uint8_t*>(uintptr_t{256});
  CHECK(quantize_blockwise8(fake, reinterpret_cast<float*>(fake), reinterpret_cast<const float*>(fake),
                            int64_t{1} << 44, nullptr)
            .code() == StatusCode::unimplemented);
}

}  // namespace
}  // namespace swarm::cuda
