// The per-row math the CUDA kernels share, checked on the CPU against direct
// double-precision formulas, including the chunk-merge orders a warp uses.
#include <cmath>
#include <random>
#include <vector>

#include <doctest/doctest.h>

#include "kernels/common/online_softmax.h"
#include "kernels/common/row_stats.h"

namespace swarm::kernels {
namespace {

std::vector<float> random_row(int n, float offset, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> row(n);
  for (float& x : row) x = offset + scale * normal(rng);
  return row;
}

TEST_CASE("Welford, added one by one or merged as 32 strided lanes, matches the two-pass statistics") {
  // A large offset is where sum-of-squares cancels; Welford must not.
  for (float offset : {0.0f, 1000.0f}) {
    const auto row = random_row(1000, offset, 2.0f, 7);
    double mean = 0, var = 0;
    for (float x : row) mean += x;
    mean /= row.size();
    for (float x : row) var += (x - mean) * (x - mean);
    var /= row.size();

    Welford sequential;
    for (float x : row) sequential.add(x);
    // A warp: lane l takes elements l, l + 32, ...; then a butterfly of merges.
    Welford lanes[32];
    for (size_t i = 0; i < row.size(); ++i) lanes[i % 32].add(row[i]);
    for (int width = 16; width >= 1; width /= 2) {
      for (int l = 0; l < width; ++l) lanes[l].merge(lanes[l + width]);
    }
    for (const Welford* w : {&sequential, &lanes[0]}) {
      CHECK(w->count == 1000.0f);
      CHECK(w->mean == doctest::Approx(mean).epsilon(1e-6));
      CHECK(w->variance() == doctest::Approx(var).epsilon(1e-4).scale(0));
      CHECK(w->rstd(1e-5f) == doctest::Approx(1.0 / std::sqrt(var + 1e-5)).epsilon(1e-4).scale(0));
    }
  }
}

TEST_CASE("Welford merges with empty partners are identities") {
  Welford a, empty;
  a.add(3.0f);
  a.add(5.0f);
  Welford b = a;
  b.merge(empty);
  CHECK(b.mean == a.mean);
  CHECK(b.m2 == a.m2);
  empty.merge(a);
  CHECK(empty.mean == 4.0f);
  CHECK(empty.variance() == 1.0f);
}

TEST_CASE("online softmax, element by element or merged from tiles, gives the row's log-sum-exp") {
  const auto row = random_row(777, 0.0f, 6.0f, 3);  // a wide range: rescaling really happens
  double max = -INFINITY;
  for (float x : row) max = std::max<double>(max, x);
  double sum = 0;
  for (float x : row) sum += std::exp(x - max);
  const double lse = max + std::log(sum);

  OnlineSoftmax sequential;
  for (float x : row) sequential.add(x);
  CHECK(sequential.max == static_cast<float>(max));
  CHECK(sequential.log_sum_exp() == doctest::Approx(lse).epsilon(1e-6));

  // Tiles of 64, each reduced alone, merged left to right: what a flash kernel does.
  OnlineSoftmax merged;
  for (size_t start = 0; start < row.size(); start += 64) {
    OnlineSoftmax tile;
    for (size_t i = start; i < std::min(row.size(), start + 64); ++i) tile.add(row[i]);
    merged.merge(tile);
  }
  CHECK(merged.log_sum_exp() == doctest::Approx(lse).epsilon(1e-6));

  // rescale() carries an output accumulated under an old max over to a new one.
  CHECK(OnlineSoftmax::rescale(2.0f, 3.0f) == doctest::Approx(std::exp(-1.0)).scale(0));
  CHECK(OnlineSoftmax::rescale(-INFINITY, 3.0f) == 0.0f);
}

TEST_CASE("a fully masked row (all -inf) stays empty instead of producing NaN") {
  OnlineSoftmax s;
  s.merge(OnlineSoftmax{});
  CHECK(s.max == -INFINITY);
  CHECK(s.sum == 0.0f);
}

TEST_CASE("masked (-inf) scores add nothing, before or after the first finite one") {
  OnlineSoftmax s;
  s.add(-INFINITY);
  CHECK(s.sum == 0.0f);
  s.add(1.0f);
  s.add(-INFINITY);
  s.add(1.0f);
  CHECK(s.max == 1.0f);
  CHECK(s.sum == 2.0f);
  CHECK(std::abs(s.log_sum_exp() - (1.0f + std::log(2.0f))) < 1e-6f);
}

}  // namespace
}  // namespace swarm::kernels
