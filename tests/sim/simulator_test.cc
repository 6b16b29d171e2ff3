// The simulator: byte-identical replays, a complete microbatch ledger, global steps, and
// the bounds it reports.
#include "swarm/sim/simulator.h"

#include <doctest/doctest.h>

#include "tests/sim/sim_test_util.h"

namespace swarm::sim {
namespace {

using testing::run;
using testing::small_churny_scenario;

TEST_CASE("the same seed gives the same bytes; another seed gives others") {
  const std::string first = run(small_churny_scenario(7)).lines;
  const std::string again = run(small_churny_scenario(7)).lines;
  const std::string other = run(small_churny_scenario(8)).lines;
  CHECK(first.size() > 1000);
  CHECK(first == again);
  CHECK(first != other);
}

TEST_CASE("every microbatch started is completed, abandoned or still in flight") {
  for (uint64_t seed : {1, 2, 3}) {
    const testing::Run r = run(small_churny_scenario(seed));
    const Summary& s = r.summary;
    CHECK(s.microbatches_completed > 0);
    CHECK(s.microbatches_in_flight >= 0);
    CHECK(s.microbatches_started == s.microbatches_completed + s.microbatches_abandoned + s.microbatches_in_flight);
    // Trainers keep their windows full: what is in flight at the end is every window.
    const Scenario resolved = *small_churny_scenario(seed).resolved();
    CHECK(s.microbatches_in_flight == int64_t{resolved.trainers} * resolved.in_flight);
    const nlohmann::json summary = r.of_kind("summary").at(0);
    CHECK(summary["started"] == s.microbatches_started);
    CHECK(summary["completed"].get<int64_t>() + summary["abandoned"].get<int64_t>() +
              summary["in_flight_at_end"].get<int64_t>() ==
          summary["started"].get<int64_t>());
  }
}

TEST_CASE("the churn that was asked for happens, and every event is in the output") {
  const testing::Run r = run(small_churny_scenario(5));
  const Summary& s = r.summary;
  CHECK(s.departures > 0);
  CHECK(s.preemptions > 0);
  CHECK(s.kills == 1);
  CHECK(s.joins >= 1 + s.preemptions / 2);  // scheduled join, Poisson joins, rejoins that came back
  CHECK(r.of_kind("leave").size() == static_cast<size_t>(s.departures + s.kills + s.preemptions));
  CHECK(r.of_kind("join").size() == static_cast<size_t>(s.joins));
  CHECK(r.of_kind("move").size() == static_cast<size_t>(s.moves));
  for (const auto& move : r.of_kind("move")) CHECK(move["from_stage"] != move["to_stage"]);
}

TEST_CASE("stages take global steps when their batch is done, and no more samples than were accepted") {
  Scenario s;
  s.peers = 8;
  s.stages = 2;
  s.seconds = 300;
  s.global_batch.target_samples = 64;
  const testing::Run r = run(s);
  const Scenario resolved = *s.resolved();
  // Samples each stage can have accepted: every microbatch that ever ran past it.
  const int64_t ran = r.summary.microbatches_started * resolved.microbatch;
  int64_t steps = 0;
  for (int64_t st : r.summary.global_steps) {
    CHECK(st >= r.summary.microbatches_completed * resolved.microbatch / 64 / 2);
    steps += st;
  }
  CHECK(steps * 64 <= r.summary.stepped_samples);
  CHECK(r.summary.stepped_samples <= resolved.stages * ran);
  // The time series records the steps as they happen: non-decreasing.
  int64_t previous = 0;
  for (const auto& sample : r.of_kind("sample")) {
    const int64_t now = sample["global_steps"][0].get<int64_t>();
    CHECK(now >= previous);
    previous = now;
  }
}

TEST_CASE("the oracle never reads below the swarm's own assignment, and efficiency is the mean ratio") {
  const testing::Run r = run(small_churny_scenario(3));
  double ratio_sum = 0;
  int windows = 0;
  for (const auto& sample : r.of_kind("sample")) {
    const double oracle = sample["oracle"].get<double>();
    CHECK(oracle >= sample["assignment"].get<double>() - 1e-6);
    if (oracle > 0) {
      ratio_sum += sample["throughput"].get<double>() / oracle;
      ++windows;
    }
  }
  REQUIRE(windows > 0);
  CHECK(r.summary.windows == static_cast<int>(r.of_kind("sample").size()));
  CHECK(r.summary.efficiency == doctest::Approx(ratio_sum / windows).epsilon(1e-4).scale(0));
  CHECK(r.summary.efficiency > 0.3);
  CHECK(r.summary.efficiency < 1.1);
}

TEST_CASE("a steady homogeneous swarm reaches its compute bound") {
  Scenario s;
  s.peers = 40;
  s.stages = 4;
  s.seconds = 1200;
  s.peers_per_stage = {11, 11, 10, 8};  // 100 / 3.5 = 28.6 samples/s, the best any split gets
  s.rebalance = false;
  const testing::Run r = run(s);
  CHECK(r.summary.assignment_mean == doctest::Approx(100 / 3.5));
  CHECK(r.summary.oracle_mean == doctest::Approx(100 / 3.5));
  CHECK(r.summary.throughput_end >= 0.9 * r.summary.assignment_mean);
  CHECK(r.summary.efficiency >= 0.85);
}

}  // namespace
}  // namespace swarm::sim
