// The rebalancing policy (DESIGN §5.4) on hand-built registry views, with `now` as a
// plain double: the elected mover, the confirmation rule, jitter, and small simulated
// swarms that apply each decided move and must settle without oscillating.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "swarm/rebalance/rebalancer.h"

namespace swarm::rebalance {
namespace {

constexpr int64_t kMaxQueue = std::numeric_limits<int64_t>::max();

PeerLoad peer(std::string id, int stage, double throughput, int64_t queue = 0) {
  return PeerLoad{std::move(id), stage, throughput, queue};
}

std::string numbered(std::string prefix, int n) {
  prefix.append(std::to_string(n));
  return prefix;
}

RebalanceConfig config_with_period(double period) {
  RebalanceConfig config;
  config.period_seconds = period;
  return config;
}

// Stage 0 has three peers of 10 samples/s, stage 1 one: stage 1 starves the pipeline.
std::vector<PeerLoad> lopsided_view() {
  return {peer("p1", 0, 10), peer("p2", 0, 10), peer("p3", 0, 10), peer("q1", 1, 10)};
}

// Each peer runs its own Rebalancer on the shared view; the earliest due check goes
// first, and a decided move is applied to the view at once.
struct SimulatedSwarm {
  std::vector<PeerLoad> view;
  std::vector<Rebalancer> policies;
  int num_stages = 0;
  std::vector<double> move_times;
  std::map<std::string, std::vector<int>> stages_visited;  // per peer, in order

  SimulatedSwarm(std::vector<PeerLoad> peers, int stages, const RebalanceConfig& config, uint64_t seed)
      : view(std::move(peers)), num_stages(stages) {
    for (const PeerLoad& p : view) {
      policies.emplace_back(config, p.peer_id, seed, /*now=*/0);
      stages_visited[p.peer_id].push_back(p.stage);
    }
  }

  void run_until(double end) {
    for (;;) {
      size_t due = 0;
      for (size_t i = 1; i < policies.size(); ++i) {
        if (policies[i].next_check_at() < policies[due].next_check_at()) due = i;
      }
      const double now = policies[due].next_check_at();
      if (now > end) return;
      const Decision d = policies[due].check(view, num_stages, now);
      if (!d.move) continue;
      REQUIRE(d.plan);
      REQUIRE(d.plan->peer_id == view[due].peer_id);
      CHECK((d.plan->pipeline_after > d.plan->pipeline_before || d.plan->pipeline_before == 0));
      view[due].stage = d.to_stage;
      stages_visited[view[due].peer_id].push_back(d.to_stage);
      policies[due].reset(now);
      move_times.push_back(now);
    }
  }

  double pipeline() const { return pipeline_throughput(stage_loads(view, num_stages)); }
};

TEST_CASE("the elected mover moves on its second consecutive check, and no one else moves") {
  const RebalanceConfig config = config_with_period(300);
  const auto view = lopsided_view();
  const auto plan = plan_move(config, view, 2);
  REQUIRE(plan);
  CHECK(plan->peer_id == "p1");
  CHECK(plan->from_stage == 0);
  CHECK(plan->to_stage == 1);
  CHECK(plan->pipeline_before == doctest::Approx(10));
  CHECK(plan->pipeline_after == doctest::Approx(20));

  Rebalancer mover(config, "p1", 7, /*now=*/0);
  const Decision first = mover.check(view, 2, mover.next_check_at());
  CHECK_FALSE(first.move);
  CHECK(first.confirmations == 1);
  REQUIRE(first.plan);
  CHECK(first.plan->peer_id == "p1");
  const Decision second = mover.check(view, 2, mover.next_check_at());
  CHECK(second.move);
  CHECK(second.to_stage == 1);
  CHECK(second.confirmations == 2);
  // Until the view shows the move, the same plan starts counting again instead of
  // deciding a second move on the next check.
  const Decision stale = mover.check(view, 2, mover.next_check_at());
  CHECK_FALSE(stale.move);
  CHECK(stale.confirmations == 1);

  for (const std::string id : {"p2", "p3", "q1"}) {
    Rebalancer other(config, id, 7, /*now=*/0);
    for (int i = 1; i <= 6; ++i) {
      const Decision d = other.check(view, 2, other.next_check_at());
      CHECK_FALSE(d.move);
      CHECK(d.to_stage == -1);
      CHECK(d.confirmations == i);
    }
  }
}

TEST_CASE("confirmations count moves between the same stages; the mover is elected at the confirming check") {
  const RebalanceConfig config = config_with_period(300);
  const auto view = lopsided_view();
  auto other_view = view;
  other_view[1].throughput = 5;  // p2 is clearly the slowest of stage 0 now
  Rebalancer p1(config, "p1", 3, 0);
  Rebalancer p2(config, "p2", 3, 0);
  CHECK(p1.check(view, 2, p1.next_check_at()).confirmations == 1);
  CHECK(p2.check(view, 2, p2.next_check_at()).confirmations == 1);
  // The second view still calls for a move from 0 to 1: a second confirmation, for p2.
  const Decision p1_second = p1.check(other_view, 2, p1.next_check_at());
  REQUIRE(p1_second.plan);
  CHECK(p1_second.plan->peer_id == "p2");
  CHECK(p1_second.confirmations == 2);
  CHECK_FALSE(p1_second.move);
  const Decision p2_second = p2.check(other_view, 2, p2.next_check_at());
  CHECK(p2_second.move);
  CHECK(p2_second.to_stage == 1);
}

TEST_CASE("a check that plans no move, or a move between other stages, restarts the confirmations") {
  const RebalanceConfig config = config_with_period(300);
  Rebalancer p1(config, "p1", 3, 0);
  CHECK(p1.check(lopsided_view(), 2, p1.next_check_at()).confirmations == 1);
  const std::vector<PeerLoad> balanced = {peer("p1", 0, 10), peer("p2", 0, 10), peer("q1", 1, 10), peer("q2", 1, 10)};
  CHECK_FALSE(p1.check(balanced, 2, p1.next_check_at()).plan);
  CHECK(p1.check(lopsided_view(), 2, p1.next_check_at()).confirmations == 1);
  // Stage 1 now holds the spare peers: a move from 1 to 0 starts its own count.
  const std::vector<PeerLoad> reversed = {peer("p1", 0, 10), peer("q1", 1, 10), peer("q2", 1, 10), peer("q3", 1, 10)};
  const Decision other = p1.check(reversed, 2, p1.next_check_at());
  REQUIRE(other.plan);
  CHECK(other.plan->from_stage == 1);
  CHECK(other.confirmations == 1);
}

TEST_CASE("measured noise among equal peers does not change the elected mover") {
  RebalanceConfig config = config_with_period(300);
  // Within 10% of the slowest: tied, so the lowest id moves whichever is a little slower.
  const std::vector<PeerLoad> noisy = {peer("p1", 0, 10.4), peer("p2", 0, 9.8), peer("p3", 0, 10.1), peer("q1", 1, 10)};
  auto plan = plan_move(config, noisy, 2);
  REQUIRE(plan);
  CHECK(plan->peer_id == "p1");
  // Beyond the tolerance the truly slowest moves.
  config.mover_tie_tolerance = 0.01;
  plan = plan_move(config, noisy, 2);
  REQUIRE(plan);
  CHECK(plan->peer_id == "p2");
  config.mover_tie_tolerance = -1;
  CHECK_FALSE(config.validate().is_ok());
}

TEST_CASE("reset forgets the confirmations") {
  const RebalanceConfig config = config_with_period(300);
  Rebalancer mover(config, "p1", 3, 0);
  CHECK(mover.check(lopsided_view(), 2, mover.next_check_at()).confirmations == 1);
  mover.reset(1000);
  CHECK(mover.next_check_at() >= 1000 + 300 * 0.8);
  const Decision d = mover.check(lopsided_view(), 2, mover.next_check_at());
  CHECK_FALSE(d.move);
  CHECK(d.confirmations == 1);
}

void check_never_plans(const std::vector<PeerLoad>& view, int num_stages) {
  const RebalanceConfig config = config_with_period(60);
  CHECK_FALSE(plan_move(config, view, num_stages));
  for (const PeerLoad& p : view) {
    Rebalancer policy(config, p.peer_id, 11, 0);
    for (int period = 0; period < 10; ++period) {
      const Decision d = policy.check(view, num_stages, policy.next_check_at());
      CHECK_FALSE(d.plan);
      CHECK_FALSE(d.move);
      CHECK(d.confirmations == 0);
    }
  }
}

TEST_CASE("a balanced swarm never plans a move") {
  check_never_plans({peer("a", 0, 10), peer("b", 0, 10), peer("c", 1, 10), peer("d", 1, 10)}, 2);
  std::vector<PeerLoad> four_by_three;
  for (int stage = 0; stage < 4; ++stage) {
    for (int k = 0; k < 3; ++k) four_by_three.push_back(peer(numbered("s", stage) + numbered("p", k), stage, 7.5));
  }
  check_never_plans(four_by_three, 4);
}

TEST_CASE("two near-equal heterogeneous stages do not trade a peer") {
  // Moving the 10 from stage 0 leaves it 11 < 20, so the pipeline would get slower.
  const std::vector<PeerLoad> view = {peer("a", 0, 10), peer("b", 0, 11), peer("c", 1, 10), peer("d", 1, 10)};
  check_never_plans(view, 2);
  RebalanceConfig no_margin = config_with_period(60);
  no_margin.min_gain = 0;
  CHECK_FALSE(plan_move(no_margin, view, 2));
}

TEST_CASE("a simulated heterogeneous swarm settles after a bounded number of moves") {
  std::vector<PeerLoad> view;
  const double stage0[] = {5, 7, 9, 11, 13, 15, 17};
  for (int k = 0; k < 7; ++k) view.push_back(peer(numbered("a", k), 0, stage0[k]));
  view.push_back(peer("b0", 1, 6));
  view.push_back(peer("c0", 2, 8));
  view.push_back(peer("c1", 2, 12));
  const RebalanceConfig config = config_with_period(100);
  SimulatedSwarm swarm(view, 3, config, 5);
  CHECK(swarm.pipeline() == doctest::Approx(6));

  swarm.run_until(50 * config.period_seconds);
  // Totals go 77/6/20 -> ... -> 32/40/31: five moves, each raising the pipeline by 10% or more;
  // then moving stage 1's slowest peer to stage 2 would only raise it from 31 to 32.
  CHECK(swarm.move_times.size() == 5);
  REQUIRE_FALSE(swarm.move_times.empty());
  CHECK(swarm.move_times.back() < 25 * config.period_seconds);
  CHECK(swarm.pipeline() == doctest::Approx(31));
  for (const auto& [id, stages] : swarm.stages_visited) {
    const std::set<int> distinct(stages.begin(), stages.end());
    CHECK_MESSAGE(distinct.size() == stages.size(), id << " returned to a stage it had left");
  }
}

TEST_CASE("an empty stage is filled on the first check, but never by emptying another") {
  const RebalanceConfig config = config_with_period(300);
  const std::vector<PeerLoad> two_in_stage0 = {peer("a", 0, 10), peer("b", 0, 10)};
  const auto plan = plan_move(config, two_in_stage0, 2);
  REQUIRE(plan);
  CHECK(plan->pipeline_before == 0);
  CHECK(plan->pipeline_after == doctest::Approx(10));
  Rebalancer mover(config, "a", 1, 0);
  const Decision d = mover.check(two_in_stage0, 2, mover.next_check_at());
  CHECK(d.move);
  CHECK(d.to_stage == 1);
  CHECK(d.confirmations == 1);

  CHECK_FALSE(plan_move(config, {peer("a", 0, 10)}, 2));
  Rebalancer lone(config, "a", 1, 0);
  CHECK_FALSE(lone.check({peer("a", 0, 10)}, 2, lone.next_check_at()).move);

  const std::vector<PeerLoad> middle_empty = {peer("a", 0, 10), peer("b", 0, 12), peer("c", 2, 10)};
  const auto fill_middle = plan_move(config, middle_empty, 3);
  REQUIRE(fill_middle);
  CHECK(fill_middle->peer_id == "a");
  CHECK(fill_middle->from_stage == 0);
  CHECK(fill_middle->to_stage == 1);
  CHECK(fill_middle->pipeline_after == doctest::Approx(10));
}

TEST_CASE("empty stages fill one by one even while another stays empty") {
  SimulatedSwarm swarm({peer("a", 0, 10), peer("b", 0, 10), peer("c", 0, 10)}, 3, config_with_period(100), 9);
  const auto first = plan_move(config_with_period(100), swarm.view, 3);
  REQUIRE(first);
  CHECK(first->to_stage == 1);
  CHECK(first->pipeline_after == 0);  // stage 2 is still empty, yet the move is progress
  swarm.run_until(20 * 100);
  CHECK(swarm.move_times.size() == 2);
  CHECK(swarm.pipeline() == doctest::Approx(10));
}

TEST_CASE("one vacancy draws exactly one mover among peers checking at their own times") {
  SimulatedSwarm swarm(lopsided_view(), 2, config_with_period(300), /*seed=*/42);
  std::set<double> first_checks;
  for (const Rebalancer& r : swarm.policies) first_checks.insert(r.next_check_at());
  CHECK(first_checks.size() == swarm.policies.size());  // same seed, still different times

  swarm.run_until(3 * 300);
  REQUIRE(swarm.move_times.size() == 1);
  CHECK(swarm.view[0].stage == 1);  // p1, the lowest id among equals
  CHECK(swarm.view[1].stage == 0);
  CHECK(swarm.view[2].stage == 0);
  // The others keep checking the updated view and find nothing left to do.
  swarm.run_until(20 * 300);
  CHECK(swarm.move_times.size() == 1);
}

TEST_CASE("the slowest donor peer moves; equal throughputs go to the lowest id") {
  const RebalanceConfig config = config_with_period(300);
  const auto tied = plan_move(config, {peer("c", 0, 10), peer("a", 0, 10), peer("b", 0, 10), peer("z", 1, 5)}, 2);
  REQUIRE(tied);
  CHECK(tied->peer_id == "a");
  const auto slowest = plan_move(config, {peer("a", 0, 12), peer("b", 0, 9), peer("c", 0, 10), peer("z", 1, 5)}, 2);
  REQUIRE(slowest);
  CHECK(slowest->peer_id == "b");
}

TEST_CASE("an unmeasured peer is planned at the median of the measured ones") {
  // Measured: 30, 50, 10, 14 -> median 22, below y's 30, so the unmeasured x is the slowest.
  const std::vector<PeerLoad> view = {peer("x", 0, 0), peer("y", 0, 30), peer("z", 0, 50), peer("w", 1, 10),
                                      peer("v", 1, 14)};
  CHECK(planned_throughput(view[0], view) == doctest::Approx(22));
  const auto loads = stage_loads(view, 2);
  CHECK(loads[0].throughput == doctest::Approx(102));
  CHECK(loads[1].throughput == doctest::Approx(24));
  const auto plan = plan_move(config_with_period(300), view, 2);
  REQUIRE(plan);
  CHECK(plan->peer_id == "x");
  CHECK(plan->pipeline_before == doctest::Approx(24));
  CHECK(plan->pipeline_after == doctest::Approx(46));
}

TEST_CASE("planned throughput: own, else the median of the measured peers, else 1") {
  const std::vector<PeerLoad> odd = {peer("a", 0, 3), peer("b", 0, 0), peer("c", 1, 9), peer("d", 7, 5)};
  CHECK(planned_throughput(odd[0], odd) == 3);
  CHECK(planned_throughput(odd[1], odd) == 5);  // median of 3, 9, 5, the out-of-range peer included
  const std::vector<PeerLoad> even = {peer("a", 0, 4), peer("b", 0, 0), peer("c", 1, 10)};
  CHECK(planned_throughput(even[1], even) == doctest::Approx(7));
  const std::vector<PeerLoad> none = {peer("a", 0, 0), peer("b", 1, -3)};
  CHECK(planned_throughput(none[0], none) == 1.0);
  CHECK(planned_throughput(none[1], none) == 1.0);
  // Claims that are not a positive finite number count as unmeasured.
  const std::vector<PeerLoad> odd_claims = {peer("a", 0, std::nan("")), peer("b", 0, INFINITY), peer("c", 0, 8)};
  CHECK(planned_throughput(odd_claims[0], odd_claims) == 8);
  CHECK(planned_throughput(odd_claims[1], odd_claims) == 8);
}

TEST_CASE("stage loads cover every stage and ignore peers outside the range") {
  const std::vector<PeerLoad> view = {peer("a", 0, 2, 3), peer("b", -1, 100, 100), peer("c", 0, 4, 1),
                                      peer("d", 3, 100, 100), peer("e", 1, 5, 0)};
  const auto loads = stage_loads(view, 3);
  REQUIRE(loads.size() == 3);
  for (int s = 0; s < 3; ++s) CHECK(loads[static_cast<size_t>(s)].stage == s);
  CHECK(loads[0].peers == 2);
  CHECK(loads[0].throughput == doctest::Approx(6));
  CHECK(loads[0].queued == 4);
  CHECK(loads[1].peers == 1);
  CHECK(loads[1].queued == 0);
  CHECK(loads[2].peers == 0);
  CHECK(loads[2].throughput == 0);
  CHECK(stage_loads(view, 0).empty());
  CHECK(stage_loads(view, -2).empty());
}

TEST_CASE("queued work saturates instead of overflowing, and negative queues count as empty") {
  const auto loads = stage_loads({peer("a", 0, 1, kMaxQueue), peer("b", 0, 1, kMaxQueue - 1), peer("c", 0, 1, 7),
                                  peer("d", 1, 1, -5), peer("e", 1, 1, 3)},
                                 2);
  CHECK(loads[0].queued == kMaxQueue);
  CHECK(loads[1].queued == 3);
}

TEST_CASE("pipeline throughput is the slowest stage, and 0 with an empty stage") {
  CHECK(pipeline_throughput({}) == 0);
  CHECK(pipeline_throughput(stage_loads({peer("a", 0, 4), peer("b", 1, 3), peer("c", 2, 9)}, 3)) == 3);
  CHECK(pipeline_throughput(stage_loads({peer("a", 0, 4), peer("c", 2, 9)}, 3)) == 0);
}

TEST_CASE("validate refuses bad configs") {
  CHECK(RebalanceConfig{}.validate().is_ok());
  auto refused = [](auto change) {
    RebalanceConfig config;
    change(config);
    const Status status = config.validate();
    return !status.is_ok() && status.code() == StatusCode::invalid_argument;
  };
  CHECK(refused([](RebalanceConfig& c) { c.period_seconds = 0; }));
  CHECK(refused([](RebalanceConfig& c) { c.period_seconds = -5; }));
  CHECK(refused([](RebalanceConfig& c) { c.period_seconds = INFINITY; }));
  CHECK(refused([](RebalanceConfig& c) { c.period_seconds = std::nan(""); }));
  CHECK(refused([](RebalanceConfig& c) { c.jitter_fraction = -0.1; }));
  CHECK(refused([](RebalanceConfig& c) { c.jitter_fraction = 1; }));
  CHECK(refused([](RebalanceConfig& c) { c.jitter_fraction = std::nan(""); }));
  CHECK(refused([](RebalanceConfig& c) { c.min_gain = -0.01; }));
  CHECK(refused([](RebalanceConfig& c) { c.min_gain = INFINITY; }));
  CHECK(refused([](RebalanceConfig& c) { c.min_gain = std::nan(""); }));
  CHECK(refused([](RebalanceConfig& c) { c.confirmations = 0; }));
  CHECK_FALSE(refused([](RebalanceConfig& c) { c.jitter_fraction = 0; c.min_gain = 0; c.confirmations = 1; }));
}

std::vector<double> intervals(const std::string& id, uint64_t seed, const RebalanceConfig& config, int count) {
  Rebalancer policy(config, id, seed, /*now=*/0);
  std::vector<double> out = {policy.next_check_at()};
  double now = 0;
  for (int i = 1; i < count; ++i) {
    now += 1000;
    policy.reset(now);
    out.push_back(policy.next_check_at() - now);
  }
  return out;
}

TEST_CASE("check intervals are jittered within period x [1 - j, 1 + j], deterministically per id and seed") {
  RebalanceConfig config = config_with_period(100);
  config.jitter_fraction = 0.2;
  const auto a = intervals("peer-a", 7, config, 300);
  for (const double interval : a) {
    CHECK(interval >= 80);
    CHECK(interval < 120);
  }
  CHECK(*std::min_element(a.begin(), a.end()) < 85);  // the whole range is used
  CHECK(*std::max_element(a.begin(), a.end()) > 115);
  CHECK(intervals("peer-a", 7, config, 300) == a);
  CHECK(intervals("peer-b", 7, config, 300) != a);
  CHECK(intervals("peer-a", 8, config, 300) != a);

  Rebalancer policy(config, "peer-a", 7, 0);
  policy.check(lopsided_view(), 2, 500);
  CHECK(policy.next_check_at() >= 580);
  CHECK(policy.next_check_at() < 620);

  config.jitter_fraction = 0;
  for (const double interval : intervals("peer-a", 7, config, 10)) CHECK(interval == 100);
}

TEST_CASE("stage_most_needed: an empty stage first, else the weakest, ties to the lowest index") {
  CHECK(stage_most_needed({peer("a", 0, 10), peer("b", 2, 10)}, 3, 5) == 1);
  CHECK(stage_most_needed({peer("a", 2, 10)}, 3, 5) == 0);
  CHECK(stage_most_needed({peer("a", 0, 30), peer("b", 1, 10), peer("c", 2, 20)}, 3, 5) == 1);
  CHECK(stage_most_needed({peer("a", 0, 30), peer("b", 1, 10), peer("c", 2, 20)}, 3, 0) == 1);
  CHECK(stage_most_needed({peer("a", 0, 20), peer("b", 1, 10), peer("c", 2, 10)}, 3, 5) == 1);
  CHECK(stage_most_needed({peer("a", 0, 10), peer("b", 1, 10)}, 2, 5) == 0);
  CHECK(stage_most_needed({}, 2, 5) == 0);
  CHECK(stage_most_needed({peer("a", 0, 10)}, 0, 5) == -1);
}

TEST_CASE("on equal throughput the bottleneck is the stage with the most queued work per unit") {
  const auto queued_second = stage_loads({peer("a", 0, 10), peer("b", 0, 10), peer("c", 1, 10, 5), peer("d", 1, 10, 5)}, 2);
  CHECK(bottleneck_stage(queued_second) == 1);
  const auto no_queues = stage_loads({peer("a", 0, 10), peer("b", 0, 10), peer("c", 1, 10), peer("d", 1, 10)}, 2);
  CHECK(bottleneck_stage(no_queues) == 0);
  // 0.1 + 0.2 exceeds 0.3 by one ulp: still a tie, so the queue decides.
  const auto rounding = stage_loads({peer("a", 0, 0.3), peer("b", 1, 0.1, 4), peer("c", 1, 0.2, 4)}, 2);
  REQUIRE(rounding[1].throughput > rounding[0].throughput);
  CHECK(bottleneck_stage(rounding) == 1);
  // A clearly slower stage wins whatever the queues, and an empty stage beats both.
  CHECK(bottleneck_stage(stage_loads({peer("a", 0, 9), peer("b", 1, 10, 1000)}, 2)) == 0);
  CHECK(bottleneck_stage(stage_loads({peer("a", 0, 9, 1000), peer("b", 1, 10, 1000)}, 3)) == 2);
  CHECK(bottleneck_stage({}) == -1);
}

TEST_CASE("plan_move needs two stages, a donor and the configured gain") {
  const auto view = lopsided_view();
  CHECK_FALSE(plan_move(config_with_period(300), view, 1));
  CHECK_FALSE(plan_move(config_with_period(300), view, 0));
  RebalanceConfig demanding = config_with_period(300);
  demanding.min_gain = 1.5;  // 10 -> 20 is only +100%
  CHECK_FALSE(plan_move(demanding, view, 2));
  demanding.min_gain = 1.0;
  CHECK(plan_move(demanding, view, 2));
}

// Under load a peer's fresh measurement of itself strays from the record it
// published: p2 measures 8 samples/s where its record (and everyone else's view)
// says 10, and p1 measures 10.5. Each planning with its own number in place of its
// record, p2 found itself the slowest and p1 won the tie on its id: both moved
// (rebalancing_test under CI: "moving mv-a" at mv-a and "moving mv-b" at mv-b).
TEST_CASE("peers whose measurements of themselves differ from their records elect one mover") {
  const std::vector<PeerLoad> announced = lopsided_view();
  const RebalanceConfig config;
  std::set<std::string> movers;
  for (const PeerLoad& self : {peer("p1", 0, 10.5), peer("p2", 0, 8), peer("p3", 0, 10), peer("q1", 1, 9)}) {
    const auto plan = plan_move(config, planning_view(announced, self), 2);
    REQUIRE(plan);
    movers.insert(plan->peer_id);
  }
  CHECK(movers == std::set<std::string>{"p1"});
}

TEST_CASE("a peer's own load stands in where the registry misses it or shows it at another stage") {
  const std::vector<PeerLoad> announced = lopsided_view();
  const std::vector<PeerLoad> missing = planning_view(announced, peer("p4", 1, 7));
  REQUIRE(missing.size() == 5);
  CHECK(missing.back().peer_id == "p4");
  CHECK(missing.back().throughput == 7);
  // p3 just moved to stage 1: its record still says stage 0.
  const std::vector<PeerLoad> moved = planning_view(announced, peer("p3", 1, 0));
  REQUIRE(moved.size() == 4);
  CHECK(std::count_if(moved.begin(), moved.end(), [](const PeerLoad& p) { return p.peer_id == "p3"; }) == 1);
  CHECK(moved.back().stage == 1);
  // Where its record stands at its stage, the record counts, not its own number.
  const std::vector<PeerLoad> recorded = planning_view(announced, peer("p2", 0, 3));
  CHECK(recorded.size() == 4);
  CHECK(std::all_of(recorded.begin(), recorded.end(), [](const PeerLoad& p) { return p.throughput == 10; }));
}

}  // namespace
}  // namespace swarm::rebalance
