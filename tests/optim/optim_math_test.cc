#include "swarm/core/optim_math.h"

#include <cmath>

#include <doctest/doctest.h>

namespace swarm::optim {
namespace {

TEST_CASE("adam_coefficients holds 1 - beta^step") {
  AdamCoefficients c = adam_coefficients(0.9f, 0.95f, 1e-6f, 1);
  CHECK(c.bias_correction1 == doctest::Approx(0.1).epsilon(1e-6).scale(0));
  CHECK(c.bias_correction2 == doctest::Approx(0.05).epsilon(1e-5).scale(0));
  c = adam_coefficients(0.9f, 0.95f, 1e-6f, 2);
  CHECK(c.bias_correction1 == doctest::Approx(0.19).epsilon(1e-6).scale(0));
  CHECK(c.bias_correction2 == doctest::Approx(0.0975).epsilon(1e-5).scale(0));
  // Late in training the correction vanishes instead of underflowing to something odd.
  c = adam_coefficients(0.9f, 0.95f, 1e-6f, 1'000'000);
  CHECK(c.bias_correction1 == 1.0f);
  CHECK(c.bias_correction2 == 1.0f);
}

TEST_CASE("adam_update_element: the first step is the gradient's sign, moments are EMAs") {
  const AdamCoefficients c = adam_coefficients(0.9f, 0.95f, 1e-6f, 1);
  float m = 0.0f;
  float v = 0.0f;
  const float direction = adam_update_element(-2.0f, m, v, c);
  CHECK(m == doctest::Approx(-0.2).scale(0));
  CHECK(v == doctest::Approx(0.2).scale(0));
  // m_hat / (sqrt(v_hat) + eps) = -2 / (2 + 1e-6)
  CHECK(direction == doctest::Approx(-2.0 / (2.0 + 1e-6)).epsilon(1e-7).scale(0));
  // A zero gradient on zero moments gives no movement, not 0/0.
  float m0 = 0.0f;
  float v0 = 0.0f;
  CHECK(adam_update_element(0.0f, m0, v0, c) == 0.0f);
}

TEST_CASE("decoupled_weight_decay is wd * w only when applied") {
  CHECK(decoupled_weight_decay(3.0f, 0.01f, true) == doctest::Approx(0.03).scale(0));
  CHECK(decoupled_weight_decay(3.0f, 0.01f, false) == 0.0f);
}

TEST_CASE("trust_ratio is ||w|| / ||u||, 1 when either is zero, clamped at the max") {
  CHECK(trust_ratio(2.0f, 4.0f) == 0.5f);
  CHECK(trust_ratio(0.0f, 4.0f) == 1.0f);
  CHECK(trust_ratio(2.0f, 0.0f) == 1.0f);
  CHECK(trust_ratio(0.0f, 0.0f) == 1.0f);
  CHECK(trust_ratio(100.0f, 1.0f) == 10.0f);         // default clamp
  CHECK(trust_ratio(100.0f, 1.0f, 50.0f) == 50.0f);  // custom clamp
  CHECK(trust_ratio(100.0f, 1.0f, 0.0f) == 100.0f);  // clamp off
  CHECK(trust_ratio(std::nanf(""), 1.0f) == 1.0f);
}

TEST_CASE("clip_coefficient scales the global norm down to max_norm, never up") {
  CHECK(clip_coefficient(0.5f, 1.0f) == 1.0f);
  CHECK(clip_coefficient(0.0f, 1.0f) == 1.0f);
  CHECK(clip_coefficient(10.0f, 1.0f) == doctest::Approx(1.0 / (10.0 + 1e-6)).scale(0));
  CHECK(clip_coefficient(1000.0f, 2.0f) * 1000.0f == doctest::Approx(2.0).epsilon(1e-6).scale(0));
  CHECK(clip_coefficient(1000.0f, 0.0f) == 1.0f);   // disabled
  CHECK(clip_coefficient(1000.0f, -1.0f) == 1.0f);  // disabled
}

}  // namespace
}  // namespace swarm::optim
