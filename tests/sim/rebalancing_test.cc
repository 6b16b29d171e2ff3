// Rebalancing in the simulated swarm: it refills a stage the schedule empties, and it
// keeps more of the throughput under churn than a swarm that never moves.
#include <doctest/doctest.h>

#include "tests/sim/sim_test_util.h"

namespace swarm::sim {
namespace {

using testing::run;

// swarm local --chaos kill-peer:1:25,kill-peer:1:30 on two stages of two peers.
Scenario emptied_stage(bool rebalance) {
  Scenario s;
  s.peers = 4;
  s.stages = 2;
  s.seconds = 400;
  s.schedule = *parse_schedule("kill:1:25,kill:1:30");
  s.rebalance = rebalance;
  return s;
}

TEST_CASE("with rebalancing a stage emptied by kills is refilled, and throughput comes back") {
  const testing::Run r = run(emptied_stage(true));
  CHECK(r.summary.kills == 2);
  REQUIRE(r.summary.moves >= 1);
  const auto moves = r.of_kind("move");
  CHECK(moves.at(0)["from_stage"] == 0);
  CHECK(moves.at(0)["to_stage"] == 1);
  CHECK(moves.at(0)["t"].get<double>() > 30);
  CHECK(r.summary.peers_per_stage[1] >= 1);
  CHECK(r.summary.peers_per_stage[0] >= 1);  // a stage is never emptied to fill another
  CHECK(r.summary.throughput_end > 0);
}

TEST_CASE("without rebalancing the emptied stage stays empty and microbatches are abandoned") {
  const testing::Run r = run(emptied_stage(false));
  CHECK(r.summary.kills == 2);
  CHECK(r.summary.moves == 0);
  CHECK(r.summary.peers_per_stage[1] == 0);
  CHECK(r.summary.throughput_end == 0);
  CHECK(r.summary.microbatches_abandoned > 0);
  CHECK(r.summary.microbatches_started ==
        r.summary.microbatches_completed + r.summary.microbatches_abandoned + r.summary.microbatches_in_flight);
}

Scenario churny(uint64_t seed, bool rebalance) {
  Scenario s;
  s.peers = 40;
  s.stages = 4;
  s.seconds = 1800;
  s.churn = 0.5;
  s.seed = seed;
  s.rebalance = rebalance;
  s.rebalance_config.period_seconds = 30;
  return s;
}

TEST_CASE("under churn, rebalancing keeps more of the oracle's throughput than standing still") {
  double with = 0, without = 0;
  for (uint64_t seed : {1, 2, 3}) {
    const Summary on = run(churny(seed, true)).summary;
    const Summary off = run(churny(seed, false)).summary;
    CHECK(on.departures == off.departures);  // the same churn: it draws from its own stream
    CHECK(on.moves > 0);
    with += on.efficiency;
    without += off.efficiency;
  }
  CHECK(with / 3 > without / 3 + 0.02);
}

}  // namespace
}  // namespace swarm::sim
