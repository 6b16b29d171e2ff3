// The per-element GELU the CUDA kernels run, checked on the CPU: it matches the CPU
// backend's array formulas (which differ only in Eigen's vectorized tanh, hence
// tolerances of a few float ulps, stated per check) and its derivative matches a central difference.
#include <cmath>
#include <random>
#include <vector>

#include <doctest/doctest.h>

#include "kernels/common/gelu.h"
#include "kernels/cpu/ops.h"

namespace swarm::kernels {
namespace {

std::vector<float> test_points() {
  std::vector<float> x;
  for (int i = -800; i <= 800; ++i) x.push_back(i * 0.01f);  // the curved part, densely
  for (float far : {-30.0f, -12.0f, 12.0f, 30.0f, 0.0f, -0.0f, 1e-20f, -1e-20f}) x.push_back(far);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int i = 0; i < 1000; ++i) x.push_back(normal(rng));
  return x;
}

TEST_CASE("gelu_tanh and its derivative match the CPU backend") {
  const auto x = test_points();
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> y(n), dx(n, 0.25f);
  const std::vector<float> dy(n, 1.0f);
  cpu::gelu_forward(y.data(), x.data(), n);
  cpu::gelu_backward(dx.data(), x.data(), dy.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    INFO("x = " << x[i]);
    // 1e-6 absolute plus 1e-6 relative: a few ulps from the two tanh implementations.
    CHECK(std::abs(gelu_tanh(x[i]) - y[i]) <= 1e-6f + 1e-6f * std::abs(y[i]));
    // The derivative gets 1e-5 absolute: for x near -5, 1 + tanh(...) is a few float ulps
    // of 1, and the two tanh implementations differ by about one of those.
    const float want = dx[i] - 0.25f;
    CHECK(std::abs(gelu_tanh_derivative(x[i]) - want) <= 1e-5f + 1e-6f * std::abs(want));
  }
}

TEST_CASE("gelu_tanh_derivative matches a central difference of gelu_tanh") {
  constexpr double h = 1e-3;
  for (float x : test_points()) {
    INFO("x = " << x);
    // Evaluated in double (the same formula) so only the O(h^2) truncation remains.
    auto gelu_double = [](double v) {
      return 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    };
    const double numeric = (gelu_double(x + h) - gelu_double(x - h)) / (2 * h);
    CHECK(std::abs(gelu_tanh_derivative(x) - numeric) < 1e-5);
    // The float function itself against the double formula.
    CHECK(std::abs(gelu_tanh(x) - gelu_double(x)) < 1e-6 + 1e-6 * std::abs(gelu_double(x)));
  }
}

TEST_CASE("gelu_tanh has the known limits") {
  CHECK(gelu_tanh(0.0f) == 0.0f);
  CHECK(gelu_tanh(30.0f) == 30.0f);
  CHECK(gelu_tanh(-30.0f) == doctest::Approx(0.0).epsilon(1e-6));
  CHECK(gelu_tanh_derivative(0.0f) == 0.5f);
  CHECK(gelu_tanh_derivative(30.0f) == 1.0f);
  CHECK(std::abs(gelu_tanh_derivative(-30.0f)) < 1e-6f);
}

}  // namespace
}  // namespace swarm::kernels
