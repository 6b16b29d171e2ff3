// progress: when has a stage's swarm of peers processed its global batch?
//
// Each peer of a stage publishes a ProgressRecord under progress_registry_key(stage):
// the global step its parameters are at, the samples it has accumulated toward the
// next one and how fast it accumulates them. The tracker is a pure function of those
// records and the time (DESIGN §5.3): no clock, no I/O, so it is tested with a fake
// clock and every peer that sees the same records decides the same.
//
//   swarm::GlobalBatchConfig batch{.target_samples = 64};
//   auto decision = swarm::decide_global_batch(batch, /*my_step=*/3, records, registry.now());
//   if (decision.behind) download_state();
//   else if (decision.ready) run_all_reduce();
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "swarm/core/status.h"

namespace swarm {

inline std::string progress_registry_key(int stage) { return "swarm/progress/" + std::to_string(stage); }

struct ProgressRecord {
  // A record with more recent hashes is refused: a replica keeps 16.
  static constexpr size_t kMaxRecentHashes = 64;

  std::string peer_id;
  std::string address;  // where its averaging and state requests go
  int stage = 0;
  int64_t step = 0;     // global steps applied to its parameters
  int64_t samples = 0;  // accumulated toward step + 1
  double samples_per_second = 0;
  double published_at = 0;  // on the registry's clock
  // What it is doing: serving (and joining rounds), averaging (in a round's group),
  // resyncing (downloading a state; serves nothing), looking (starting up).
  enum class State : uint8_t { serving, averaging, resyncing, looking };
  State state = State::serving;
  uint64_t params_hash = 0; // content hash of its parameters at `step`
  // The last round it committed: the group id and its members, ordered by id
  // (the stage's committed membership as this peer knows it; at most kMaxMembers).
  static constexpr size_t kMaxMembers = 256;
  uint64_t committed_group = 0;
  std::vector<std::string> committed_members;
  int stage_mates_seen = 0; // fresh stage-mates in its own view: a joining swarm waits until all see all
  // Recent (step, params hash) pairs, newest last, so an observer that polls
  // less often than peers step still sees every step's hash.
  std::vector<std::pair<int64_t, uint64_t>> recent_hashes;  // at most kMaxRecentHashes
  // Gradient payloads it has sent in all-reduce rounds, cumulative: encoded bytes and
  // the float values they carry (for the run's bytes per value).
  int64_t allreduce_bytes = 0;
  int64_t allreduce_values = 0;
  // Its last record before it moved to another stage: stage-mates stop counting it
  // at once rather than once it is stale, so their next round does not wait for it.
  bool departed = false;
  // Stage-mates it banned from rounds on their contributions (ban_policy.h), ordered
  // by id, at most kMaxMembers: trainers stop routing to a peer a majority banned.
  std::vector<std::string> banned;

  static std::string_view state_name(State state);
  std::string to_json() const;
  static Result<ProgressRecord> from_json(const std::string& text);
};

struct GlobalBatchConfig {
  int64_t target_samples = 64;
  // Records older than this are from peers that died or stalled: not counted.
  double stale_after_seconds = 5.0;
  // Also start when the extrapolated total (samples + rate x age) reaches the
  // target, so a stage does not wait a whole publish period for the last
  // records. Off where steps must close on exact sample counts (equivalence tests).
  bool use_estimated_arrival = true;

  Status validate() const;
};

struct GlobalBatchDecision {
  bool ready = false;    // the round that ends my step should start
  bool behind = false;   // a fresh stage-mate is at a later step: re-sync first
  int64_t newest_step = 0;
  int64_t reported_samples = 0;  // published by fresh peers at my step
  double expected_samples = 0;   // extrapolated to `now`
  double estimated_arrival = std::numeric_limits<double>::infinity();  // when the target is reached
  int peers_counted = 0;
};

GlobalBatchDecision decide_global_batch(const GlobalBatchConfig& config, int64_t my_step,
                                        const std::vector<ProgressRecord>& records, double now);

// The parameters hash a strict majority of the fresh peers in `records` published
// for `step` (their current hash, or one of their recent ones): what a downloaded
// state of that step must hash to. Each peer votes once; peers that published no
// hash for `step` count against every hash, so a lone donor cannot vouch for itself
// among stage-mates that do not know its step. None without such a majority.
std::optional<uint64_t> majority_hash(const std::vector<ProgressRecord>& records, int64_t step, double now,
                                      double stale_after_seconds);

// The hash `r` published for `step`: its current one at its step, else the newest of
// its recent ones for that step; none if it published none.
std::optional<uint64_t> published_hash(const ProgressRecord& r, int64_t step);

// Donors in the order to try them: the highest published step first, then the most
// recent record, then by id (so equal records give one order everywhere).
std::vector<ProgressRecord> donors_freshest_first(std::vector<ProgressRecord> donors);

// The parameter hash most replicas hold; ties go to the hash of the lowest peer id,
// so every peer that sees the same hashes elects the same one. 0 for no hashes.
uint64_t consensus_hash(const std::vector<std::pair<std::string, uint64_t>>& hashes_by_peer);

}  // namespace swarm
