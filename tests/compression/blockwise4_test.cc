// The 4-bit blockwise codec (blockwise4.h, Blockwise4Codec in codecs.h): the
// codebook rebuilt from its recipe bit for bit, the thresholds and nearest-code
// rule against a brute-force nearest search, the frame layout (scales first, low
// nibble first, a zero padding nibble), the exact sizes, the declared error bound
// on random and adversarial blocks, and the refusal of forged frames. The checks
// shared by every codec (NaN input, wrong sizes, random bytes, dispatch) run over
// kAllCodecIds in codecs_test.cc.
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

#include "swarm/compression/blockwise4.h"
#include "swarm/compression/codecs.h"
#include "tests/compression/codec_checks.h"

namespace swarm::compression {
namespace {

using C4 = Blockwise4Codec;
constexpr std::size_t kBlock = 64;
const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kDenormMin = std::numeric_limits<float>::denorm_min();

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }

std::vector<std::byte> encode_ok(std::span<const float> values) { return testing::encode_ok<C4>(values); }
std::vector<float> decode_ok(std::span<const std::byte> frame, std::size_t n) { return testing::decode_ok<C4>(frame, n); }
using testing::random_normal;

// ---- The reference: the recipe and a brute-force nearest code --------------

// The standard normal quantile by bisection on erfc (Phi(x) = erfc(-x/sqrt 2)/2),
// 200 halvings: down to the last bit of a double.
double normal_quantile(double p) {
  double lo = -40.0, hi = 40.0;
  for (int i = 0; i < 200; ++i) {
    const double mid = (lo + hi) / 2;
    (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

// blockwise4.h's recipe, ascending.
std::vector<float> recipe_codebook() {
  const double p0 = 1.0 - (1.0 / 32 + 1.0 / 30) / 2;
  const double top = normal_quantile(p0);
  std::vector<float> book = {0.0f};
  for (int k = 0; k < 8; ++k) book.push_back(static_cast<float>(normal_quantile(p0 + (0.5 - p0) * k / 8) / top));
  for (int j = 0; j < 7; ++j) book.push_back(static_cast<float>(-normal_quantile(p0 + (0.5 - p0) * j / 7) / top));
  std::sort(book.begin(), book.end());
  return book;
}

// The code nearest to x by exact (double) distances; ties to the lower code.
uint8_t brute_force_code(float x) {
  int best = 0;
  for (int j = 1; j < kCodebook4Size; ++j) {
    const double d = std::fabs(static_cast<double>(x) - kCodebook4[j]);
    const double best_d = std::fabs(static_cast<double>(x) - kCodebook4[best]);
    if (d < best_d) best = j;
  }
  return static_cast<uint8_t>(best);
}

// The frame the codec must write, from the brute-force code of fl(v / absmax).
std::vector<std::byte> reference_frame(const std::vector<float>& values) {
  const std::size_t n = values.size();
  const std::size_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<std::byte> frame(4 * blocks + (n + 1) / 2, std::byte{0});
  for (std::size_t b = 0; b < blocks; ++b) {
    float absmax = 0;
    for (std::size_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) absmax = std::max(absmax, std::fabs(values[i]));
    std::memcpy(frame.data() + 4 * b, &absmax, 4);
    for (std::size_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) {
      const uint8_t code = absmax > 0 ? brute_force_code(values[i] / absmax) : kZeroCode4;
      frame[4 * blocks + i / 2] |= static_cast<std::byte>(i % 2 ? code << 4 : code);
    }
  }
  return frame;
}

// Encodes, checks the bytes against reference_frame and every decoded value
// against the declared bound of its block. Returns the decoded values.
std::vector<float> check_codec(const std::vector<float>& values) {
  CHECK(encode_ok(values) == reference_frame(values));
  return testing::check_bound<C4>(values);
}

// ---- The codebook and the nearest-code rule --------------------------------

TEST_CASE("the codebook is its recipe, bit for bit: sorted, distinct, with -1, 0 and +1") {
  const std::vector<float> book = recipe_codebook();
  REQUIRE(book.size() == kCodebook4Size);
  for (int j = 0; j < kCodebook4Size; ++j) {
    INFO("code " << j << ": table " << kCodebook4[j] << ", recipe " << book[j]);
    CHECK(bits(kCodebook4[j]) == bits(book[j]));
  }
  for (int j = 1; j < kCodebook4Size; ++j) CHECK(kCodebook4[j - 1] < kCodebook4[j]);
  CHECK(kCodebook4[0] == -1.0f);
  CHECK(kCodebook4[kZeroCode4] == 0.0f);
  CHECK(bits(kCodebook4[kZeroCode4]) == 0u);  // +0
  CHECK(kCodebook4[kCodebook4Size - 1] == 1.0f);
  // The half gap is exact and is the one next to -1.
  const double half_gap = (double(kCodebook4[1]) - double(kCodebook4[0])) / 2;
  CHECK(double(C4::kLargestHalfGap) == half_gap);
  CHECK(C4::kLargestHalfGap == doctest::Approx(0.1519036).epsilon(1e-6).scale(0));
  for (int j = 1; j < kCodebook4Size; ++j) CHECK(double(kCodebook4[j]) - kCodebook4[j - 1] <= 2 * half_gap);
}

TEST_CASE("threshold j is the largest float at or below the exact midpoint of codes j and j+1") {
  for (int j = 0; j + 1 < kCodebook4Size; ++j) {
    const double mid = (double(kCodebook4[j]) + double(kCodebook4[j + 1])) / 2;
    INFO("threshold " << j);
    CHECK(double(kThresholds4[j]) <= mid);
    CHECK(double(std::nextafter(kThresholds4[j], 2.0f)) > mid);
    CHECK(nearest_code4(kThresholds4[j]) == j);
    CHECK(nearest_code4(std::nextafter(kThresholds4[j], 2.0f)) == j + 1);
  }
}

TEST_CASE("nearest_code4 equals the brute-force nearest code: codes, midpoints, neighbours, a sweep") {
  // Beyond ±1 the ends (the double distances of ±FLT_MAX all round alike, so no brute force).
  CHECK(nearest_code4(FLT_MAX) == 15);
  CHECK(nearest_code4(-FLT_MAX) == 0);
  std::vector<float> xs = {-2.0f, 2.0f, 0.0f, -0.0f, kDenormMin, -kDenormMin};
  for (int j = 0; j < kCodebook4Size; ++j) {
    CHECK(nearest_code4(kCodebook4[j]) == j);
    xs.push_back(kCodebook4[j]);
    if (j + 1 < kCodebook4Size) {
      const double mid = (double(kCodebook4[j]) + double(kCodebook4[j + 1])) / 2;
      float x = static_cast<float>(mid);
      if (double(x) == mid) CHECK(nearest_code4(x) == j);  // an exact tie goes to the lower code
      for (int k = 0; k < 16; ++k) {
        xs.push_back(x);
        x = std::nextafter(x, 2.0f);
      }
      x = static_cast<float>(mid);
      for (int k = 0; k < 16; ++k) xs.push_back(x = std::nextafter(x, -2.0f));
    }
  }
  for (uint32_t u = 0; u <= 0x3f800000u; u += 4093) {
    xs.push_back(std::bit_cast<float>(u));
    xs.push_back(-std::bit_cast<float>(u));
  }
  std::size_t mismatches = 0;
  for (float x : xs) {
    if (nearest_code4(x) != brute_force_code(x) && mismatches++ < 5) {
      FAIL_CHECK("x " << x << " (bits " << bits(x) << "): " << int(nearest_code4(x)) << ", brute force "
                      << int(brute_force_code(x)));
    }
  }
  CHECK(mismatches == 0);
}

// ---- Frames and sizes -------------------------------------------------------

TEST_CASE("sizes: 4·ceil(n/64) + ceil(n/2) bytes, exact for every n up to 2^64 - 1") {
  for (uint64_t n : {uint64_t{0}, uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{63}, uint64_t{64}, uint64_t{65},
                     uint64_t{127}, uint64_t{128}, uint64_t{1000001}}) {
    INFO("n " << n);
    CHECK(*C4::encoded_bytes(n) == 4 * ((n + 63) / 64) + (n + 1) / 2);
  }
  CHECK(*C4::encoded_bytes(0) == 0);
  CHECK(*C4::encoded_bytes(1) == 5);
  CHECK(*C4::encoded_bytes(64) == 36);  // 4.5 bits a value
  CHECK(*C4::encoded_bytes(65) == 41);
  const uint64_t max = ~uint64_t{0};
  CHECK(*C4::encoded_bytes(max) == (uint64_t{1} << 63) + (uint64_t{1} << 60));
  CHECK(*C4::encoded_bytes(max - 1) == (uint64_t{1} << 63) - 1 + (uint64_t{1} << 60));
}

TEST_CASE("the frame: scales first, then two codes a byte, low nibble first, a zero padding nibble") {
  // absmax 2: the codes of 2, -2, 0, 1.125 (x = 0.5625, nearest 0.5626) and -0.0.
  const std::vector<float> values = {2.0f, -2.0f, 0.0f, 1.125f, -0.0f};
  const std::vector<std::byte> frame = encode_ok(values);
  REQUIRE(frame.size() == 4 + 3);
  float absmax;
  std::memcpy(&absmax, frame.data(), 4);
  CHECK(absmax == 2.0f);
  CHECK(frame[4] == std::byte{0x0f});  // value 0: code 15 (+1), value 1: code 0 (-1)
  CHECK(frame[5] == std::byte{0xd7});  // value 2: code 7 (0), value 3: code 13
  CHECK(frame[6] == std::byte{0x07});  // value 4: code 7; the padding nibble 0
  const std::vector<float> back = decode_ok(frame, values.size());
  CHECK(back[0] == 2.0f);
  CHECK(back[1] == -2.0f);
  CHECK(back[2] == 0.0f);
  CHECK(back[3] == kCodebook4[13] * 2.0f);
  CHECK(back[4] == 0.0f);
  // Deterministic: the same input, the same bytes.
  CHECK(encode_ok(values) == frame);
}

TEST_CASE("n = 0, n = 1, and counts that are not multiples of the block") {
  CHECK(encode_ok({}).empty());
  CHECK(decode_ok({}, 0).empty());
  for (float one : {0.0f, -0.0f, 1.0f, -3.5f, kDenormMin, FLT_MAX, -FLT_MAX}) {
    INFO("one value " << one);
    const std::vector<float> values = {one};
    const std::vector<std::byte> frame = encode_ok(values);
    REQUIRE(frame.size() == 5);
    CHECK((static_cast<uint8_t>(frame[4]) >> 4) == 0);
    CHECK(decode_ok(frame, 1)[0] == one);  // a block of one: its own absmax, exact
  }
  for (std::size_t n : {std::size_t{2}, std::size_t{3}, std::size_t{63}, std::size_t{65}, std::size_t{127},
                        std::size_t{129}, std::size_t{1001}, std::size_t{4097}}) {
    INFO("n " << n);
    check_codec(random_normal(n, static_cast<uint32_t>(n), 1.5f));
  }
}

// ---- The error bound ---------------------------------------------------------

TEST_CASE("the declared bound holds on random blocks of every scale, and is tight") {
  for (uint32_t seed : {1u, 2u}) {
    for (float scale : {1e-38f, 1e-30f, 1e-10f, 1e-3f, 1.0f, 1e3f, 1e20f, 1e37f}) {
      INFO("seed " << seed << " scale " << scale);
      check_codec(random_normal(50 * kBlock + 33, seed, scale));
    }
    std::mt19937 rng(seed);  // magnitudes over many decades inside each block
    std::uniform_real_distribution<float> exponent(-44.0f, 38.0f);
    std::vector<float> wide(20 * kBlock + 7);
    for (float& x : wide) x = (rng() & 1 ? 1.0f : -1.0f) * std::pow(10.0f, exponent(rng));
    check_codec(wide);
  }
  // The worst case is reached: a value halfway between -1 and the next code.
  const std::vector<float> worst = {1.0f, static_cast<float>((double(kCodebook4[0]) + kCodebook4[1]) / 2)};
  const std::vector<float> back = check_codec(worst);
  CHECK(std::fabs(back[1] - worst[1]) >= C4::kLargestHalfGap * 0.9999f);
  CHECK(C4::max_abs_error(1.0f, 0.3f) == doctest::Approx(0.1519036).epsilon(1e-5).scale(0));
  CHECK(C4::max_abs_error(0.0f, 0.0f) == 0x1p-149f);
  CHECK(std::isfinite(C4::max_abs_error(FLT_MAX, FLT_MAX)));
  static_assert(C4::max_abs_error(2.0f, 1.0f) > 2.0f * 0.1519f);  // constexpr
}

TEST_CASE("adversarial blocks: ties between codes, tiny, huge, subnormal, all-equal, a single non-zero") {
  SUBCASE("values exactly between codes, and one float either side") {
    for (float absmax : {1.0f, 0.5f, 3.0f, 1e-30f, 7e37f}) {
      INFO("absmax " << absmax);
      std::vector<float> values;
      for (int j = 0; j + 1 < kCodebook4Size; ++j) {
        const float mid = static_cast<float>((double(kCodebook4[j]) + kCodebook4[j + 1]) / 2 * absmax);
        for (float x : {mid, std::nextafter(mid, -FLT_MAX), std::nextafter(mid, FLT_MAX), kThresholds4[j] * absmax}) {
          if (values.size() % kBlock == 0) values.push_back(absmax);  // each block's absmax is `absmax`
          if (std::fabs(x) <= absmax) values.push_back(x);
        }
      }
      check_codec(values);
    }
  }
  SUBCASE("each code times a power of two decodes exactly to itself") {
    for (int e : {-100, -20, 0, 1, 40, 127}) {  // products that stay normal
      INFO("scale 2^" << e);
      std::vector<float> values;
      for (int j = 0; j < kCodebook4Size; ++j) values.push_back(std::ldexp(kCodebook4[j], e));
      const std::vector<float> back = check_codec(values);
      CHECK(back == values);
      const std::vector<std::byte> frame = encode_ok(values);
      for (int j = 0; j < kCodebook4Size; ++j) {
        CHECK(((static_cast<uint8_t>(frame[4 + j / 2]) >> (4 * (j % 2))) & 15) == j);
      }
    }
  }
  SUBCASE("tiny, huge and subnormal blocks") {
    std::vector<float> values = random_normal(3 * kBlock, 5, 1e-6f);
    values[10] = FLT_MAX;  // one huge value among tiny ones: they all become 0
    values[kBlock + 3] = -FLT_MAX;
    for (std::size_t i = 2 * kBlock; i < 3 * kBlock; ++i) {
      values[i] = kDenormMin * static_cast<float>(1 + (i * 7919) % 8388607) * (i % 2 ? 1.0f : -1.0f);
    }
    const std::vector<float> back = check_codec(values);
    CHECK(back[10] == FLT_MAX);
    CHECK(back[kBlock + 3] == -FLT_MAX);
    CHECK(back[11] == 0.0f);
    // A block of the smallest denormals: the decoded products round to that grid.
    const std::vector<float> smallest = {kDenormMin, -kDenormMin, 0.0f, 2 * kDenormMin, kDenormMin};
    check_codec(smallest);
  }
  SUBCASE("all-equal blocks decode exactly; all-zero blocks store the zero code") {
    for (float v : {1.0f, -1.0f, 3.14159f, -2.5e-41f, FLT_MAX, -FLT_MIN}) {
      const std::vector<float> values(2 * kBlock + 1, v);
      CHECK(check_codec(values) == values);
    }
    std::vector<float> zeros(kBlock + 3, 0.0f);
    zeros[5] = -0.0f;
    const std::vector<std::byte> frame = encode_ok(zeros);
    CHECK(frame.size() == 8 + 34);
    for (std::size_t i = 0; i < 8; ++i) CHECK(frame[i] == std::byte{0});
    for (std::size_t i = 8; i + 1 < frame.size(); ++i) CHECK(frame[i] == std::byte{0x77});
    CHECK(frame.back() == std::byte{0x07});
    for (float x : check_codec(zeros)) CHECK(bits(x) == 0u);  // +0: the zero code times a +0 scale
  }
  SUBCASE("a single non-zero value per block") {
    for (float v : {1.0f, -7.25f, 1e-40f, -FLT_MAX}) {
      for (std::size_t where : {std::size_t{0}, std::size_t{31}, std::size_t{63}}) {
        std::vector<float> values(2 * kBlock, 0.0f);
        values[where] = v;
        values[kBlock + where] = -v;
        const std::vector<float> back = check_codec(values);
        CHECK(back == values);
      }
    }
  }
}

// ---- Untrusted frames --------------------------------------------------------

TEST_CASE("decode refuses a non-zero padding nibble, and only for an odd count") {
  const std::vector<float> values = random_normal(2 * kBlock + 1, 3, 1.0f);  // 129 values: 65 code bytes
  const std::vector<std::byte> good = encode_ok(values);
  REQUIRE((static_cast<uint8_t>(good.back()) >> 4) == 0);
  for (uint8_t high = 1; high < 16; ++high) {
    std::vector<std::byte> frame = good;
    frame.back() |= static_cast<std::byte>(high << 4);
    std::vector<float> out(values.size(), 5.0f);
    const Status status = C4::decode(frame, out);
    CHECK(status.code() == StatusCode::invalid_argument);
    CHECK(status.message().find("byte 64") != std::string::npos);
    CHECK(status.message().find("pads") != std::string::npos);
    CHECK(std::all_of(out.begin(), out.end(), [](float x) { return x == 5.0f; }));  // untouched
  }
  // With an even count the last high nibble is a value: code 15 decodes to the block's absmax.
  const std::vector<float> even(values.begin(), values.end() - 1);
  std::vector<std::byte> frame = encode_ok(even);
  frame.back() = static_cast<std::byte>(0xf0 | (static_cast<uint8_t>(frame.back()) & 0x0f));
  float absmax1;
  std::memcpy(&absmax1, frame.data() + 4, 4);  // the scale of block 1, which holds value 127
  CHECK(decode_ok(frame, even.size()).back() == absmax1);
}

TEST_CASE("decode refuses NaN, infinite and negative scales, leaving the output untouched") {
  const std::vector<float> values = random_normal(5 * kBlock + 9, 4, 2.0f);
  const std::vector<std::byte> good = encode_ok(values);
  for (float forged : {kNaN, -kNaN, kInf, -kInf, -1.0f, -kDenormMin, -FLT_MAX}) {
    for (std::size_t block : {std::size_t{0}, std::size_t{3}, std::size_t{5}}) {
      INFO("forged absmax " << forged << " in block " << block);
      std::vector<std::byte> frame = good;
      std::memcpy(frame.data() + 4 * block, &forged, 4);
      std::vector<float> out(values.size(), 5.0f);
      const Status status = C4::decode(frame, out);
      CHECK(status.code() == StatusCode::invalid_argument);
      CHECK(status.message().find("block " + std::to_string(block)) != std::string::npos);
      CHECK(std::all_of(out.begin(), out.end(), [](float x) { return x == 5.0f; }));
    }
  }
  // Legal extremes decode finite: the largest scale, zero, -0, a denormal.
  for (float scale : {FLT_MAX, 0.0f, -0.0f, kDenormMin}) {
    std::vector<std::byte> frame = good;
    for (std::size_t b = 0; b < 6; ++b) std::memcpy(frame.data() + 4 * b, &scale, 4);
    const std::vector<float> out = decode_ok(frame, values.size());
    CHECK(std::all_of(out.begin(), out.end(), [](float x) { return std::isfinite(x); }));
  }
}

TEST_CASE("decode refuses a frame of the wrong size; encode an output of the wrong size") {
  const std::vector<float> values = random_normal(3 * kBlock + 1, 6, 1.0f);
  const std::vector<std::byte> good = encode_ok(values);
  REQUIRE(good.size() == 16 + 97);
  for (std::size_t size : {good.size() - 1, good.size() + 1, std::size_t{0}, std::size_t{97}}) {
    INFO("size " << size);
    std::vector<std::byte> wrong(size);
    std::vector<float> out(values.size());
    const Status decoded = C4::decode(wrong, out);
    CHECK(decoded.code() == StatusCode::invalid_argument);
    CHECK(decoded.message().find(std::to_string(size)) != std::string::npos);
    const Status encoded = C4::encode(values, wrong);
    CHECK(encoded.code() == StatusCode::invalid_argument);
    CHECK(encoded.message().find("113") != std::string::npos);  // the size it needs
  }
  // A frame read with another count: 192 values need 12 + 96 bytes, 195 need 16 + 98.
  // (194 values need the same 113 bytes as 193: the count comes from the tensor's
  // shape, and then the padding nibble is a value.)
  for (std::size_t n : {values.size() - 1, values.size() + 2, std::size_t{0}}) {
    std::vector<float> out(n);
    CHECK(C4::decode(good, out).code() == StatusCode::invalid_argument);
  }
}

TEST_CASE("encode refuses NaN and infinities naming the element, and never writes a non-finite scale") {
  for (float bad : {kNaN, kInf, -kInf}) {
    for (std::size_t where : {std::size_t{0}, std::size_t{64}, std::size_t{200}}) {
      std::vector<float> values = random_normal(201, 7, 1.0f);
      values[where] = bad;
      std::vector<std::byte> frame(*C4::encoded_bytes(values.size()), std::byte{0});
      const Status status = C4::encode(values, frame);
      CHECK(status.code() == StatusCode::invalid_argument);
      CHECK(status.message().find("element " + std::to_string(where)) != std::string::npos);
      for (std::size_t b = 0; b < 4; ++b) {
        float scale;
        std::memcpy(&scale, frame.data() + 4 * b, 4);
        CHECK(std::isfinite(scale));
      }
    }
  }
}

TEST_CASE("random frames decode to an error or to finite values within [-absmax, absmax]") {
  std::mt19937 rng(77);
  int accepted = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const std::size_t n = rng() % 300;
    std::vector<std::byte> frame(*C4::encoded_bytes(n));
    for (std::byte& b : frame) b = static_cast<std::byte>(rng());
    // Mostly plausible scales, so the codes get decoded too.
    for (std::size_t b = 0; b < (n + 63) / 64 && trial % 2 == 0; ++b) {
      const float scale = std::ldexp(static_cast<float>(rng() % 1000), static_cast<int>(rng() % 200) - 100);
      std::memcpy(frame.data() + 4 * b, &scale, 4);
    }
    std::vector<float> out(n);
    if (!C4::decode(frame, out).is_ok()) continue;
    ++accepted;
    for (std::size_t i = 0; i < n; ++i) {
      float scale;
      std::memcpy(&scale, frame.data() + 4 * (i / 64), 4);
      REQUIRE(std::isfinite(out[i]));
      CHECK(std::fabs(out[i]) <= std::fabs(scale));
    }
  }
  CHECK(accepted > 300);  // about 600: half the trials have plausible scales
}

}  // namespace
}  // namespace swarm::compression
