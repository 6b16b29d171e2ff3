// router_set: one production router of the kind --router names, behind one type, so a
// trainer holds a router per stage whatever the kind.
#pragma once

#include <optional>
#include <variant>
#include <vector>

#include "swarm/sim/scenario.h"
#include "swarm/wiring/baseline_routers.h"
#include "swarm/wiring/stochastic_wiring.h"

namespace swarm::sim {

class AnyRouter {
 public:
  AnyRouter(RouterKind kind, uint64_t seed, double backward_cost) : router_(make(kind, seed, backward_cost)) {}

  void set_peers(const std::vector<PeerAnnouncement>& peers, double now) {
    std::visit([&](auto& r) { r.set_peers(peers, now); }, router_);
  }
  std::optional<PeerId> choose(TaskKind kind, int64_t size, double now, const std::vector<PeerId>& exclude) {
    return std::visit([&](auto& r) { return r.choose(kind, size, now, exclude); }, router_);
  }
  void report(const PeerId& peer, TaskKind kind, int64_t size, Outcome outcome, double duration, double now) {
    std::visit([&](auto& r) { r.report(peer, kind, size, outcome, duration, now); }, router_);
  }

 private:
  using Variant = std::variant<StochasticWiringRouter, RoundRobinRouter, UniformRandomRouter, LeastLoadedRouter>;

  static Variant make(RouterKind kind, uint64_t seed, double backward_cost) {
    switch (kind) {
      case RouterKind::stochastic: {
        // The production defaults (DESIGN §10); only the seed and the backward cost the
        // scenario models differ per run. Both are valid, so create() cannot fail.
        StochasticWiringConfig config;
        config.seed = seed;
        config.backward_cost = backward_cost;
        return std::move(StochasticWiringRouter::create(config).value());
      }
      case RouterKind::round_robin: return RoundRobinRouter{};
      case RouterKind::random: return UniformRandomRouter(seed);
      case RouterKind::least_loaded: return LeastLoadedRouter{};
    }
    return RoundRobinRouter{};
  }

  Variant router_;
};

}  // namespace swarm::sim
