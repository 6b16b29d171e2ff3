// Which types model the Router concept, and which do not.
#include <doctest/doctest.h>

#include "swarm/api/router.h"
#include "swarm/wiring/baseline_routers.h"
#include "swarm/wiring/stochastic_wiring.h"

namespace swarm {
namespace {

// Every operation a router needs, but no opt-in tag: not a router.
struct LooksLikeARouter {
  void set_peers(const std::vector<PeerAnnouncement>&, double) {}
  std::optional<PeerId> choose(TaskKind, int64_t, double) { return std::nullopt; }
  std::optional<PeerId> choose(TaskKind, int64_t, double, const std::vector<PeerId>&) {
    return std::nullopt;
  }
  void report(const PeerId&, TaskKind, int64_t, Outcome, double, double) {}
  size_t usable_peers() const { return 0; }
};

// Opted in, but cannot skip the peers a retry already tried.
struct TaggedWithoutExclude {
  using router_concept = router_t;
  void set_peers(const std::vector<PeerAnnouncement>&, double) {}
  std::optional<PeerId> choose(TaskKind, int64_t, double) { return std::nullopt; }
  void report(const PeerId&, TaskKind, int64_t, Outcome, double, double) {}
  size_t usable_peers() const { return 0; }
};

struct WrongTag : LooksLikeARouter {
  using router_concept = void;
};

// Opted in, but always picks a peer: a router must be able to say "none usable".
struct TaggedChoiceWithoutNone : LooksLikeARouter {
  using router_concept = router_t;
  PeerId choose(TaskKind, int64_t, double) { return {}; }
  PeerId choose(TaskKind, int64_t, double, const std::vector<PeerId>&) { return {}; }
};

struct Tagged : LooksLikeARouter {
  using router_concept = router_t;
};

static_assert(Router<StochasticWiringRouter>);
static_assert(Router<RoundRobinRouter>);
static_assert(Router<UniformRandomRouter>);
static_assert(Router<LeastLoadedRouter>);
static_assert(Router<Tagged>);
static_assert(!Router<LooksLikeARouter>);
static_assert(!Router<WrongTag>);
static_assert(!Router<TaggedWithoutExclude>);
static_assert(!Router<TaggedChoiceWithoutNone>);
static_assert(!Router<int>);

TEST_CASE_TEMPLATE("a fresh router has no usable peer and chooses none", R, StochasticWiringRouter,
                   RoundRobinRouter, UniformRandomRouter, LeastLoadedRouter) {
  R router;
  CHECK(router.usable_peers() == 0);
  CHECK_FALSE(router.choose(TaskKind::forward, 1, 0.0).has_value());
  CHECK_FALSE(router.choose(TaskKind::backward, 1, 0.0, {"a"}).has_value());
}

}  // namespace
}  // namespace swarm
