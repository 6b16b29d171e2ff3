// The comparison policies: each does what its name says, and none follows speed.
#include "swarm/wiring/baseline_routers.h"

#include <map>
#include <vector>

#include <doctest/doctest.h>

#include "tests/wiring/two_speed_sim.h"

namespace swarm {
namespace {

std::vector<PeerAnnouncement> announce(const std::vector<PeerId>& ids, double expires_at = 300) {
  std::vector<PeerAnnouncement> out;
  for (const PeerId& id : ids) out.push_back({id, expires_at, 0});
  return out;
}

TEST_CASE("round robin visits peers in announcement order, skipping excluded ones") {
  RoundRobinRouter router;
  router.set_peers(announce({"a", "b", "c"}), 0);
  std::vector<PeerId> seen;
  for (int i = 0; i < 6; ++i) seen.push_back(*router.choose(TaskKind::forward, 1, 0));
  CHECK(seen == std::vector<PeerId>{"a", "b", "c", "a", "b", "c"});
  CHECK(*router.choose(TaskKind::forward, 1, 0, {"a"}) == "b");
  CHECK(*router.choose(TaskKind::forward, 1, 0, {"c"}) == "a");
}

TEST_CASE("uniform random is even, and the same seed repeats its draws") {
  UniformRandomRouter router(42);
  router.set_peers(announce({"a", "b", "c"}), 0);
  std::map<PeerId, int> count;
  for (int i = 0; i < 3000; ++i) ++count[*router.choose(TaskKind::forward, 1, 0)];
  for (const PeerId& id : {PeerId("a"), PeerId("b"), PeerId("c")}) {
    CHECK(count[id] == doctest::Approx(1000).epsilon(0.1));
  }

  auto draws = [](uint64_t seed) {
    UniformRandomRouter r(seed);
    r.set_peers(announce({"a", "b", "c", "d"}), 0);
    std::vector<PeerId> out;
    for (int i = 0; i < 32; ++i) out.push_back(*r.choose(TaskKind::forward, 1, 0, {"b"}));
    return out;
  };
  CHECK(draws(5) == draws(5));
  CHECK(draws(5) != draws(6));
  for (const PeerId& id : draws(5)) CHECK(id != "b");
}

TEST_CASE("least loaded picks the peer with the fewest tasks outstanding") {
  LeastLoadedRouter router;
  router.set_peers(announce({"a", "b", "c"}), 0);
  CHECK(*router.choose(TaskKind::forward, 1, 0) == "a");
  CHECK(*router.choose(TaskKind::forward, 1, 0) == "b");
  CHECK(*router.choose(TaskKind::forward, 1, 0) == "c");
  CHECK(router.outstanding("a") == 1);
  router.report("b", TaskKind::forward, 1, Outcome::success, 1.0, 1);
  router.report("b", TaskKind::forward, 1, Outcome::success, 1.0, 1);  // extra: floors at 0
  CHECK(router.outstanding("b") == 0);
  CHECK(*router.choose(TaskKind::forward, 1, 1) == "b");
  CHECK(*router.choose(TaskKind::forward, 1, 1) == "c");  // all at 1: rotates on from b
  CHECK(router.outstanding("c") == 2);
  // Outstanding counts survive a re-announcement.
  router.set_peers(announce({"a", "b", "c"}, 400), 2);
  CHECK(router.outstanding("c") == 2);
  CHECK(router.outstanding("a") == 1);
}

TEST_CASE("round robin, random and least loaded ignore a 2x speed difference") {
  const std::vector<testing::SimPeer> peers = {{"fast", 1.0}, {"slow", 2.0}};
  RoundRobinRouter round_robin;
  CHECK(testing::simulate_stage(round_robin, peers, 600, 4)["fast"] == 300);
  UniformRandomRouter random(3);
  CHECK(testing::simulate_stage(random, peers, 600, 4)["fast"] / 600.0 ==
        doctest::Approx(0.5).epsilon(0.1).scale(0));
}

}  // namespace
}  // namespace swarm
