// centered_clip: honest contributions average as before; one bad member's moves the
// average by a bounded step, and is judged for what it is.
#include <cmath>
#include <random>
#include <vector>

#include <doctest/doctest.h>

#include "swarm/averaging/robust_mean.h"

namespace swarm {
namespace {

constexpr size_t kSize = 4096;

// A stage's gradient: a shared direction plus each member's noise, which shrinks
// as 1/sqrt(samples). `signal` sets how much of a member's gradient is the shared part.
struct Stage {
  std::vector<float> direction;
  std::mt19937 rng{11};

  explicit Stage() : direction(kSize) {
    std::normal_distribution<float> normal;
    for (float& x : direction) x = normal(rng) * 0.01f;
  }
  std::vector<float> member(double samples, double noise) {
    std::normal_distribution<float> normal;
    std::vector<float> x(kSize);
    for (size_t k = 0; k < kSize; ++k) {
      x[k] = direction[k] + static_cast<float>(noise / std::sqrt(samples)) * 0.01f * normal(rng);
    }
    return x;
  }
};

double distance(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t k = 0; k < a.size(); ++k) s += (double(a[k]) - b[k]) * (double(a[k]) - b[k]);
  return std::sqrt(s);
}

std::vector<float> scaled(std::vector<float> x, float by) {
  for (float& v : x) v *= by;
  return x;
}

RobustMean reduce(const std::vector<std::vector<float>>& xs, const std::vector<double>& w) {
  std::vector<Contribution> in;
  for (size_t i = 0; i < xs.size(); ++i) in.push_back({xs[i], w[i]});
  return centered_clip(in);
}

// In double, in member order, as the stage averaged before it clipped.
std::vector<float> plain_mean(const std::vector<std::vector<float>>& xs, const std::vector<double>& w) {
  std::vector<double> sum(kSize, 0.0);
  double total = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    total += w[i];
    for (size_t k = 0; k < kSize; ++k) sum[k] += w[i] * static_cast<double>(xs[i][k]);
  }
  std::vector<float> mean(kSize);
  for (size_t k = 0; k < kSize; ++k) mean[k] = static_cast<float>(sum[k] / total);
  return mean;
}

TEST_CASE("honest members are not clipped: the result is their weighted mean, and every one is judged near the rest") {
  Stage stage;
  const std::vector<double> w = {4, 8, 12, 4, 16};
  std::vector<std::vector<float>> xs;
  for (double s : w) xs.push_back(stage.member(s, 3.0));
  const RobustMean r = reduce(xs, w);
  const std::vector<float> mean = plain_mean(xs, w);
  CHECK(distance(r.mean, mean) <= 1e-6 * std::sqrt(kSize) * 0.01);
  for (const ContributionJudgement& j : r.judged) {
    CHECK(j.judged);
    CHECK(j.spread <= 1.0);
    CHECK(j.alignment > 0);
  }
}

TEST_CASE("fewer than three weighted members: the weighted mean, bit for bit, and nobody judged") {
  Stage stage;
  const std::vector<std::vector<float>> xs = {stage.member(4, 3), stage.member(8, 3), stage.member(8, 3)};
  const RobustMean r = reduce(xs, {4, 8, 0});
  const std::vector<float> mean = plain_mean({xs[0], xs[1]}, {4, 8});
  CHECK(r.mean == mean);
  for (const auto& j : r.judged) CHECK_FALSE(j.judged);
}

TEST_CASE("one member's gradient x100 or sign-flipped moves the average by no more than an honest member's noise") {
  for (const double signal_to_noise : {0.5, 3.0}) {
    for (const float attack : {100.0f, -1.0f, -100.0f}) {
      CAPTURE(signal_to_noise);
      CAPTURE(attack);
      Stage stage;
      const std::vector<double> w = {4, 4, 4};
      std::vector<std::vector<float>> honest;
      for (double s : w) honest.push_back(stage.member(s, 2.0 / signal_to_noise));
      const RobustMean clean = reduce(honest, w);
      std::vector<std::vector<float>> attacked = honest;
      attacked[2] = scaled(honest[2], attack);
      const RobustMean r = reduce(attacked, w);
      // An honest member's own distance from the clean average: the scale of the noise.
      const double noise = distance(honest[0], clean.mean);
      const double moved = distance(r.mean, clean.mean);
      const double plain_moved = distance(plain_mean(attacked, w), clean.mean);
      MESSAGE("moved " << moved / noise << " noise; a plain mean " << plain_moved / noise);
      // Its share (a third) of a radius (two median distances), and the third of its
      // honest gradient the clean average held: under two honest members' noise.
      CHECK(moved <= 2.0 * noise);
      if (attack == 100.0f) CHECK(plain_moved >= 20 * noise);
      CHECK(r.judged[0].spread <= 1.0);
      CHECK(r.judged[1].spread <= 1.0);
      if (std::abs(attack) == 100.0f) CHECK(r.judged[2].spread > 8.0);
      if (attack < 0 && signal_to_noise > 1) {
        CHECK(r.judged[2].alignment < 0);
        CHECK(r.judged[0].alignment > 0);
        CHECK(r.judged[1].alignment > 0);
      }
    }
  }
}

TEST_CASE("an honest member with few samples is not an outlier: its radius grows as its noise does") {
  Stage stage;
  const std::vector<double> w = {1, 16, 16};
  std::vector<std::vector<float>> xs;
  for (double s : w) xs.push_back(stage.member(s, 3.0));
  const RobustMean r = reduce(xs, w);
  CHECK(r.judged[0].spread <= 1.0);
  CHECK(distance(r.mean, plain_mean(xs, w)) <= 1e-6);
}

TEST_CASE("the same contributions give the same bits") {
  Stage stage;
  const std::vector<double> w = {4, 5, 6};
  std::vector<std::vector<float>> xs = {stage.member(4, 2), stage.member(5, 2), scaled(stage.member(6, 2), 50)};
  CHECK(reduce(xs, w).mean == reduce(xs, w).mean);
}

}  // namespace
}  // namespace swarm
