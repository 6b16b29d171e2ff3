#include "swarm/core/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include <doctest/doctest.h>

namespace swarm {
namespace {

static_assert(size_of(DType::f32) == 4 && size_of(DType::bf16) == 2 && size_of(DType::i64) == 8);
static_assert(dtype_of_v<bf16> == DType::bf16);
static_assert(bf16::from_float(1.0f).bits == 0x3f80);
static_assert(f16::from_float(1.0f).bits == 0x3c00);

// The compiler's own IEEE half type is the reference for f16.
uint16_t reference_f16_bits(float value) {
  _Float16 h = static_cast<_Float16>(value);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}

float reference_f16_to_float(uint16_t bits) {
  _Float16 h;
  std::memcpy(&h, &bits, 2);
  return static_cast<float>(h);
}

TEST_CASE("dtype names and wire codes round-trip, unknown codes are rejected") {
  for (DType dtype : kAllDTypes) {
    CHECK(dtype_from_name(dtype_name(dtype)) == dtype);
    CHECK(dtype_from_code(static_cast<uint8_t>(dtype)) == dtype);
  }
  CHECK_FALSE(dtype_from_code(6).has_value());
  CHECK_FALSE(dtype_from_code(255).has_value());
  CHECK_FALSE(dtype_from_name("f64").has_value());
  CHECK(is_floating(DType::bf16));
  CHECK_FALSE(is_floating(DType::i32));
}

TEST_CASE("bf16 rounds to nearest even and keeps specials") {
  CHECK(bf16::from_float(1.0f).to_float() == 1.0f);
  CHECK(bf16::from_float(-2.5f).to_float() == -2.5f);
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  CHECK(bf16::from_float(1.0f + 1.0f / 256).to_float() == 1.0f);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties go to 1 + 2^-6.
  CHECK(bf16::from_float(1.0f + 3.0f / 256).to_float() == 1.0f + 2.0f / 128);
  CHECK(std::isinf(bf16::from_float(std::numeric_limits<float>::infinity()).to_float()));
  CHECK(std::isnan(bf16::from_float(std::numeric_limits<float>::quiet_NaN()).to_float()));
  // A NaN whose payload sits only in the low 16 bits must not become infinity.
  CHECK(std::isnan(bf16::from_float(std::bit_cast<float>(0x7f800001u)).to_float()));
}

TEST_CASE("bf16 relative error is at most the unit roundoff 2^-8 over random normals") {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 100.0f);
  int violations = 0;
  float worst = 0;
  for (int i = 0; i < 100000; ++i) {
    float x = normal(rng);
    float relative = std::fabs(bf16::from_float(x).to_float() - x) / std::fabs(x);
    worst = std::max(worst, relative);
    if (relative > 1.0f / 256) ++violations;
  }
  CHECK(violations == 0);
  CHECK(worst > 1.0f / 512);  // the bound is tight, not vacuous
}

TEST_CASE("f16 matches the compiler's _Float16 on every half value and on random floats") {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    float reference = reference_f16_to_float(static_cast<uint16_t>(bits));
    float ours = f16::from_bits(static_cast<uint16_t>(bits)).to_float();
    if (std::isnan(reference)) {
      CHECK(std::isnan(ours));
    } else {
      REQUIRE_MESSAGE(std::bit_cast<uint32_t>(ours) == std::bit_cast<uint32_t>(reference), bits);
    }
  }
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> any_bits;
  int mismatches = 0;
  for (int i = 0; i < 1000000; ++i) {
    float x = std::bit_cast<float>(any_bits(rng));
    if (std::isnan(x)) {
      CHECK(std::isnan(f16::from_float(x).to_float()));
      continue;
    }
    if (f16::from_float(x).bits != reference_f16_bits(x)) ++mismatches;
  }
  // Also the awkward region: subnormals and the rounding boundary near 65520.
  for (float x : {5.96e-8f, 2.98e-8f, 2.99e-8f, 6.1e-5f, 6.0e-5f, 65504.0f, 65519.0f, 65520.0f,
                  -3.0e-6f, 1e-10f}) {
    if (f16::from_float(x).bits != reference_f16_bits(x)) ++mismatches;
  }
  CHECK(mismatches == 0);
}

}  // namespace
}  // namespace swarm
