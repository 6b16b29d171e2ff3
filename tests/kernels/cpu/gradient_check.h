// gradient_check: compares an analytic gradient with central finite differences.
//
// The objective is L(x) = sum(forward(x) * R) for a fixed random R, so the
// analytic gradient is backward(dout = R). Differences are taken in float
// (the kernels are fp32) with a step h, and the error is measured relative to
// the largest gradient entry, so tiny entries do not produce false alarms.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <doctest/doctest.h>

namespace swarm::testing {

inline std::vector<float> random_vector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

inline double weighted_sum(const std::vector<float>& out, const std::vector<float>& weights) {
  double total = 0;
  for (size_t i = 0; i < out.size(); ++i) total += static_cast<double>(out[i]) * weights[i];
  return total;
}

// Perturbs each entry of `x`, calls `objective`, and checks against `analytic`.
// Returns the worst error relative to max |analytic|.
inline double check_gradient(const std::string& what, std::vector<float>& x,
                             const std::vector<float>& analytic,
                             const std::function<double()>& objective, float h,
                             double tolerance) {
  REQUIRE(analytic.size() == x.size());
  double scale = 1e-12;
  for (float g : analytic) scale = std::max(scale, static_cast<double>(std::fabs(g)));
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float saved = x[i];
    x[i] = saved + h;
    const double plus = objective();
    x[i] = saved - h;
    const double minus = objective();
    x[i] = saved;
    const double numeric = (plus - minus) / (2.0 * h);
    worst = std::max(worst, std::fabs(numeric - analytic[i]) / scale);
  }
  INFO(what << ": worst relative error " << worst << " (tolerance " << tolerance << ")");
  CHECK(worst <= tolerance);
  return worst;
}

}  // namespace swarm::testing
