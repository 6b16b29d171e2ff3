// baseline_routers: round robin, uniform random and least loaded, the policies that
// stochastic wiring is measured against.
//
// They ignore speed on purpose: a test or benchmark that swaps one in for
// StochasticWiringRouter shows what measuring throughput buys. Peer-set handling is
// the same as the stochastic router's (expired records are skipped, an error bans a
// peer until it re-announces with a later expiry), so only the choice differs.
//
//   swarm::RoundRobinRouter router;
//   router.set_peers({{"a", now + 300}, {"b", now + 300}}, now);
//   auto peer = router.choose(swarm::TaskKind::forward, 1, now);  // "a", then "b", ...
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "swarm/wiring/router.h"

namespace swarm {
namespace wiring {

// A stage's usable peers in announcement order, each with a count of tasks handed
// out and not yet reported, which survives re-announcements.
class PeerList {
 public:
  struct Peer {
    PeerId id;
    double expires_at = 0;
    int64_t outstanding = 0;
  };

  void update(const std::vector<PeerAnnouncement>& peers, double now);
  void ban(const PeerId& id);
  Peer* find(const PeerId& id);

  std::vector<Peer>& peers() { return peers_; }
  const std::vector<Peer>& peers() const { return peers_; }
  size_t size() const { return peers_.size(); }

 private:
  void reindex();

  std::vector<Peer> peers_;
  std::unordered_map<PeerId, size_t> index_;
  BanList bans_;
};

}  // namespace wiring

// Each usable peer in turn, whatever its speed.
class RoundRobinRouter {
 public:
  using router_concept = router_t;

  void set_peers(const std::vector<PeerAnnouncement>& peers, double now) { list_.update(peers, now); }
  std::optional<PeerId> choose(TaskKind kind, int64_t task_size, double now) {
    return choose(kind, task_size, now, {});
  }
  std::optional<PeerId> choose(TaskKind kind, int64_t task_size, double now,
                               const std::vector<PeerId>& exclude);
  void report(const PeerId& peer, TaskKind kind, int64_t task_size, Outcome outcome,
              double duration_seconds, double now) {
    if (outcome == Outcome::error) list_.ban(peer);
  }
  size_t usable_peers() const { return list_.size(); }

 private:
  wiring::PeerList list_;
  size_t cursor_ = 0;
};

// A uniformly random usable peer, drawn from a seeded splitmix64.
class UniformRandomRouter {
 public:
  using router_concept = router_t;

  explicit UniformRandomRouter(uint64_t seed = 0) : rng_(seed) {}

  void set_peers(const std::vector<PeerAnnouncement>& peers, double now) { list_.update(peers, now); }
  std::optional<PeerId> choose(TaskKind kind, int64_t task_size, double now) {
    return choose(kind, task_size, now, {});
  }
  std::optional<PeerId> choose(TaskKind kind, int64_t task_size, double now,
                               const std::vector<PeerId>& exclude);
  void report(const PeerId& peer, TaskKind kind, int64_t task_size, Outcome outcome,
              double duration_seconds, double now) {
    if (outcome == Outcome::error) list_.ban(peer);
  }
  size_t usable_peers() const { return list_.size(); }

 private:
  wiring::PeerList list_;
  wiring::SplitMix64 rng_;
};

// The usable peer with the fewest of this router's tasks outstanding (chosen and not
// yet reported); ties go to the first after the last one chosen, so equal peers rotate.
class LeastLoadedRouter {
 public:
  using router_concept = router_t;

  void set_peers(const std::vector<PeerAnnouncement>& peers, double now) { list_.update(peers, now); }
  std::optional<PeerId> choose(TaskKind kind, int64_t task_size, double now) {
    return choose(kind, task_size, now, {});
  }
  std::optional<PeerId> choose(TaskKind kind, int64_t task_size, double now,
                               const std::vector<PeerId>& exclude);
  void report(const PeerId& peer, TaskKind kind, int64_t task_size, Outcome outcome,
              double duration_seconds, double now);
  size_t usable_peers() const { return list_.size(); }

  // Tasks outstanding at `peer`; 0 for a peer that is not usable.
  int64_t outstanding(const PeerId& peer) const;

 private:
  wiring::PeerList list_;
  size_t cursor_ = 0;
};

}  // namespace swarm
