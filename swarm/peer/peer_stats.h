// peer_stats: what a peer has done, shared by its parts, and a way to wait on it.
//
// Every part updates the board through update(), which wakes waiters, so tests and
// tools wait on the peer itself (wait_for) instead of polling it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>

#include "swarm/core/clock.h"
#include "swarm/protocol/stage_protocol.h"

namespace swarm {

struct PeerStats {
  int64_t forward = 0;
  int64_t backward = 0;
  int64_t samples = 0;
  int64_t optimizer_steps = 0;
  int64_t rejected = 0;         // requests refused by validation
  int64_t spec_refused = 0;     // stage requests check_request refused (spec, codec, no microbatch id or deadline)
  int64_t loss_gradient_refused = 0;  // loss-stage backwards whose d_loss was not the protocol's (kLossGradient)
  int64_t backward_unbound = 0;       // backwards for no forward this peer served that caller (ForwardLedger)
  int64_t backward_other_input = 0;   // backwards whose input was not their forward's
  int64_t callers_refused = 0;        // stage and state requests without a valid certificate (owned swarms)
  int64_t pipelines_busy = 0;            // pipelines from peers answered busy (hops answered at once)
  int64_t pipeline_results_refused = 0;  // pipeline_result requests refused: malformed, unknown token, wrong sender
  int64_t pipeline_results_unsent = 0;   // outcomes that could not be sent back to the peer that passed it on
  int64_t hop_chains_refused = 0;     // pipelines whose hop chain did not lead from a trainer to here (secured swarms)
  int64_t forward_batches = 0;  // stage calls that served forward requests
  double throughput = 0;        // samples per second of compute, smoothed
  // Stage synchronization.
  int64_t global_step = 0;
  uint64_t params_hash = 0;
  int64_t rounds_completed = 0;
  int64_t rounds_failed = 0;
  int64_t lost_samples = 0;  // accumulated, then lost with a failed round
  int64_t state_downloads = 0;
  int64_t diverged = 0;  // rounds after which this replica's hash was not the stage's
  int64_t last_download_donors = 0;       // donors the last state download used (2+: one failed)
  int64_t last_download_resumed_at = -1;  // byte offset a later donor continued from
  int64_t allreduce_bytes = 0;            // gradient payload bytes sent in rounds
  int64_t allreduce_values = 0;           // float values those payloads carried
  int64_t parts_refused = 0;          // all-reduce parts the inbox refused (InboxCounters::refused)
  int64_t contributions_ignored = 0;  // parts a round left out: wrong sender, weight over the published count
  int64_t states_refused = 0;         // downloaded states (or donors' offers) that failed the check before load
  int64_t unvouched_ahead = 0;        // records ahead of this replica that no majority vouched for (per check)
  int64_t bad_records = 0;            // registry records refused: wrong types, out of range, from the future
  int64_t members_banned = 0;         // stage-mates banned from rounds on their contributions (ban_policy.h)
  bool serving = false;
  int stage = 0;      // the stage it serves now
  int64_t moves = 0;  // stage changes by rebalancing
  // Where every backward sample went, and the requests refused for their deadline
  // or as duplicates (the replica's, filled in on read).
  protocol::SampleLedger ledger;
};

class StatsBoard {
 public:
  // Fields that other parts own (validation counters, serving) are filled in on read.
  explicit StatsBoard(std::function<void(PeerStats&)> overlay) : overlay_(std::move(overlay)) {}

  template <typename Change>
  void update(Change change) {
    {
      std::lock_guard lock(mu_);
      change(stats_);
    }
    cv_.notify_all();
  }
  // Wakes waiters after a change to an overlaid field.
  void notify() { update([](PeerStats&) {}); }

  PeerStats snapshot() const {
    std::lock_guard lock(mu_);
    return current();
  }

  template <typename Predicate>
  bool wait_for(Predicate done, Deadline deadline) const {
    std::unique_lock lock(mu_);
    return cv_.wait_until(lock, deadline, [&] { return done(current()); });
  }

 private:
  PeerStats current() const {
    PeerStats out = stats_;
    overlay_(out);
    return out;
  }

  std::function<void(PeerStats&)> overlay_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  PeerStats stats_;
};

}  // namespace swarm
