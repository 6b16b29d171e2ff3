// The 8-bit blockwise codec on the CPU: the codebook against the recipe in
// DESIGN.md §10, the binary-search lookup against a brute-force nearest search,
// the round-trip error bound, and the edge cases (empty, all-zero, one value,
// short last block, NaN and infinities, size errors).
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "swarm/compression/blockwise8.h"
#include "swarm/core/codebook8.h"

namespace swarm::compression {
namespace {

// The nearest code by scanning all 256; ties go to the first (lowest) index.
uint8_t brute_force_nearest(float x) {
  int best = 0;
  float best_distance = std::fabs(x - kCodebook8[0]);
  for (int i = 1; i < kCodebook8Size; ++i) {
    const float distance = std::fabs(x - kCodebook8[i]);
    if (distance < best_distance) {
      best_distance = distance;
      best = i;
    }
  }
  return static_cast<uint8_t>(best);
}

float largest_half_gap() {
  float gap = 0.0f;
  for (int i = 1; i < kCodebook8Size; ++i) gap = std::max(gap, kCodebook8[i] - kCodebook8[i - 1]);
  return gap / 2.0f;
}

std::vector<float> random_normal(std::size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

TEST_CASE("codebook8: 256 sorted distinct codes in [-1, 1], built by the dynamic-exponent recipe") {
  // Rebuild: 2^i midpoints of an even split of [0.1, 1] into 2^i + 1 points, times 10^(i-6).
  const double scales[7] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
  std::vector<float> magnitudes;
  for (int i = 0; i <= 6; ++i) {
    for (int k = 0; k < (1 << i); ++k) {
      magnitudes.push_back(static_cast<float>((0.1 + (2.0 * k + 1.0) * 0.9 / (2.0 * (1 << i))) * scales[i]));
    }
  }
  REQUIRE(magnitudes.size() == 127);
  std::vector<float> want;
  for (float m : magnitudes) want.push_back(-m);
  want.push_back(0.0f);
  for (float m : magnitudes) want.push_back(m);
  want.push_back(1.0f);
  std::sort(want.begin(), want.end());
  REQUIRE(want.size() == 256);
  CHECK(want[0] == doctest::Approx(-0.99296875).epsilon(1e-7).scale(0));  // -(1 - 0.9/128), replaced by -1
  want[0] = -1.0f;
  for (int i = 0; i < kCodebook8Size; ++i) {
    INFO("code " << i);
    CHECK(std::bit_cast<uint32_t>(kCodebook8[i]) == std::bit_cast<uint32_t>(want[i]));
  }

  for (int i = 1; i < kCodebook8Size; ++i) CHECK(kCodebook8[i - 1] < kCodebook8[i]);
  CHECK(kCodebook8[0] == -1.0f);
  CHECK(kCodebook8[kZeroCode8] == 0.0f);
  CHECK(std::bit_cast<uint32_t>(kCodebook8[kZeroCode8]) == 0u);  // +0, so 0 · absmax is +0
  CHECK(kCodebook8[255] == 1.0f);
  for (int j = 1; j <= 126; ++j) CHECK(kCodebook8[kZeroCode8 + j] == -kCodebook8[kZeroCode8 - j]);
  // The largest gap is the one next to -1.0: 1 - 0.978906... = 0.0210937.
  CHECK(largest_half_gap() == doctest::Approx(0.0105469).epsilon(1e-4).scale(0));
}

TEST_CASE("nearest_code8 equals a brute-force search, and ties go to the lower index") {
  // The codec only looks up |x| <= 1 (v / absmax); a little beyond is checked too.
  // Far beyond, float distances saturate and a scan ties everywhere; see below.
  std::vector<float> xs = {0.0f, -0.0f, 1.0f, -1.0f, 1.5f, -1.5f, 2.0f, -7.0f, FLT_MIN, -FLT_MIN, std::numeric_limits<float>::denorm_min(),
                           -std::numeric_limits<float>::denorm_min()};
  int ties = 0;
  for (int i = 0; i < kCodebook8Size; ++i) {
    const float code = kCodebook8[i];
    xs.push_back(code);
    xs.push_back(std::nextafter(code, 2.0f));
    xs.push_back(std::nextafter(code, -2.0f));
    if (i + 1 < kCodebook8Size) {
      const float a = code, b = kCodebook8[i + 1];
      const float mid = a + (b - a) / 2.0f;
      for (float x : {mid, std::nextafter(mid, 2.0f), std::nextafter(mid, -2.0f)}) {
        xs.push_back(x);
        if (x - a == b - x) {  // an exact tie in float arithmetic
          ++ties;
          CHECK(nearest_code8(kCodebook8, x) == i);
        }
      }
    }
  }
  CHECK(ties > 100);  // most midpoints are exact ties; the rule above was exercised
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.2f, 1.2f);
  std::uniform_real_distribution<float> exponent(-9.0f, 0.5f);
  for (int i = 0; i < 200000; ++i) xs.push_back(uniform(rng));
  for (int i = 0; i < 200000; ++i) {
    const float magnitude = std::pow(10.0f, exponent(rng));
    xs.push_back(i % 2 ? magnitude : -magnitude);
  }
  int mismatches = 0;
  for (float x : xs) {
    if (nearest_code8(kCodebook8, x) != brute_force_nearest(x)) {
      if (++mismatches < 10) FAIL_CHECK("x=" << x << " binary " << int(nearest_code8(kCodebook8, x)) << " brute "
                                             << int(brute_force_nearest(x)));
    }
  }
  CHECK(mismatches == 0);
  // Outside the finite range (the codec never passes these, but the lookup is total).
  CHECK(nearest_code8(kCodebook8, FLT_MAX) == 255);
  CHECK(nearest_code8(kCodebook8, -FLT_MAX) == 0);
  CHECK(nearest_code8(kCodebook8, INFINITY) == 255);
  CHECK(nearest_code8(kCodebook8, -INFINITY) == 0);
  CHECK(nearest_code8(kCodebook8, NAN) == 0);
}

TEST_CASE("AbsmaxAccumulator: order-free merges, non-finite values mark the block") {
  const auto v = random_normal(4096, 3, 2.0f);
  AbsmaxAccumulator whole;
  for (float x : v) whole.add(x);
  // Strided shares merged in reverse, as a GPU reduction tree might.
  std::vector<AbsmaxAccumulator> parts(256);
  for (std::size_t i = 0; i < v.size(); ++i) parts[i % 256].add(v[i]);
  AbsmaxAccumulator merged;
  for (int p = 255; p >= 0; --p) merged.merge(parts[p]);
  CHECK(std::bit_cast<uint32_t>(merged.result()) == std::bit_cast<uint32_t>(whole.result()));
  float want = 0;
  for (float x : v) want = std::max(want, std::fabs(x));
  CHECK(whole.result() == want);

  AbsmaxAccumulator with_nan;
  with_nan.add(1.0f);
  with_nan.add(NAN);
  CHECK(std::isnan(with_nan.result()));
  AbsmaxAccumulator with_inf;
  with_inf.add(-INFINITY);
  CHECK(std::isnan(with_inf.result()));
  AbsmaxAccumulator negative_zero;
  negative_zero.add(-0.0f);
  CHECK(std::bit_cast<uint32_t>(negative_zero.result()) == 0u);
}

TEST_CASE("blockwise8 round trip: error per value <= absmax x half the largest code gap") {
  const float half_gap = largest_half_gap();
  for (std::size_t n : {std::size_t{4096}, std::size_t{3 * 4096}, std::size_t{4096 * 2 + 5}, std::size_t{4095},
                        std::size_t{4097}, std::size_t{100000}}) {
    for (float scale : {1.0f, 1e-3f, 1e4f, 1e-30f}) {
      INFO("n=" << n << " scale=" << scale);
      const auto values = random_normal(n, static_cast<uint32_t>(n), scale);
      const Blockwise8 encoded = quantize_blockwise8(values);
      REQUIRE(encoded.codes.size() == n);
      REQUIRE(encoded.absmax.size() == static_cast<std::size_t>(blockwise8_num_blocks(static_cast<int64_t>(n))));
      const std::vector<float> decoded = dequantize_blockwise8(encoded);
      REQUIRE(decoded.size() == n);
      double worst_excess = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const float absmax = encoded.absmax[i / 4096];
        // Float rounding of v/absmax and of code·absmax adds at most a few ulps of absmax.
        const double bound = double(absmax) * (double(half_gap) + 1e-6) + 1e-44;
        worst_excess = std::max(worst_excess, std::abs(double(decoded[i]) - double(values[i])) - bound);
      }
      CHECK(worst_excess <= 0);
      for (std::size_t b = 0; b < encoded.absmax.size(); ++b) {
        float want = 0;
        for (std::size_t i = b * 4096; i < std::min(n, (b + 1) * 4096); ++i) want = std::max(want, std::fabs(values[i]));
        CHECK(encoded.absmax[b] == want);
      }
    }
  }
}

TEST_CASE("blockwise8: every code value encodes to itself and decodes exactly") {
  std::vector<float> values(kCodebook8, kCodebook8 + kCodebook8Size);
  const Blockwise8 encoded = quantize_blockwise8(values);
  REQUIRE(encoded.absmax.size() == 1);
  CHECK(encoded.absmax[0] == 1.0f);
  for (int i = 0; i < kCodebook8Size; ++i) CHECK(encoded.codes[i] == i);
  CHECK(dequantize_blockwise8(encoded) == values);
}

TEST_CASE("blockwise8 edge cases: empty, all zero, one value, short last block") {
  const Blockwise8 empty = quantize_blockwise8(std::vector<float>{});
  CHECK(empty.codes.empty());
  CHECK(empty.absmax.empty());
  CHECK(dequantize_blockwise8(empty).empty());

  // All zero (with a -0): absmax 0, the zero code, decoded +0; nothing divides by zero.
  std::vector<float> zeros(5000, 0.0f);
  zeros[17] = -0.0f;
  const Blockwise8 z = quantize_blockwise8(zeros);
  REQUIRE(z.absmax.size() == 2);
  CHECK(z.absmax[0] == 0.0f);
  CHECK(z.absmax[1] == 0.0f);
  CHECK(std::all_of(z.codes.begin(), z.codes.end(), [](uint8_t c) { return c == kZeroCode8; }));
  for (float x : dequantize_blockwise8(z)) CHECK(std::bit_cast<uint32_t>(x) == 0u);

  // One value: it is its own absmax, so it encodes as ±1 and decodes exactly.
  for (float v : {3.25f, -0.001f, 1e-40f}) {
    const Blockwise8 one = quantize_blockwise8(std::vector<float>{v});
    REQUIRE(one.absmax.size() == 1);
    CHECK(one.absmax[0] == std::fabs(v));
    CHECK(one.codes[0] == (v > 0 ? 255 : 0));
    CHECK(dequantize_blockwise8(one)[0] == v);
  }

  // A short last block has its own absmax: a huge value there does not flatten block 0.
  std::vector<float> values = random_normal(4096 + 3, 11, 1.0f);
  values[4097] = 1e6f;
  const Blockwise8 two = quantize_blockwise8(values);
  REQUIRE(two.absmax.size() == 2);
  CHECK(two.absmax[1] == 1e6f);
  CHECK(two.absmax[0] < 10.0f);
  CHECK(two.codes[4097] == 255);

  CHECK(blockwise8_num_blocks(0) == 0);
  CHECK(blockwise8_num_blocks(1) == 1);
  CHECK(blockwise8_num_blocks(4096) == 1);
  CHECK(blockwise8_num_blocks(4097) == 2);
  CHECK(blockwise8_num_blocks(std::numeric_limits<int64_t>::max()) == std::numeric_limits<int64_t>::max() / 4096 + 1);
  CHECK(blockwise8_encoded_bytes(0) == 0);
  CHECK(blockwise8_encoded_bytes(4096) == 4096 + 4);
  CHECK(blockwise8_encoded_bytes(4097) == 4097 + 8);
}

TEST_CASE("blockwise8: NaN or inf poisons only its own block, which decodes to NaN") {
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    INFO("bad=" << bad);
    std::vector<float> values = random_normal(3 * 4096, 5, 1.0f);
    values[4096 + 10] = bad;
    const Blockwise8 encoded = quantize_blockwise8(values);
    CHECK(std::isnan(encoded.absmax[1]));
    CHECK(std::bit_cast<uint32_t>(encoded.absmax[1]) == std::bit_cast<uint32_t>(std::numeric_limits<float>::quiet_NaN()));
    CHECK(std::isfinite(encoded.absmax[0]));
    CHECK(std::isfinite(encoded.absmax[2]));
    for (int i = 4096; i < 2 * 4096; ++i) CHECK(encoded.codes[i] == kZeroCode8);
    const auto decoded = dequantize_blockwise8(encoded);
    int nan_count = 0;
    for (float x : decoded) nan_count += std::isnan(x);
    CHECK(nan_count == 4096);
    for (int i = 4096; i < 2 * 4096; ++i) CHECK(std::isnan(decoded[i]));
  }
  // The largest finite values are ordinary.
  const Blockwise8 big = quantize_blockwise8(std::vector<float>{FLT_MAX, -FLT_MAX, FLT_MAX / 3});
  CHECK(big.absmax[0] == FLT_MAX);
  CHECK(big.codes[0] == 255);
  CHECK(big.codes[1] == 0);
}

TEST_CASE("blockwise8: mismatched sizes give invalid_argument") {
  std::vector<float> values(5000, 1.0f);
  std::vector<uint8_t> codes(5000);
  std::vector<float> absmax(2);
  CHECK(quantize_blockwise8(values, codes, absmax).is_ok());
  std::vector<uint8_t> short_codes(4999);
  std::vector<float> one_absmax(1), three_absmax(3);
  CHECK(quantize_blockwise8(values, short_codes, absmax).code() == StatusCode::invalid_argument);
  CHECK(quantize_blockwise8(values, codes, one_absmax).code() == StatusCode::invalid_argument);
  CHECK(quantize_blockwise8(values, codes, three_absmax).code() == StatusCode::invalid_argument);
  std::vector<float> out(5000), short_out(10);
  CHECK(dequantize_blockwise8(codes, absmax, out).is_ok());
  CHECK(out == values);
  CHECK(dequantize_blockwise8(codes, absmax, short_out).code() == StatusCode::invalid_argument);
  CHECK(dequantize_blockwise8(codes, one_absmax, out).code() == StatusCode::invalid_argument);
  CHECK(dequantize_blockwise8(Blockwise8{codes, one_absmax}).empty());
}

}  // namespace
}  // namespace swarm::compression
