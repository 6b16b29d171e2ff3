// Algorithm 1: throughput-proportional shares, and how peers join, fail and leave.
#include "swarm/wiring/stochastic_wiring.h"

#include <map>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "swarm/wiring/baseline_routers.h"
#include "tests/wiring/two_speed_sim.h"

namespace swarm {
namespace {

std::vector<PeerAnnouncement> announce(const std::vector<PeerId>& ids, double expires_at = 300) {
  std::vector<PeerAnnouncement> out;
  for (const PeerId& id : ids) out.push_back({id, expires_at, 0});
  return out;
}

PeerId must_choose(StochasticWiringRouter& r, TaskKind kind = TaskKind::forward, double now = 0,
                   const std::vector<PeerId>& exclude = {}) {
  std::optional<PeerId> id = r.choose(kind, 1, now, exclude);
  REQUIRE(id.has_value());
  return *id;
}

// Choose `n` forwards of size 1, each reported as a success taking `seconds(peer)`.
template <typename Seconds>
std::map<PeerId, int> run(StochasticWiringRouter& r, int n, Seconds seconds) {
  std::map<PeerId, int> count;
  for (int i = 0; i < n; ++i) {
    PeerId id = must_choose(r);
    ++count[id];
    r.report(id, TaskKind::forward, 1, Outcome::success, seconds(id), 0);
  }
  return count;
}

TEST_CASE("a peer twice as fast serves two thirds of the tasks; round robin gives it half") {
  const std::vector<testing::SimPeer> peers = {{"fast", 1.0}, {"slow", 2.0}};
  StochasticWiringRouter stochastic;
  auto served = testing::simulate_stage(stochastic, peers, 600, 4);
  CHECK(served["fast"] + served["slow"] == 600);
  const double fast_share = served["fast"] / 600.0;
  CHECK(fast_share == doctest::Approx(2.0 / 3.0).epsilon(0.05).scale(0));
  CHECK(*stochastic.seconds_per_sample("fast") == doctest::Approx(1.0).scale(0));
  CHECK(*stochastic.seconds_per_sample("slow") == doctest::Approx(2.0).scale(0));

  // The same run under round robin lands far outside that band: the check can tell.
  RoundRobinRouter round_robin;
  auto rr_served = testing::simulate_stage(round_robin, peers, 600, 4);
  const double rr_fast_share = rr_served["fast"] / 600.0;
  CHECK(rr_fast_share == doctest::Approx(0.5).epsilon(0.02).scale(0));
  CHECK(rr_fast_share < 2.0 / 3.0 * 0.95);
}

TEST_CASE("three speeds get shares proportional to throughput") {
  StochasticWiringRouter router;
  auto served = testing::simulate_stage(router, {{"x1", 1.0}, {"x2", 2.0}, {"x4", 4.0}}, 700, 6);
  CHECK(served["x1"] / 700.0 == doctest::Approx(4.0 / 7.0).epsilon(0.05).scale(0));
  CHECK(served["x2"] / 700.0 == doctest::Approx(2.0 / 7.0).epsilon(0.08).scale(0));
  CHECK(served["x4"] / 700.0 == doctest::Approx(1.0 / 7.0).epsilon(0.15).scale(0));
}

TEST_CASE("the estimate is a bias-corrected EMA of seconds per sample, moved by successes") {
  StochasticWiringRouter router;
  router.set_peers(announce({"a"}), 0);
  CHECK(*router.seconds_per_sample("a") == 1.0);  // the default until measured

  router.report("a", TaskKind::forward, 1, Outcome::success, 3.0, 3);
  CHECK(*router.seconds_per_sample("a") == doctest::Approx(3.0));  // uncorrected would be 0.3

  // Backward of 2 samples costs 5 forward units: 10 s is 2 s per sample.
  router.report("a", TaskKind::backward, 2, Outcome::success, 10.0, 13);
  const double ema = 0.1 * 2.0 + 0.9 * (0.1 * 3.0);
  CHECK(*router.seconds_per_sample("a") == doctest::Approx(ema / (1 - 0.9 * 0.9)));

  // Zero-size tasks and nonsense durations say nothing about speed.
  const double before = *router.seconds_per_sample("a");
  router.report("a", TaskKind::forward, 0, Outcome::success, 50.0, 14);
  router.report("a", TaskKind::forward, 1, Outcome::success, -1.0, 14);
  CHECK(*router.seconds_per_sample("a") == before);
  CHECK_FALSE(router.seconds_per_sample("nobody").has_value());
}

TEST_CASE("after thousands of samples the estimate is the plain EMA (no denormal bias term left)") {
  StochasticWiringRouter router;
  router.set_peers(announce({"a"}), 0);
  // (1 - 0.1)^n reaches the denormal range near n = 6700; the router drops the
  // correction by then, and the estimate stays exactly the EMA of what it saw.
  for (int i = 0; i < 10000; ++i) router.report("a", TaskKind::forward, 1, Outcome::success, 0.25, i);
  CHECK(*router.seconds_per_sample("a") == doctest::Approx(0.25).scale(0));
  router.report("a", TaskKind::forward, 1, Outcome::success, 1.25, 10000);
  CHECK(*router.seconds_per_sample("a") == doctest::Approx(0.1 * 1.25 + 0.9 * 0.25).scale(0));
}

TEST_CASE("a backward costs 2.5 forward units of virtual time") {
  StochasticWiringRouter router;
  router.set_peers(announce({"a", "b"}), 0);
  const PeerId first = must_choose(router, TaskKind::backward);
  const PeerId other = first == "a" ? "b" : "a";
  // The other peer, at 0, takes forwards at 0, 1 and 2 before `first` (at 2.5) comes round.
  CHECK(must_choose(router) == other);
  CHECK(must_choose(router) == other);
  CHECK(must_choose(router) == other);
  CHECK(must_choose(router) == first);
  CHECK(*router.virtual_finish_time(first) == doctest::Approx(3.5));

  auto config = StochasticWiringConfig{};
  config.backward_cost = 1.0;
  auto even = *StochasticWiringRouter::create(config);
  even.set_peers(announce({"a", "b"}), 0);
  const PeerId even_first = must_choose(even, TaskKind::backward);
  CHECK(must_choose(even) != even_first);
  CHECK(must_choose(even) == even_first);
}

TEST_CASE("a new peer enters at the current minimum virtual time, not at zero") {
  StochasticWiringRouter router;
  router.set_peers(announce({"a", "b"}), 0);
  run(router, 100, [](const PeerId&) { return 1.0; });
  const double front = std::min(*router.virtual_finish_time("a"), *router.virtual_finish_time("b"));
  REQUIRE(front >= 49.0);

  router.set_peers(announce({"a", "b", "c"}), 1);
  CHECK(router.usable_peers() == 3);
  CHECK(*router.virtual_finish_time("c") == front);
  // Had it entered at 0 it would take the next ~50 tasks; level with the others it takes a third.
  auto next = run(router, 9, [](const PeerId&) { return 1.0; });
  CHECK(next["c"] >= 2);
  CHECK(next["c"] <= 4);
}

TEST_CASE("an error bans the peer until it re-announces with a later expiry") {
  StochasticWiringRouter router;
  router.set_peers(announce({"a", "b"}, 300), 0);
  router.report("a", TaskKind::forward, 1, Outcome::error, 0.1, 1);
  CHECK(router.usable_peers() == 1);
  for (int i = 0; i < 10; ++i) CHECK(must_choose(router) == "b");

  // The same record again is the same broken peer.
  router.set_peers(announce({"a", "b"}, 300), 2);
  CHECK(router.usable_peers() == 1);
  CHECK_FALSE(router.choose(TaskKind::forward, 1, 2, {"b"}).has_value());

  // A refreshed record lifts the ban; it re-enters level with b, not behind or ahead.
  router.set_peers(announce({"a", "b"}, 330), 30);
  CHECK(router.usable_peers() == 2);
  CHECK(*router.virtual_finish_time("a") == *router.virtual_finish_time("b"));
  auto next = run(router, 10, [](const PeerId&) { return 1.0; });
  CHECK(next["a"] == 5);
}

TEST_CASE("a ban outlives the peer vanishing from the registry and coming back unchanged") {
  StochasticWiringRouter router;
  router.set_peers(announce({"a", "b"}, 300), 0);
  router.report("a", TaskKind::forward, 1, Outcome::error, 0.1, 1);
  router.set_peers(announce({"b"}, 300), 2);
  router.set_peers(announce({"a", "b"}, 300), 3);
  CHECK(router.usable_peers() == 1);
  CHECK_FALSE(router.virtual_finish_time("a").has_value());
}

TEST_CASE("a timeout keeps its virtual-time advance and slows the estimate, but does not ban") {
  auto make = [](bool slows) {
    StochasticWiringConfig config;
    config.timeout_slows_estimate = slows;
    auto router = *StochasticWiringRouter::create(config);
    router.set_peers(announce({"a", "b"}), 0);
    run(router, 20, [](const PeerId&) { return 1.0; });
    return router;
  };
  StochasticWiringRouter router = make(true);
  const double a_before = *router.virtual_finish_time("a");
  router.report("a", TaskKind::forward, 1, Outcome::timeout, 10.0, 30);
  CHECK(router.usable_peers() == 2);
  CHECK(*router.virtual_finish_time("a") == a_before);  // no rollback of the time it was given
  CHECK(*router.seconds_per_sample("a") > 1.5);
  auto shares = run(router, 60, [](const PeerId& id) { return 1.0; });
  CHECK(shares["a"] >= 1);
  CHECK(shares["a"] < 27);  // a fair half would be 30

  StochasticWiringRouter unmoved = make(false);
  unmoved.report("a", TaskKind::forward, 1, Outcome::timeout, 10.0, 30);
  CHECK(*unmoved.seconds_per_sample("a") == doctest::Approx(1.0).scale(0));
  auto even = run(unmoved, 60, [](const PeerId&) { return 1.0; });
  CHECK(even["a"] == 30);
}

TEST_CASE("excluded peers are skipped and keep their place in the heap") {
  StochasticWiringRouter router;
  router.set_peers(announce({"a", "b", "c"}), 0);
  run(router, 30, [](const PeerId&) { return 1.0; });
  const PeerId next = [&] {
    StochasticWiringRouter copy = router;
    return must_choose(copy);
  }();
  std::vector<PeerId> others;
  for (const PeerId& id : {PeerId("a"), PeerId("b"), PeerId("c")}) {
    if (id != next) others.push_back(id);
  }
  const double next_key = *router.virtual_finish_time(next);
  CHECK(must_choose(router, TaskKind::forward, 0, {next}) != next);
  CHECK(*router.virtual_finish_time(next) == next_key);
  CHECK(must_choose(router) == next);  // still at the front once it is allowed again
  CHECK(must_choose(router, TaskKind::forward, 0, others) == next);
  CHECK_FALSE(router.choose(TaskKind::forward, 1, 0, {"a", "b", "c"}).has_value());
  CHECK(router.usable_peers() == 3);
}

TEST_CASE("a published queue length delays the peer by queue_length * estimate") {
  StochasticWiringRouter router;
  router.set_peers({{"idle", 300, 0}, {"busy", 300, 6}}, 0);
  CHECK(*router.virtual_finish_time("busy") == doctest::Approx(6.0));
  auto first = run(router, 6, [](const PeerId&) { return 1.0; });
  CHECK(first["idle"] == 6);

  // The next announcement replaces the penalty rather than adding to it.
  router.set_peers({{"idle", 330, 0}, {"busy", 330, 0}}, 30);
  CHECK(*router.virtual_finish_time("busy") == doctest::Approx(0.0));
  CHECK(must_choose(router) == "busy");

  StochasticWiringConfig config;
  config.use_queue_length = false;
  auto blind = *StochasticWiringRouter::create(config);
  blind.set_peers({{"idle", 300, 0}, {"busy", 300, 6}}, 0);
  auto blind_first = run(blind, 6, [](const PeerId&) { return 1.0; });
  CHECK(blind_first["busy"] == 3);
}

TEST_CASE("vanished peers are dropped, late reports about them are ignored, expired records unused") {
  StochasticWiringRouter router;
  router.set_peers(announce({"a", "b", "c"}), 0);
  router.set_peers(announce({"a", "c"}), 1);
  CHECK(router.usable_peers() == 2);
  router.report("b", TaskKind::forward, 1, Outcome::error, 1.0, 2);
  router.report("b", TaskKind::forward, 1, Outcome::success, 1.0, 2);
  auto count = run(router, 20, [](const PeerId&) { return 1.0; });
  CHECK(count.count("b") == 0);
  CHECK(count["a"] + count["c"] == 20);

  router.set_peers({{"a", 300, 0}, {"c", 50, 0}}, 60);  // c's record ran out at 50
  CHECK(router.usable_peers() == 1);
  for (int i = 0; i < 5; ++i) CHECK(must_choose(router) == "a");
  router.set_peers({}, 61);
  CHECK(router.usable_peers() == 0);
  CHECK_FALSE(router.choose(TaskKind::forward, 1, 61).has_value());

  // Refilled after emptying: the stage's virtual clock did not restart from zero.
  router.set_peers(announce({"d"}, 400), 62);
  CHECK(*router.virtual_finish_time("d") > 5.0);
}

TEST_CASE("churn with slot reuse and stale heap entries never returns a vanished peer") {
  StochasticWiringRouter router;
  for (int round = 0; round < 200; ++round) {
    std::vector<PeerAnnouncement> view;
    for (int p = 0; p < 10; ++p) {
      if ((p + round) % 3 == 0) continue;  // a different third is missing each round
      PeerId id = "p";
      id += std::to_string(p);
      view.push_back({id, 1e6, (round * 7 + p) % 5});
    }
    router.set_peers(view, round);
    CHECK(router.usable_peers() == view.size());
    for (int i = 0; i < 5; ++i) {
      PeerId id = must_choose(router);
      const int p = std::stoi(id.substr(1));
      CHECK((p + round) % 3 != 0);
      router.report(id, TaskKind::forward, 1, Outcome::success, 0.5 + p * 0.1, round);
    }
  }
}

std::vector<PeerId> history(uint64_t seed) {
  StochasticWiringConfig config;
  config.seed = seed;
  auto router = *StochasticWiringRouter::create(config);
  std::vector<PeerId> chosen;
  router.set_peers(announce({"a", "b", "c", "d", "e", "f", "g", "h"}), 0);
  for (int i = 0; i < 40; ++i) {
    PeerId id = must_choose(router, i % 3 == 0 ? TaskKind::backward : TaskKind::forward, i);
    chosen.push_back(id);
    const Outcome outcome = i == 17 ? Outcome::error : i % 7 == 0 ? Outcome::timeout : Outcome::success;
    router.report(id, TaskKind::forward, 1, outcome, 0.5 + (id[0] - 'a') * 0.25, i);
    if (i == 25) router.set_peers(announce({"a", "b", "c", "d", "e", "f", "g", "h", "i"}, 400), i);
  }
  return chosen;
}

TEST_CASE("same seed and history give the same choices; the seed breaks ties differently") {
  CHECK(history(7) == history(7));
  const auto one = history(1);
  const auto two = history(2);
  CHECK(std::vector<PeerId>(one.begin(), one.begin() + 8) !=
        std::vector<PeerId>(two.begin(), two.begin() + 8));
}

TEST_CASE("invalid configurations are rejected with invalid_argument") {
  for (auto bad : {
           StochasticWiringConfig{.ema_alpha = 0.0},
           StochasticWiringConfig{.ema_alpha = 1.5},
           StochasticWiringConfig{.backward_cost = -1.0},
           StochasticWiringConfig{.default_seconds_per_sample = 0.0},
       }) {
    auto router = StochasticWiringRouter::create(bad);
    CHECK_FALSE(router.is_ok());
    CHECK(router.status().code() == StatusCode::invalid_argument);
  }
  CHECK(StochasticWiringRouter::create(StochasticWiringConfig{.ema_alpha = 1.0}).is_ok());
}

}  // namespace
}  // namespace swarm
