// stochastic_wiring: Algorithm 1 of SWARM, the router that gives each peer of a stage
// a share of tasks proportional to its measured throughput.
//
// Per stage it keeps a min-heap of peers keyed by virtual finish time. choose() takes
// the peer that would finish first and pushes it back at that time plus the task's
// cost times the peer's estimated seconds per sample.
//
//   swarm::StochasticWiringRouter router;  // DESIGN §10 defaults
//   router.set_peers({{"a", now + 300}, {"b", now + 300}}, now);
//   auto peer = router.choose(swarm::TaskKind::forward, /*task_size=*/1, now);
//   router.report(*peer, swarm::TaskKind::forward, 1, swarm::Outcome::success, 0.8, now + 0.8);
//
// Faithful to the reference: the estimate is a bias-corrected EMA of seconds per
// sample updated on success; a backward costs backward_cost forward units; a new peer
// enters at the current minimum virtual time; an error bans the peer until it
// re-announces with a later expiry; a timeout keeps its virtual-time advance.
// Beyond the reference (each switchable in the config):
//  - a timeout also counts its duration as an observed seconds-per-sample sample, so a
//    peer that keeps timing out is given less, not just the same again;
//  - a peer's published queue length adds queue_length * estimate to its heap key, so
//    work other trainers already queued there delays it. The penalty is the one from
//    its last announcement and is replaced, not accumulated, by the next one;
//  - ties between equal keys break by a per-peer draw from `seed`, so trainers with
//    identical histories but different seeds do not all pick the same peer first.
// Virtual time is its own axis; `now` only prunes expired records and bans.
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "swarm/core/status.h"
#include "swarm/wiring/peer_index.h"
#include "swarm/wiring/router.h"

namespace swarm {

struct StochasticWiringConfig {
  double ema_alpha = 0.1;                   // DESIGN §10
  double backward_cost = 2.5;               // forward units per backward sample, DESIGN §10
  double default_seconds_per_sample = 1.0;  // a peer's estimate until its first sample
  bool timeout_slows_estimate = true;
  bool use_queue_length = true;
  uint64_t seed = 0;

  Status validate() const;
};

class StochasticWiringRouter {
 public:
  using router_concept = router_t;

  StochasticWiringRouter() : StochasticWiringRouter(StochasticWiringConfig{}, Unchecked{}) {}
  static Result<StochasticWiringRouter> create(const StochasticWiringConfig& config);

  void set_peers(const std::vector<PeerAnnouncement>& peers, double now);

  std::optional<PeerId> choose(TaskKind kind, int64_t task_size, double now) {
    return choose_impl(task_cost(kind, task_size), nullptr);
  }
  std::optional<PeerId> choose(TaskKind kind, int64_t task_size, double now,
                               const std::vector<PeerId>& exclude) {
    return choose_impl(task_cost(kind, task_size), exclude.empty() ? nullptr : &exclude);
  }

  // Outcomes for peers that have since vanished or been banned are ignored: a task
  // can finish after the registry dropped its peer.
  void report(const PeerId& peer, TaskKind kind, int64_t task_size, Outcome outcome,
              double duration_seconds, double now);

  size_t usable_peers() const { return index_.size(); }

  // The estimate choose() uses; nullopt for a peer that is not usable.
  std::optional<double> seconds_per_sample(const PeerId& peer) const;
  // The peer's heap key; nullopt for a peer that is not usable.
  std::optional<double> virtual_finish_time(const PeerId& peer) const;

  const StochasticWiringConfig& config() const { return config_; }

 private:
  struct Unchecked {};
  StochasticWiringRouter(const StochasticWiringConfig& config, Unchecked)
      : config_(config), rng_(config.seed) {}

  struct Slot {
    PeerId id;
    double vtime = 0;    // virtual finish time of the last task given to this peer
    double penalty = 0;  // queue_length * estimate from the last announcement
    double ema = 0;      // un-corrected EMA of seconds per sample
    double decay = 1;    // (1 - alpha)^samples: the bias correction is ema / (1 - decay)
    double estimate = 0;  // corrected seconds per sample, kept so choose() does not divide
    double expires_at = 0;
    int64_t queue_length = 0;
    uint64_t tiebreak = 0;
    uint64_t seen = 0;     // set_peers generation that last listed this peer
    uint32_t version = 0;  // heap entries with an older version are stale
    bool live = false;
  };
  // Lazy deletion: re-keying or removing a peer bumps its version instead of searching
  // the heap; stale entries are skipped when they reach the top, or swept on rebuild.
  struct Entry {
    double key;
    uint64_t tiebreak;
    uint32_t slot;
    uint32_t version;
  };
  static bool before(const Entry& a, const Entry& b) {
    return a.key < b.key || (a.key == b.key && a.tiebreak < b.tiebreak);
  }

  double task_cost(TaskKind kind, int64_t task_size) const {
    double size = static_cast<double>(task_size < 0 ? 0 : task_size);
    return kind == TaskKind::backward ? size * config_.backward_cost : size;
  }
  double estimate(const Slot& s) const { return s.estimate; }
  double key_of(const Slot& s) const { return s.vtime + s.penalty; }
  bool stale(const Entry& e) const {
    const Slot& s = slots_[e.slot];
    return !s.live || s.version != e.version;
  }

  std::optional<PeerId> choose_impl(double cost, const std::vector<PeerId>* exclude);
  void observe(Slot& s, double seconds_per_sample);
  void add_peer(const PeerAnnouncement& a, double start_vtime, uint64_t generation);
  void remove_peer(uint32_t slot);
  void push(uint32_t slot);
  void drop_stale_top();
  double min_key();
  void rebuild_heap();
  void sift_up(size_t i);
  void sift_down(size_t i);

  StochasticWiringConfig config_;
  wiring::SplitMix64 rng_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_slots_;
  wiring::PeerIndex index_;  // usable peers only
  std::vector<Entry> heap_;
  std::vector<Entry> set_aside_;  // excluded entries during one choose, reused
  wiring::BanList bans_;
  double floor_vtime_ = 0;  // last minimum, so a stage that empties and refills keeps its clock
  uint64_t generation_ = 0;
};

}  // namespace swarm
