// Edge cases of trust_ratio and clip_coefficient that optim_math_test.cc leaves open: infinite,
// NaN and denormal norms, the boundaries of the clamp and of clipping. The CUDA optimizer runs
// these same functions and relies on what they return for non-finite inputs (a refused step
// still writes a clip coefficient; it must not be used, but it must not trap either).
#include <cmath>
#include <limits>

#include <doctest/doctest.h>

#include "swarm/core/optim_math.h"

namespace swarm::optim {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kDenormal = std::numeric_limits<float>::denorm_min();

TEST_CASE("trust_ratio with non-finite norms") {
  CHECK(trust_ratio(1.0f, std::nanf("")) == 1.0f);   // NaN update norm: not > 0, plain Adam
  CHECK(trust_ratio(kInf, 1.0f) == 10.0f);           // infinite weight norm: clamped
  CHECK(trust_ratio(kInf, 1.0f, 0.0f) == kInf);      // ... and with the clamp off it stays infinite
  CHECK(trust_ratio(1.0f, kInf) == 0.0f);            // infinite update: no step at all
  CHECK(std::isnan(trust_ratio(kInf, kInf, 0.0f)));  // inf / inf passes the > 0 test
  CHECK(trust_ratio(kInf, kInf) != trust_ratio(kInf, kInf));  // NaN is not > max: NaN comes back
}

TEST_CASE("trust_ratio at the edges of the clamp") {
  CHECK(trust_ratio(10.0f, 1.0f) == 10.0f);                 // exactly the max: kept
  CHECK(trust_ratio(std::nextafter(10.0f, 11.0f), 1.0f) == 10.0f);
  CHECK(trust_ratio(1.0f, kDenormal) == 10.0f);             // tiny update: the clamp holds the step
  CHECK(trust_ratio(kDenormal, 1.0f) == kDenormal);         // tiny weights: a tiny ratio, not 1
  CHECK(trust_ratio(-1.0f, 1.0f) == 1.0f);                  // not a norm: treated as none
  CHECK(trust_ratio(100.0f, 1.0f, -5.0f) == 100.0f);        // negative max: clamp off
  CHECK(trust_ratio(1.0f, 2.0f, 0.25f) == 0.25f);           // a max below 1 also caps ratios < 1
}

TEST_CASE("clip_coefficient with non-finite and boundary norms") {
  CHECK(clip_coefficient(std::nanf(""), 1.0f) == 1.0f);  // NaN never compares < 1
  CHECK(clip_coefficient(kInf, 1.0f) == 0.0f);            // infinite norm: every gradient zeroed
  CHECK(clip_coefficient(kInf, 0.0f) == 1.0f);            // disabled wins
  CHECK(clip_coefficient(1.0f, std::nanf("")) == 1.0f);   // a NaN max counts as disabled
  // A norm exactly at the max still scales by max / (max + kClipEpsilon), just below 1.
  CHECK(clip_coefficient(1.0f, 1.0f) < 1.0f);
  CHECK(clip_coefficient(1.0f, 1.0f) == 1.0f / (1.0f + kClipEpsilon));
  // Just below the max (by more than kClipEpsilon): untouched.
  CHECK(clip_coefficient(1.0f - 1e-5f, 1.0f) == 1.0f);
  // A denormal max still clips; the result is finite and tiny.
  const float tiny = clip_coefficient(1.0f, kDenormal);
  CHECK(tiny > 0.0f);
  CHECK(tiny < 1e-40f);
  // Zero norm with clipping on: max / kClipEpsilon is huge, so the coefficient is 1.
  CHECK(clip_coefficient(0.0f, 1e-3f) == 1.0f);
  // A max below kClipEpsilon clips even a zero norm (harmless: the gradients are zero).
  CHECK(clip_coefficient(0.0f, 1e-7f) == doctest::Approx(0.1f).scale(0));
}

}  // namespace
}  // namespace swarm::optim
