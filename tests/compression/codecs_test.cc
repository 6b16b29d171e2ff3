// The five wire codecs: each declared worst-case error held element by element
// (random tensors over many scales, and adversarial ones), bit-exactness against
// the reference conversions (dtype.h for fp16/bf16, quantize_blockwise8 for 8bit;
// the 4-bit codebook and frame details are in blockwise4_test.cc),
// refusal of NaN/Inf and unrepresentable input, refusal of wrong sizes and forged
// frames on decode, StandardCodecs dispatch, and the encoded sizes.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "swarm/compression/blockwise8.h"
#include "swarm/compression/codecs.h"
#include "swarm/core/dtype.h"
#include "swarm/wire/wire.h"
#include "tests/compression/codec_checks.h"

namespace swarm::compression {
namespace {

constexpr std::size_t kBlock = 4096;
const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kDenormMin = std::numeric_limits<float>::denorm_min();

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }

using testing::block_of;
using testing::check_bound;
using testing::decode_ok;
using testing::encode_ok;
using testing::encode_status;
using testing::random_normal;

// Magnitudes spread log-uniformly over [10^lo, 10^hi], random signs.
std::vector<float> random_log_uniform(std::size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> exponent(lo, hi);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const float m = std::pow(10.0f, exponent(rng));
    v[i] = (rng() & 1) ? m : -m;
  }
  return v;
}

// The reference 8-bit encoding, in the codec's frame layout.
std::vector<std::byte> reference_blockwise8(const std::vector<float>& values) {
  const Blockwise8 reference = quantize_blockwise8(values);
  std::vector<std::byte> frame(reference.absmax.size() * 4 + reference.codes.size());
  if (!reference.absmax.empty()) std::memcpy(frame.data(), reference.absmax.data(), reference.absmax.size() * 4);
  if (!reference.codes.empty()) {
    std::memcpy(frame.data() + reference.absmax.size() * 4, reference.codes.data(), reference.codes.size());
  }
  return frame;
}

// Byte-for-byte the reference (so the same bytes as the CUDA kernels), and
// decoded as dequantize_blockwise8 decodes.
void check_blockwise8_matches_reference(const std::vector<float>& values) {
  const std::vector<std::byte> frame = encode_ok<Blockwise8Codec>(values);
  const std::vector<std::byte> want = reference_blockwise8(values);
  REQUIRE(frame.size() == want.size());
  const std::size_t blocks = (values.size() + kBlock - 1) / kBlock;
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < frame.size(); ++i) {
    if (frame[i] != want[i] && mismatches++ < 5) {
      if (i < 4 * blocks) {
        FAIL_CHECK("absmax byte " << i << " differs");
      } else {
        const std::size_t v = i - 4 * blocks;
        FAIL_CHECK("value " << v << " = " << values[v] << " (bits " << bits(values[v]) << "): code "
                            << int(frame[i]) << ", reference " << int(want[i]));
      }
    }
  }
  CHECK(mismatches == 0);
  const std::vector<float> decoded = decode_ok<Blockwise8Codec>(frame, values.size());
  const Blockwise8 reference = quantize_blockwise8(values);
  const std::vector<float> want_decoded = dequantize_blockwise8(reference);
  REQUIRE(decoded.size() == want_decoded.size());
  std::size_t decode_mismatches = 0;
  for (std::size_t i = 0; i < decoded.size(); ++i) decode_mismatches += bits(decoded[i]) != bits(want_decoded[i]);
  CHECK(decode_mismatches == 0);
}

const std::vector<std::size_t> kSizes = {1, 2, 4095, 4096, 4097, 10000};
const std::vector<float> kScales = {1e-30f, 1e-20f, 1e-10f, 1e-5f, 1e-2f, 1.0f, 1e2f, 1e4f};

TEST_CASE("every codec holds its declared error bound on random tensors") {
  for (uint32_t seed : {1u, 2u, 3u}) {
    for (std::size_t n : kSizes) {
      for (float scale : kScales) {
        INFO("seed " << seed << " n " << n << " scale " << scale);
        const std::vector<float> values = random_normal(n, seed * 7919u + static_cast<uint32_t>(n), scale);
        check_bound<NoneCodec>(values);
        if (scale <= 1e4f) check_bound<Fp16Codec>(values);  // normal(0, 1e4) stays below 65504 here
        check_bound<Bf16Codec>(values);
        check_bound<Blockwise8Codec>(values);
        check_bound<Blockwise4Codec>(values);
      }
    }
    // Magnitudes spread over many decades inside one block (fp16: up to its range).
    INFO("seed " << seed << " log-uniform");
    const std::vector<float> wide = random_log_uniform(3 * kBlock + 17, seed, -38.0f, 4.8f);
    check_bound<NoneCodec>(wide);
    check_bound<Fp16Codec>(wide);
    check_bound<Bf16Codec>(wide);
    check_bound<Blockwise8Codec>(wide);
    check_bound<Blockwise4Codec>(wide);
    const std::vector<float> huge = random_log_uniform(kBlock + 3, seed, 20.0f, 38.5f);
    check_bound<NoneCodec>(huge);
    check_bound<Bf16Codec>(huge);
    check_bound<Blockwise8Codec>(huge);
    check_bound<Blockwise4Codec>(huge);
  }
}

TEST_CASE("the declared bounds") {
  CHECK(NoneCodec::max_abs_error(5.0f, 3.0f) == 0.0f);
  CHECK(Fp16Codec::max_abs_error(0.0f, 1.0f) == 0x1p-11f + 0x1p-25f);
  CHECK(Fp16Codec::max_abs_error(1e6f, -2048.0f) == 1.0f + 0x1p-25f);
  CHECK(Bf16Codec::max_abs_error(0.0f, -1.0f) == 0x1p-8f + 0x1p-134f);
  CHECK(Bf16Codec::max_abs_error(0.0f, 0.0f) == 0x1p-134f);
  // Half the largest codebook gap, the one next to -1.0 (blockwise8.h).
  CHECK(Blockwise8Codec::kLargestHalfGap == doctest::Approx(0.0105469).epsilon(1e-5).scale(0));
  CHECK(Blockwise8Codec::kLargestHalfGap == (kCodebook8[1] - kCodebook8[0]) / 2.0f);
  CHECK(Blockwise8Codec::max_abs_error(1.0f, 0.3f) == doctest::Approx(0.0105469).epsilon(1e-4).scale(0));
  CHECK(Blockwise8Codec::max_abs_error(0.0f, 0.0f) == 0x1p-149f);
  CHECK(std::isfinite(Blockwise8Codec::max_abs_error(FLT_MAX, FLT_MAX)));
  // The 8-bit bound is tight: a value halfway between -1 and the next code.
  std::vector<float> worst(2, 0.0f);
  worst[0] = 1.0f;
  worst[1] = (kCodebook8[0] + kCodebook8[1]) / 2.0f;
  const std::vector<float> back = check_bound<Blockwise8Codec>(worst);
  CHECK(std::fabs(back[1] - worst[1]) >= Blockwise8Codec::kLargestHalfGap * 0.999f);
}

TEST_CASE("adversarial tensors: zeros, one huge value among tiny ones, denormals, extremes") {
  SUBCASE("all-zero blocks, with -0") {
    std::vector<float> zeros(2 * kBlock + 5, 0.0f);
    zeros[3] = -0.0f;
    zeros[kBlock + 1] = -0.0f;
    for (const auto& decoded : {check_bound<NoneCodec>(zeros), check_bound<Fp16Codec>(zeros),
                                check_bound<Bf16Codec>(zeros), check_bound<Blockwise8Codec>(zeros),
                                check_bound<Blockwise4Codec>(zeros)}) {
      for (float x : decoded) CHECK(x == 0.0f);
    }
    const std::vector<std::byte> frame = encode_ok<Blockwise8Codec>(zeros);
    for (int b = 0; b < 3; ++b) {
      float absmax;
      std::memcpy(&absmax, frame.data() + 4 * b, 4);
      CHECK(bits(absmax) == 0u);
    }
    for (std::size_t i = 12; i < frame.size(); ++i) CHECK(static_cast<uint8_t>(frame[i]) == kZeroCode8);
    check_blockwise8_matches_reference(zeros);
    // Signs survive where the format has them.
    CHECK(bits(check_bound<NoneCodec>(zeros)[3]) == bits(-0.0f));
    CHECK(bits(check_bound<Fp16Codec>(zeros)[3]) == bits(-0.0f));
    CHECK(bits(check_bound<Bf16Codec>(zeros)[3]) == bits(-0.0f));
  }
  SUBCASE("one huge value in a block of tiny ones") {
    for (float huge : {1e4f, 6e4f, 1e30f, FLT_MAX}) {
      INFO("huge " << huge);
      std::vector<float> values = random_normal(kBlock + 100, 17, 1e-6f);
      values[1234] = huge;
      values[kBlock + 50] = -huge;
      check_bound<NoneCodec>(values);
      if (huge <= 65504.0f) check_bound<Fp16Codec>(values);
      if (huge <= Bf16Codec::kMaxValue) check_bound<Bf16Codec>(values);
      const std::vector<float> decoded = check_bound<Blockwise8Codec>(values);
      CHECK(decoded[1234] == huge);  // the absmax itself is exact (code 255)
      CHECK(decoded[kBlock + 50] == -huge);
      check_blockwise8_matches_reference(values);
      const std::vector<float> decoded4 = check_bound<Blockwise4Codec>(values);
      CHECK(decoded4[1234] == huge);  // code 15
      CHECK(decoded4[kBlock + 50] == -huge);  // code 0
    }
  }
  SUBCASE("denormals") {
    std::vector<float> values;
    for (int k = 0; k < 2000; ++k) {
      const float d = kDenormMin * static_cast<float>(1 + k * 4093 % 8388607);  // spread over the denormals
      values.push_back(k % 2 ? d : -d);
    }
    values.push_back(kDenormMin);
    values.push_back(-kDenormMin);
    values.push_back(std::nextafter(FLT_MIN, 0.0f));  // the largest denormal
    // A block of denormals alone (a denormal absmax), then one mixed with normals.
    std::vector<float> mixed = random_normal(kBlock, 23, 1.0f);
    for (std::size_t i = 0; i < values.size(); ++i) mixed[i * 2] = values[i];
    mixed[1] = FLT_MIN;
    values.resize(kBlock, 3 * kDenormMin);
    values.insert(values.end(), mixed.begin(), mixed.end());
    // fp16/bf16 subnormal ranges too.
    for (int k = -150; k <= -120; ++k) values.push_back(std::ldexp(1.37f, k));
    for (int k = -26; k <= -13; ++k) values.push_back(-std::ldexp(1.61f, k));
    const auto none = check_bound<NoneCodec>(values);
    CHECK(none == values);
    check_bound<Fp16Codec>(values);
    check_bound<Bf16Codec>(values);
    // bf16 keeps f32 denormals down to its own subnormal step, 2^-133.
    const std::vector<float> bf16_subnormals = {0x1p-133f, -0x1p-130f, 0x1.fcp-127f};
    CHECK(check_bound<Bf16Codec>(bf16_subnormals) == bf16_subnormals);
    const auto q8 = check_bound<Blockwise8Codec>(values);
    CHECK(q8[1] != 0.0f);  // the denormal block is scaled by its own (denormal) absmax
    CHECK(q8[kBlock - 1] != 0.0f);
    check_blockwise8_matches_reference(values);
    const auto q4 = check_bound<Blockwise4Codec>(values);
    CHECK(q4[kBlock - 1] == 3 * kDenormMin);  // an all-equal denormal block: its absmax, exactly
  }
  SUBCASE("range limits") {
    const std::vector<float> fp16_edge = {65504.0f, -65504.0f, 65503.0f, 0x1p-14f, 0x1p-24f, 0x1p-25f,
                                          std::nextafter(0x1p-25f, 1.0f)};
    const auto fp16 = check_bound<Fp16Codec>(fp16_edge);
    CHECK(fp16[0] == 65504.0f);
    CHECK(fp16[1] == -65504.0f);
    CHECK(fp16[4] == 0x1p-24f);  // the smallest fp16 subnormal is exact
    CHECK(fp16[5] == 0.0f);      // 2^-25: a tie, to even (zero)
    CHECK(fp16[6] == 0x1p-24f);  // just above the tie rounds up
    const std::vector<float> bf16_edge = {Bf16Codec::kMaxValue, -Bf16Codec::kMaxValue, FLT_MIN, 1.0f};
    CHECK(check_bound<Bf16Codec>(bf16_edge) == bf16_edge);
    const std::vector<float> extremes = {FLT_MAX, -FLT_MAX, FLT_MAX / 3, FLT_MIN, kDenormMin};
    CHECK(check_bound<NoneCodec>(extremes) == extremes);
    check_bound<Blockwise8Codec>(extremes);
    check_blockwise8_matches_reference(extremes);
    check_bound<Blockwise4Codec>(extremes);
  }
}

TEST_CASE("sizes that are not multiples of 4096 (or 64), and the empty tensor") {
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{63}, std::size_t{65}, std::size_t{4095},
                        std::size_t{4097}, std::size_t{10000}}) {
    INFO("n " << n);
    const std::vector<float> values = random_normal(n, 99, 3.0f);
    check_bound<NoneCodec>(values);
    check_bound<Fp16Codec>(values);
    check_bound<Bf16Codec>(values);
    check_bound<Blockwise8Codec>(values);
    check_blockwise8_matches_reference(values);
    check_bound<Blockwise4Codec>(values);
  }
  // Empty: zero bytes, and it round-trips (also through spans with no storage).
  CHECK(*NoneCodec::encoded_bytes(0) == 0);
  CHECK(*Fp16Codec::encoded_bytes(0) == 0);
  CHECK(*Bf16Codec::encoded_bytes(0) == 0);
  CHECK(*Blockwise8Codec::encoded_bytes(0) == 0);
  CHECK(*Blockwise4Codec::encoded_bytes(0) == 0);
  for (CodecId id : kAllCodecIds) {
    INFO(codec_name(id));
    CHECK(StandardCodecs::encode(id, std::span<const float>(), std::span<std::byte>()).is_ok());
    CHECK(StandardCodecs::decode(id, std::span<const std::byte>(), std::span<float>()).is_ok());
  }
}

TEST_CASE("fp16 and bf16 round exactly as dtype.h does (nearest, ties to even), at every rounding boundary") {
  // Every finite 16-bit value, every midpoint between neighbours (the ties) and
  // the floats just either side of each midpoint.
  std::vector<float> fp16_inputs, bf16_inputs;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const f16 a = f16::from_bits(static_cast<uint16_t>(h));
    const bf16 b = bf16::from_bits(static_cast<uint16_t>(h));
    if ((h & 0x7c00u) != 0x7c00u) {
      const float x = a.to_float();
      fp16_inputs.push_back(x);
      if ((h & 0x7fffu) < 0x7bffu) {  // a finite neighbour above in magnitude
        const float next = f16::from_bits(static_cast<uint16_t>(h + 1)).to_float();
        const float mid = x + (next - x) / 2.0f;  // exact: 12 significant bits
        fp16_inputs.push_back(mid);
        fp16_inputs.push_back(std::nextafter(mid, 0.0f));
        fp16_inputs.push_back(std::nextafter(mid, 2.0f * mid));
      }
    }
    if ((h & 0x7f80u) != 0x7f80u) {
      const float x = b.to_float();
      bf16_inputs.push_back(x);
      if ((h & 0x7fffu) < 0x7f7fu) {
        const float next = bf16::from_bits(static_cast<uint16_t>(h + 1)).to_float();
        const float mid = x + (next - x) / 2.0f;
        bf16_inputs.push_back(mid);
        bf16_inputs.push_back(std::nextafter(mid, 0.0f));
        bf16_inputs.push_back(std::nextafter(mid, 2.0f * mid));
      }
    }
  }
  // And a sweep over all float bit patterns (every 4099th), where in range.
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 4099) {
    const float x = std::bit_cast<float>(static_cast<uint32_t>(u));
    if (std::fabs(x) <= 65504.0f) fp16_inputs.push_back(x);
    if (std::fabs(x) <= Bf16Codec::kMaxValue) bf16_inputs.push_back(x);
  }
  const std::vector<std::byte> fp16_frame = encode_ok<Fp16Codec>(fp16_inputs);
  std::size_t fp16_mismatches = 0;
  for (std::size_t i = 0; i < fp16_inputs.size(); ++i) {
    uint16_t got;
    std::memcpy(&got, fp16_frame.data() + 2 * i, 2);
    const uint16_t want = f16::from_float(fp16_inputs[i]).bits;
    if (got != want && fp16_mismatches++ < 5) {
      FAIL_CHECK("fp16 of " << fp16_inputs[i] << " (bits " << bits(fp16_inputs[i]) << "): " << got << ", want "
                            << want);
    }
  }
  CHECK(fp16_mismatches == 0);
  check_bound<Fp16Codec>(fp16_inputs);
  const std::vector<std::byte> bf16_frame = encode_ok<Bf16Codec>(bf16_inputs);
  std::size_t bf16_mismatches = 0;
  for (std::size_t i = 0; i < bf16_inputs.size(); ++i) {
    uint16_t got;
    std::memcpy(&got, bf16_frame.data() + 2 * i, 2);
    const uint16_t want = bf16::from_float(bf16_inputs[i]).bits;
    if (got != want && bf16_mismatches++ < 5) {
      FAIL_CHECK("bf16 of " << bf16_inputs[i] << " (bits " << bits(bf16_inputs[i]) << "): " << got << ", want "
                            << want);
    }
  }
  CHECK(bf16_mismatches == 0);
  check_bound<Bf16Codec>(bf16_inputs);
}

TEST_CASE("fp16 and bf16 decode every finite bit pattern exactly and refuse every inf/NaN pattern") {
  std::vector<std::byte> fp16_frame, bf16_frame;
  std::vector<float> fp16_want, bf16_want;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t h16 = static_cast<uint16_t>(h);
    std::byte pair[2];
    std::memcpy(pair, &h16, 2);
    const bool fp16_special = (h & 0x7c00u) == 0x7c00u;
    const bool bf16_special = (h & 0x7f80u) == 0x7f80u;
    if (!fp16_special) {
      fp16_frame.insert(fp16_frame.end(), pair, pair + 2);
      fp16_want.push_back(f16::from_bits(h16).to_float());
    }
    if (!bf16_special) {
      bf16_frame.insert(bf16_frame.end(), pair, pair + 2);
      bf16_want.push_back(bf16::from_bits(h16).to_float());
    }
    // Each inf/NaN pattern alone, at element 2 of three, is refused by name.
    std::vector<std::byte> one = {std::byte{0}, std::byte{0}, std::byte{0}, std::byte{0}, pair[0], pair[1]};
    std::vector<float> out(3, 7.0f);
    if (fp16_special) {
      const Status status = Fp16Codec::decode(one, out);
      CHECK(status.code() == StatusCode::invalid_argument);
      CHECK(status.message().find("element 2") != std::string::npos);
    }
    if (bf16_special) {
      const Status status = Bf16Codec::decode(one, out);
      CHECK(status.code() == StatusCode::invalid_argument);
      CHECK(status.message().find("element 2") != std::string::npos);
    }
  }
  const std::vector<float> fp16_got = decode_ok<Fp16Codec>(fp16_frame, fp16_want.size());
  const std::vector<float> bf16_got = decode_ok<Bf16Codec>(bf16_frame, bf16_want.size());
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < fp16_want.size(); ++i) mismatches += bits(fp16_got[i]) != bits(fp16_want[i]);
  for (std::size_t i = 0; i < bf16_want.size(); ++i) mismatches += bits(bf16_got[i]) != bits(bf16_want[i]);
  CHECK(mismatches == 0);
  CHECK(fp16_want.size() == 0x10000 - 2048);
  CHECK(bf16_want.size() == 0x10000 - 256);
}

// Floats in a signed-integer order, so that neighbouring floats differ by one.
int64_t float_order(float f) {
  const int32_t b = std::bit_cast<int32_t>(f);
  return b < 0 ? int64_t{INT32_MIN} - b : int64_t{b};
}
float float_from_order(int64_t o) {
  return std::bit_cast<float>(static_cast<int32_t>(o < 0 ? int64_t{INT32_MIN} - o : o));
}

// Thresholds of nearest_code8 (the largest float that still maps to code j), by
// bisection; the 8-bit codec's lookup table is built around these.
std::vector<float> code8_thresholds() {
  std::vector<float> thresholds;
  for (int j = 0; j + 1 < kCodebook8Size; ++j) {
    int64_t lo = float_order(kCodebook8[j]), hi = float_order(kCodebook8[j + 1]);
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      (nearest_code8(kCodebook8, float_from_order(mid)) <= j ? lo : hi) = mid;
    }
    thresholds.push_back(float_from_order(lo));
  }
  return thresholds;
}

TEST_CASE("8bit codes equal quantize_blockwise8's at every threshold, bucket edge and a sweep of [-1, 1]") {
  // Each block starts with 1.0, so its absmax is 1 and value/absmax is the value.
  std::vector<float> xs;
  for (float m : code8_thresholds()) {
    float up = m, down = m;
    for (int k = 0; k < 8; ++k) {
      xs.push_back(up);
      xs.push_back(down);
      up = std::nextafter(up, 2.0f);
      down = std::nextafter(down, -2.0f);
    }
  }
  for (int i = 0; i < kCodebook8Size; ++i) {
    xs.push_back(kCodebook8[i]);
    xs.push_back(std::nextafter(kCodebook8[i], 2.0f));
    xs.push_back(std::nextafter(kCodebook8[i], -2.0f));
  }
  // The lookup's bucket edges: |x| whose low 16 bits are at either end.
  for (uint32_t top = 0; top <= 0x3f80u; ++top) {
    for (uint32_t low : {0x0000u, 0x0001u, 0xfffeu, 0xffffu}) {
      const float x = std::bit_cast<float>((top << 16) | low);
      if (x > 1.0f) continue;
      xs.push_back(x);
      xs.push_back(-x);
    }
  }
  for (uint32_t u = 0; u <= 0x3f800000u; u += 509) {
    xs.push_back(std::bit_cast<float>(u));
    xs.push_back(-std::bit_cast<float>(u));
  }
  std::vector<float> values;
  values.reserve(xs.size() + xs.size() / (kBlock - 1) + 1);
  for (float x : xs) {
    if (std::fabs(x) > 1.0f) continue;  // keep the block's absmax at 1
    if (values.size() % kBlock == 0) values.push_back(values.size() / kBlock % 2 ? -1.0f : 1.0f);
    values.push_back(x);
  }
  INFO(values.size() << " values");
  check_blockwise8_matches_reference(values);
  check_bound<Blockwise8Codec>(values);
}

TEST_CASE("8bit codes equal quantize_blockwise8's on random tensors of every scale") {
  for (uint32_t seed : {5u, 6u}) {
    for (float scale : kScales) {
      INFO("seed " << seed << " scale " << scale);
      check_blockwise8_matches_reference(random_normal(3 * kBlock + 77, seed, scale));
    }
    check_blockwise8_matches_reference(random_log_uniform(5 * kBlock, seed, -44.0f, 38.0f));
  }
}

TEST_CASE("NaN and infinities are refused, naming the element; out-of-range values too") {
  for (float bad : {kNaN, -kNaN, kInf, -kInf}) {
    for (std::size_t where : {std::size_t{0}, std::size_t{4097}, std::size_t{9999}}) {
      INFO("bad " << bad << " at " << where);
      std::vector<float> values = random_normal(10000, 3, 1.0f);
      values[where] = bad;
      const std::string element = "element " + std::to_string(where);
      for (CodecId id : kAllCodecIds) {
        INFO(codec_name(id));
        std::vector<std::byte> frame(*StandardCodecs::encoded_bytes(id, values.size()), std::byte{0});
        const Status status = StandardCodecs::encode(id, values, frame);
        CHECK(status.code() == StatusCode::invalid_argument);
        CHECK(status.message().find(element) != std::string::npos);
        CHECK(status.message().find(std::isnan(bad) ? "NaN" : "inf") != std::string::npos);
        if (id == CodecId::blockwise8 || id == CodecId::blockwise4) {
          // Never a NaN (or inf) scale, even in a frame that was refused.
          const int blocks = id == CodecId::blockwise8 ? 3 : 157;  // ceil(10000 / 4096), ceil(10000 / 64)
          for (int b = 0; b < blocks; ++b) {
            float absmax;
            std::memcpy(&absmax, frame.data() + 4 * b, 4);
            CHECK(std::isfinite(absmax));
          }
        }
      }
    }
  }
  const Status fp16 = encode_status<Fp16Codec>(std::vector<float>{1.0f, 2.0f, 65505.0f});
  CHECK(fp16.code() == StatusCode::out_of_range);
  CHECK(fp16.message().find("element 2") != std::string::npos);
  CHECK(fp16.message().find("65504") != std::string::npos);
  CHECK(encode_status<Fp16Codec>(std::vector<float>{std::nextafter(65504.0f, 1e9f)}).code() ==
        StatusCode::out_of_range);
  CHECK(encode_status<Fp16Codec>(std::vector<float>{-1e30f}).code() == StatusCode::out_of_range);
  const Status bf16 = encode_status<Bf16Codec>(std::vector<float>{0.0f, FLT_MAX});
  CHECK(bf16.code() == StatusCode::out_of_range);
  CHECK(bf16.message().find("element 1") != std::string::npos);
  CHECK(encode_status<Bf16Codec>(std::vector<float>{std::nextafter(Bf16Codec::kMaxValue, FLT_MAX)}).code() ==
        StatusCode::out_of_range);
  // NaN is reported as such even after an out-of-range value... whichever comes first is named.
  const Status first = encode_status<Fp16Codec>(std::vector<float>{1e6f, kNaN});
  CHECK(first.code() == StatusCode::out_of_range);
  CHECK(first.message().find("element 0") != std::string::npos);
}

TEST_CASE("encode and decode refuse frames of the wrong size") {
  const std::vector<float> values = random_normal(5000, 8, 1.0f);
  for (CodecId id : kAllCodecIds) {
    INFO(codec_name(id));
    const uint64_t bytes = *StandardCodecs::encoded_bytes(id, values.size());
    std::vector<std::byte> frame(bytes);
    REQUIRE(StandardCodecs::encode(id, values, frame).is_ok());
    for (std::size_t size : {bytes - 1, bytes + 1, std::size_t{0}}) {
      std::vector<std::byte> wrong(size);
      const Status enc = StandardCodecs::encode(id, values, wrong);
      CHECK(enc.code() == StatusCode::invalid_argument);
      CHECK(enc.message().find(std::to_string(bytes)) != std::string::npos);
      std::vector<float> out(values.size());
      const Status dec = StandardCodecs::decode(id, wrong, out);
      CHECK(dec.code() == StatusCode::invalid_argument);
      CHECK(dec.message().find(std::to_string(size)) != std::string::npos);
    }
    std::vector<float> fewer(values.size() - 1), more(values.size() + 1), none;
    CHECK(StandardCodecs::decode(id, frame, fewer).code() == StatusCode::invalid_argument);
    CHECK(StandardCodecs::decode(id, frame, more).code() == StatusCode::invalid_argument);
    CHECK(StandardCodecs::decode(id, frame, none).code() == StatusCode::invalid_argument);
  }
}

TEST_CASE("decode refuses forged NaN/inf scales and bit patterns, leaving nothing non-finite") {
  const std::vector<float> values = random_normal(3 * kBlock, 9, 2.0f);
  SUBCASE("8bit absmax") {
    const std::vector<std::byte> good = encode_ok<Blockwise8Codec>(values);
    for (float forged : {kNaN, -kNaN, kInf, -kInf, -1.0f, -kDenormMin}) {
      INFO("forged absmax " << forged);
      std::vector<std::byte> frame = good;
      std::memcpy(frame.data() + 4 * 1, &forged, 4);
      std::vector<float> out(values.size(), 5.0f);
      const Status status = Blockwise8Codec::decode(frame, out);
      CHECK(status.code() == StatusCode::invalid_argument);
      CHECK(status.message().find("block 1") != std::string::npos);
      CHECK(std::all_of(out.begin(), out.end(), [](float x) { return x == 5.0f; }));  // untouched
    }
    // Legal extremes decode finite: the largest scale, a zero scale, a denormal one.
    for (float scale : {FLT_MAX, 0.0f, -0.0f, kDenormMin}) {
      std::vector<std::byte> frame = good;
      std::memcpy(frame.data(), &scale, 4);
      const std::vector<float> out = decode_ok<Blockwise8Codec>(frame, values.size());
      CHECK(std::all_of(out.begin(), out.end(), [](float x) { return std::isfinite(x); }));
    }
  }
  SUBCASE("none bit patterns") {
    for (uint32_t forged : {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffffffffu}) {
      std::vector<std::byte> frame = encode_ok<NoneCodec>(values);
      std::memcpy(frame.data() + 4 * 4100, &forged, 4);
      std::vector<float> out(values.size());
      const Status status = NoneCodec::decode(frame, out);
      CHECK(status.code() == StatusCode::invalid_argument);
      CHECK(status.message().find("element 4100") != std::string::npos);
    }
  }
  SUBCASE("fp16 and bf16 bit patterns") {
    for (uint16_t forged : {uint16_t{0x7c00}, uint16_t{0xfc00}, uint16_t{0x7e00}, uint16_t{0x7c01}}) {
      std::vector<std::byte> frame = encode_ok<Fp16Codec>(values);
      std::memcpy(frame.data() + 2 * 77, &forged, 2);
      std::vector<float> out(values.size());
      const Status status = Fp16Codec::decode(frame, out);
      CHECK(status.code() == StatusCode::invalid_argument);
      CHECK(status.message().find("element 77") != std::string::npos);
    }
    for (uint16_t forged : {uint16_t{0x7f80}, uint16_t{0xff80}, uint16_t{0x7fc0}, uint16_t{0x7f81}}) {
      std::vector<std::byte> frame = encode_ok<Bf16Codec>(values);
      std::memcpy(frame.data() + 2 * 12287, &forged, 2);
      std::vector<float> out(values.size());
      const Status status = Bf16Codec::decode(frame, out);
      CHECK(status.code() == StatusCode::invalid_argument);
      CHECK(status.message().find("element 12287") != std::string::npos);
    }
  }
  SUBCASE("random bytes: an error or finite values, never anything else") {
    std::mt19937 rng(31);
    for (int trial = 0; trial < 300; ++trial) {
      const std::size_t n = rng() % 9000;
      for (CodecId id : kAllCodecIds) {
        std::vector<std::byte> frame(*StandardCodecs::encoded_bytes(id, n));
        for (std::byte& b : frame) b = static_cast<std::byte>(rng());
        std::vector<float> out(n);
        if (StandardCodecs::decode(id, frame, out).is_ok()) {
          CHECK(std::all_of(out.begin(), out.end(), [](float x) { return std::isfinite(x); }));
        }
      }
    }
  }
}

TEST_CASE("unaligned frames encode and decode the same bytes") {
  const std::vector<float> values = random_normal(kBlock + 9, 12, 4.0f);
  for (CodecId id : kAllCodecIds) {
    INFO(codec_name(id));
    const uint64_t bytes = *StandardCodecs::encoded_bytes(id, values.size());
    std::vector<std::byte> aligned(bytes), storage(bytes + 3);
    const std::span<std::byte> shifted(storage.data() + 1, bytes);
    REQUIRE(StandardCodecs::encode(id, values, aligned).is_ok());
    REQUIRE(StandardCodecs::encode(id, values, shifted).is_ok());
    CHECK(std::equal(aligned.begin(), aligned.end(), shifted.begin()));
    std::vector<float> a(values.size()), b(values.size());
    REQUIRE(StandardCodecs::decode(id, aligned, a).is_ok());
    REQUIRE(StandardCodecs::decode(id, shifted, b).is_ok());
    CHECK(a == b);
  }
}

TEST_CASE("StandardCodecs dispatch equals the direct codec, bit for bit") {
  const std::vector<float> values = random_log_uniform(2 * kBlock + 11, 13, -12.0f, 4.5f);
  auto same = [&](auto codec) {
    using C = decltype(codec);
    INFO(codec_name(C::id));
    CHECK(StandardCodecs::supports(C::id));
    for (uint64_t n : {uint64_t{0}, uint64_t{1}, uint64_t{4097}, uint64_t{1} << 40, ~uint64_t{0}}) {
      const auto direct = C::encoded_bytes(n);
      const auto table = StandardCodecs::encoded_bytes(C::id, n);
      REQUIRE(direct.is_ok() == table.is_ok());
      if (direct.is_ok()) CHECK(*direct == *table);
    }
    const std::vector<std::byte> direct = encode_ok<C>(values);
    std::vector<std::byte> table(direct.size());
    REQUIRE(StandardCodecs::encode(C::id, values, table).is_ok());
    CHECK(direct == table);
    const std::vector<float> a = decode_ok<C>(direct, values.size());
    std::vector<float> b(values.size());
    REQUIRE(StandardCodecs::decode(C::id, table, b).is_ok());
    std::size_t differ = 0;
    for (std::size_t i = 0; i < a.size(); ++i) differ += bits(a[i]) != bits(b[i]);
    CHECK(differ == 0);
    CHECK(StandardCodecs::max_abs_error(C::id, 3.0f, -1.5f) == C::max_abs_error(3.0f, -1.5f));
    // Errors pass through unchanged.
    std::vector<float> with_nan = values;
    with_nan[5] = kNaN;
    CHECK(StandardCodecs::encode(C::id, with_nan, table) == C::encode(with_nan, table));
  };
  same(NoneCodec{});
  same(Fp16Codec{});
  same(Bf16Codec{});
  same(Blockwise8Codec{});
  same(Blockwise4Codec{});

  const CodecId unknown = static_cast<CodecId>(kMaxCodecId + 1);
  CHECK_FALSE(StandardCodecs::supports(unknown));
  CHECK(StandardCodecs::encoded_bytes(unknown, 10).status().code() == StatusCode::invalid_argument);
  std::vector<std::byte> frame(40);
  std::vector<float> out(10);
  const Status unknown_status = StandardCodecs::encode(unknown, out, frame);
  CHECK(unknown_status.code() == StatusCode::invalid_argument);
  CHECK(unknown_status.message().find("4 4bit") != std::string::npos);  // the known list names it
  CHECK(StandardCodecs::decode(unknown, frame, out).code() == StatusCode::invalid_argument);
  CHECK(std::isinf(StandardCodecs::max_abs_error(unknown, 1.0f, 1.0f)));
}

TEST_CASE("encoded sizes: none 4 bytes a value, fp16/bf16 2, 8bit about 1, 4bit 0.5625, as the wire expects") {
  const uint64_t n = uint64_t{1} << 20;
  CHECK(*NoneCodec::encoded_bytes(n) == 4 * n);
  CHECK(*Fp16Codec::encoded_bytes(n) == 2 * n);
  CHECK(*Bf16Codec::encoded_bytes(n) == 2 * n);
  const uint64_t q8 = *Blockwise8Codec::encoded_bytes(n);
  CHECK(q8 == n + 4 * (n / 4096));
  CHECK(static_cast<double>(q8) / static_cast<double>(n) <= 1.001);
  CHECK(encode_ok<Blockwise8Codec>(random_normal(n, 1, 1.0f)).size() == q8);

  CHECK(*Blockwise8Codec::encoded_bytes(1) == 5);
  CHECK(*Blockwise8Codec::encoded_bytes(4096) == 4100);
  CHECK(*Blockwise8Codec::encoded_bytes(4097) == 4105);
  const uint64_t q4 = *Blockwise4Codec::encoded_bytes(n);
  CHECK(q4 == n / 2 + 4 * (n / 64));  // 4.5 bits a value
  CHECK(static_cast<double>(4 * n) / static_cast<double>(q4) == doctest::Approx(32.0 / 4.5));
  CHECK(encode_ok<Blockwise4Codec>(random_normal(n, 1, 1.0f)).size() == q4);
  // Overflow is an error, not a wrapped count.
  CHECK(*NoneCodec::encoded_bytes((uint64_t{1} << 62) - 1) == ~uint64_t{0} - 3);
  CHECK(NoneCodec::encoded_bytes(uint64_t{1} << 62).status().code() == StatusCode::out_of_range);
  CHECK(Fp16Codec::encoded_bytes(uint64_t{1} << 63).status().code() == StatusCode::out_of_range);
  CHECK(Bf16Codec::encoded_bytes(~uint64_t{0}).status().code() == StatusCode::out_of_range);
  CHECK(Blockwise8Codec::encoded_bytes(~uint64_t{0}).status().code() == StatusCode::out_of_range);
  CHECK(Blockwise8Codec::encoded_bytes(~uint64_t{0} - (~uint64_t{0} / 1024) - 8).is_ok());
  // 4bit never overflows: the largest n still has an exact size, 2^63 + 2^60.
  CHECK(*Blockwise4Codec::encoded_bytes(~uint64_t{0}) == (uint64_t{1} << 63) + (uint64_t{1} << 60));

  // The same counts as the wire's frame-size check, and the same codec numbers.
  static_assert(static_cast<uint8_t>(CodecId::none) == static_cast<uint8_t>(wire::Codec::none));
  static_assert(static_cast<uint8_t>(CodecId::fp16) == static_cast<uint8_t>(wire::Codec::fp16));
  static_assert(static_cast<uint8_t>(CodecId::bf16) == static_cast<uint8_t>(wire::Codec::bf16));
  static_assert(static_cast<uint8_t>(CodecId::blockwise8) == static_cast<uint8_t>(wire::Codec::blockwise8));
  static_assert(static_cast<uint8_t>(CodecId::blockwise4) == static_cast<uint8_t>(wire::Codec::blockwise4));
  static_assert(kMaxCodecId == wire::kMaxCodecCode);
  static_assert(wire::kBlockwise4BlockSize == static_cast<uint64_t>(Blockwise4Codec::kBlockSize));
  for (uint64_t count : {uint64_t{0}, uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{63}, uint64_t{64}, uint64_t{65},
                         uint64_t{4095}, uint64_t{4096}, uint64_t{4097}, uint64_t{10000}, n, ~uint64_t{0} - 1,
                         ~uint64_t{0}}) {
    for (CodecId id : kAllCodecIds) {
      INFO(codec_name(id) << " n " << count);
      const auto ours = StandardCodecs::encoded_bytes(id, count);
      const auto theirs = wire::expected_payload_bytes(DType::f32, count, static_cast<wire::Codec>(id));
      REQUIRE(ours.is_ok() == theirs.is_ok());
      if (ours.is_ok()) CHECK(*ours == *theirs);
    }
  }
}

}  // namespace
}  // namespace swarm::compression
