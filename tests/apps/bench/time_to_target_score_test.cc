// time_to_target_score: steps to a target between evaluations, the steady step
// time after a warm-up, and the target from several seeds of the baseline.
#include <vector>

#include <doctest/doctest.h>

#include "apps/bench/time_to_target_score.h"

namespace swarm::apps {
namespace {

const std::vector<LossPoint> kCurve = {{10, 4.0}, {20, 3.0}, {30, 2.5}, {40, 2.4}};

TEST_CASE("steps to a target interpolate between the evaluations around the crossing") {
  CHECK(*steps_to_target(kCurve, 3.0) == doctest::Approx(20));
  CHECK(*steps_to_target(kCurve, 2.75) == doctest::Approx(25));
  CHECK(*steps_to_target(kCurve, 4.5) == doctest::Approx(10));  // reached at the first evaluation
  CHECK(!steps_to_target(kCurve, 2.3));                         // never reached
  // A loss that rises again after the crossing does not move it.
  const std::vector<LossPoint> bumpy = {{10, 4.0}, {20, 2.9}, {30, 3.2}, {40, 2.0}};
  CHECK(*steps_to_target(bumpy, 3.0) == doctest::Approx(10 + 10 * (1.0 / 1.1)));
}

TEST_CASE("the loss at a step, and the target as the mean over the baseline's seeds") {
  CHECK(*loss_at(kCurve, 25) == doctest::Approx(2.75));
  CHECK(*loss_at(kCurve, 40) == doctest::Approx(2.4));
  CHECK(!loss_at(kCurve, 5));
  CHECK(!loss_at(kCurve, 41));
  const std::vector<std::vector<LossPoint>> seeds = {kCurve, {{10, 5.0}, {20, 4.0}, {30, 3.5}}};
  CHECK(*mean_loss_at(seeds, 30) == doctest::Approx(3.0));
  CHECK(!mean_loss_at(seeds, 40));  // the second seed stopped at 30
}

TEST_CASE("the steady step time is the median interval after the warm-up") {
  // Warm-up steps end at 0 and 5 (slow); then 1 s steps with one 4 s straggler.
  const std::vector<double> ends = {0, 5, 6, 7, 11, 12, 13};
  CHECK(*steady_step_seconds(ends, 2) == doctest::Approx(1.0));
  CHECK(*steady_step_seconds(ends, 0) == doctest::Approx(1.0));
  CHECK(!steady_step_seconds(ends, 5));  // 1 interval left: not a steady rate
  // The mean counts the straggler: (13 - 5) / 6 after the first warm-up step.
  CHECK(*mean_step_seconds(ends, 1) == doctest::Approx(8.0 / 5.0));
  CHECK(*mean_step_seconds(ends, 2) == doctest::Approx(7.0 / 4.0));
  CHECK(!mean_step_seconds(ends, 5));
}

TEST_CASE("steps that come in bursts: a median far below the mean gives them away") {
  // A p2p timed run whose busy answers stalled some steps (seen in this code's
  // history): a 4.5 s stall, then three steps ending together.
  const std::vector<double> ends = {0, 1, 2, 3, 7.5, 7.503, 7.503, 7.503, 8.485, 9.689, 10.708, 11.23, 11.882};
  const double median = *steady_step_seconds(ends, 3), mean = *mean_step_seconds(ends, 3);
  CHECK(median < 0.7);
  CHECK(mean == doctest::Approx(0.986).epsilon(0.01));
  CHECK(steps_in_bursts(median, mean));
  CHECK(!steps_in_bursts(0.40, 0.42));  // a steady run
}

TEST_CASE("a spread over seeds: mean, min and max") {
  const std::vector<double> steps = {90, 100, 110};
  const Spread s = *spread_of(steps);
  CHECK(s.mean == doctest::Approx(100));
  CHECK(s.min == 90);
  CHECK(s.max == 110);
  CHECK(!spread_of(std::vector<double>{}));
}

}  // namespace
}  // namespace swarm::apps
