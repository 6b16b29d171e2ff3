// What every router does the same way, whatever its policy: peer-set changes, bans
// and exclusions.
#include <map>
#include <vector>

#include <doctest/doctest.h>

#include "swarm/wiring/baseline_routers.h"
#include "swarm/wiring/stochastic_wiring.h"

namespace swarm {
namespace {

std::vector<PeerAnnouncement> announce(const std::vector<PeerId>& ids, double expires_at = 300) {
  std::vector<PeerAnnouncement> out;
  for (const PeerId& id : ids) out.push_back({id, expires_at, 0});
  return out;
}

template <typename R>
std::map<PeerId, int> run(R& router, int n, double now, const std::vector<PeerId>& exclude = {}) {
  std::map<PeerId, int> count;
  for (int i = 0; i < n; ++i) {
    std::optional<PeerId> id = router.choose(TaskKind::forward, 1, now, exclude);
    REQUIRE(id.has_value());
    ++count[*id];
    router.report(*id, TaskKind::forward, 1, Outcome::success, 1.0, now);
  }
  return count;
}

#define ALL_ROUTERS StochasticWiringRouter, RoundRobinRouter, UniformRandomRouter, LeastLoadedRouter

TEST_CASE_TEMPLATE("an error bans until a later expiry is announced", R, ALL_ROUTERS) {
  R router;
  router.set_peers(announce({"a", "b"}, 300), 0);
  router.report("a", TaskKind::forward, 1, Outcome::error, 0.1, 1);
  CHECK(router.usable_peers() == 1);
  CHECK(run(router, 10, 1)["b"] == 10);

  router.set_peers(announce({"a", "b"}, 300), 2);
  CHECK(router.usable_peers() == 1);
  CHECK(run(router, 10, 2).count("a") == 0);

  router.set_peers(announce({"a", "b"}, 330), 30);
  CHECK(router.usable_peers() == 2);
  CHECK(run(router, 40, 30)["a"] >= 5);
}

TEST_CASE_TEMPLATE("a timeout does not ban", R, ALL_ROUTERS) {
  R router;
  router.set_peers(announce({"a", "b"}), 0);
  router.report("a", TaskKind::forward, 1, Outcome::timeout, 5.0, 5);
  CHECK(router.usable_peers() == 2);
  CHECK(run(router, 40, 5)["a"] >= 1);
}

TEST_CASE_TEMPLATE("the exclude list is respected", R, ALL_ROUTERS) {
  R router;
  router.set_peers(announce({"a", "b", "c"}), 0);
  auto count = run(router, 30, 0, {"a", "c"});
  CHECK(count["b"] == 30);
  CHECK(count.size() == 1);
  CHECK_FALSE(router.choose(TaskKind::forward, 1, 0, {"c", "b", "a"}).has_value());
  // 90, not 30: in Algorithm 1 the peers that were excluded catch up on b's 30 first.
  CHECK(run(router, 90, 0).size() == 3);
}

TEST_CASE_TEMPLATE("vanished and expired peers are not chosen; an empty stage gives nullopt", R,
                   ALL_ROUTERS) {
  R router;
  router.set_peers({{"a", 300, 0}, {"b", 300, 0}, {"old", 10, 0}}, 20);
  CHECK(router.usable_peers() == 2);
  router.set_peers(announce({"b"}), 21);
  CHECK(router.usable_peers() == 1);
  auto count = run(router, 10, 21);
  CHECK(count["b"] == 10);
  router.report("a", TaskKind::forward, 1, Outcome::error, 1.0, 22);  // late, about a gone peer
  CHECK(router.usable_peers() == 1);
  router.set_peers({}, 23);
  CHECK(router.usable_peers() == 0);
  CHECK_FALSE(router.choose(TaskKind::forward, 1, 23).has_value());
  CHECK_FALSE(router.choose(TaskKind::backward, 4, 23, {"b"}).has_value());
}

TEST_CASE_TEMPLATE("with every peer banned there is nothing to choose", R, ALL_ROUTERS) {
  R router;
  router.set_peers(announce({"a", "b"}), 0);
  router.report("a", TaskKind::forward, 1, Outcome::error, 1.0, 1);
  router.report("b", TaskKind::backward, 1, Outcome::error, 1.0, 1);
  CHECK(router.usable_peers() == 0);
  CHECK_FALSE(router.choose(TaskKind::forward, 1, 1).has_value());
}

}  // namespace
}  // namespace swarm
