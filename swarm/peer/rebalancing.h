// rebalancing: the peer's part that runs adaptive rebalancing (swarm/rebalance).
//
// Every second it asks whether the policy's next (jittered) check is due. If so it
// reads every stage's announcements, adds this peer as it is now where they miss
// it (rebalance::planning_view), and hands them to the pure Rebalancer, which says
// stay or move. Moving itself is the peer's job (Peer::move_to); this
// part only decides, on its own thread, so a move never blocks a request.
//
//   Rebalancing<DhtRegistry> part(config, "p03", 2, seed, &registry, self, may_check, move);
//   part.start();
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "swarm/api/registry.h"
#include "swarm/core/log.h"
#include "swarm/peer/periodic_task.h"
#include "swarm/protocol/records.h"
#include "swarm/rebalance/rebalancer.h"

namespace swarm {

// The registry's view of the swarm as the rebalancer takes it.
// Records that do not parse are left out and counted in *refused when given.
template <Registry R>
std::vector<rebalance::PeerLoad> announced_loads(R& registry, int num_stages, int64_t* refused = nullptr) {
  std::vector<rebalance::PeerLoad> loads;
  for (const auto& [id, record] : read_stage_announcements(registry, num_stages, refused)) {
    loads.push_back({id, record.stage, record.throughput, record.queue_length});
  }
  return loads;
}

// For a peer started without a stage: the one the swarm needs most now.
template <Registry R>
int stage_the_swarm_needs(R& registry, int num_stages, double own_throughput = 0) {
  return rebalance::stage_most_needed(announced_loads(registry, num_stages), num_stages, own_throughput);
}

template <Registry R>
class Rebalancing {
 public:
  using Self = rebalance::PeerLoad;
  // may_check: false while the peer does not serve (syncing, moving); move(to, urgent):
  // moves the peer (blocking) and returns whether it now serves the target stage;
  // urgent when the target stage is empty.
  Rebalancing(rebalance::RebalanceConfig config, std::string peer_id, int num_stages, uint64_t seed, R* registry,
              std::function<Self()> self, std::function<bool()> may_check, std::function<bool(int, bool)> move)
      : policy_(config, peer_id, seed, registry->now()), peer_id_(std::move(peer_id)), num_stages_(num_stages),
        registry_(registry), self_(std::move(self)), may_check_(std::move(may_check)), move_(std::move(move)) {}

  void start() {
    task_.start(1.0, [this] { tick(); });
  }
  void stop() { task_.stop(); }

  int64_t checks() const { return checks_; }
  // Announcements it left out because they did not parse or sat under another stage's key.
  int64_t refused_records() const { return refused_; }

 private:
  void tick() {
    const double now = registry_->now();
    if (now < policy_.next_check_at()) return;
    if (!may_check_()) {
      policy_.reset(now);  // a peer that is not serving cannot be planned with
      return;
    }
    int64_t refused = 0;
    std::vector<rebalance::PeerLoad> loads = announced_loads(*registry_, num_stages_, &refused);
    refused_ += refused;
    loads = rebalance::planning_view(std::move(loads), self_());
    ++checks_;
    const rebalance::Decision decision = policy_.check(loads, num_stages_, now);
    log_check(decision, loads.size());
    if (!decision.move) return;
    (void)move_(decision.to_stage, decision.plan->pipeline_before == 0);
    policy_.reset(registry_->now());
  }

  void log_check(const rebalance::Decision& d, size_t peers) const {
    if (!d.plan) return;
    log_info("peer {}: rebalancing: {} peers seen; the swarm would gain moving {} from stage {} to {} ({:.1f} -> "
             "{:.1f} samples/s), check {}{}",
             peer_id_, peers, d.plan->peer_id, d.plan->from_stage, d.plan->to_stage, d.plan->pipeline_before,
             d.plan->pipeline_after, d.confirmations, d.move ? ": moving" : "");
  }

  rebalance::Rebalancer policy_;
  const std::string peer_id_;
  const int num_stages_;
  R* registry_;
  std::function<Self()> self_;
  std::function<bool()> may_check_;
  std::function<bool(int, bool)> move_;
  std::atomic<int64_t> checks_{0};
  std::atomic<int64_t> refused_{0};
  PeriodicTask task_;
};

}  // namespace swarm
