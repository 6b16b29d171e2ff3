// fault_fuzzer: random fault schedules against the harness, and the invariants
// checked after each.
//
// A schedule (all of it drawn from one seed): 2 to 5 peers; for `fault_seconds`,
// kills and restarts, SIGSTOP-like pauses, registry views that lag, go blind or
// lose gets, and messages of one op (a PART phase, one sender or receiver) that
// are dropped, duplicated or delayed; then every fault heals, some dead peers
// come back, and a fault-free tail runs. Checked after every schedule:
//   lineage      no two live replicas ever held different hashes for one step;
//   liveness     with a strict majority alive in the tail, the stage steps within
//                `liveness_bound` seconds of the faults healing;
//   ledger       every sample fed is pending, in a round, stepped or lost, once;
//   determinism  (the caller reruns some seeds and compares digests).
// A restart keeps the peer's id (as `swarm peer --peer-id` does). Registry views lag
// or lose gets for less than the staleness bound (5 s): past it, a peer that never
// committed cannot tell an outage from an empty stage (its driver drops its own
// record) and serves alone by design.
//
//   FuzzOutcome out = run_schedule(seed, FuzzOptions{});
//   for (const auto& v : out.violations) report(seed, v);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tests/sync_harness/sync_harness.h"

namespace swarm::sync {

struct FuzzOptions {
  double fault_seconds = 10;   // faults start in [1, fault_seconds) and heal by it
  double tail_seconds = 18;    // fault-free, after
  double liveness_bound = 15;  // the stage's next step after healing, at most this late
  bool log = false;
};

struct FuzzOutcome {
  uint64_t seed = 0;
  int peers = 0;
  std::vector<std::string> violations;  // "invariant: what happened"
  std::string schedule;                 // the faults, one per line, for a replay's reader
  uint64_t digest = 0;
  double simulated_seconds = 0;
  bool liveness_checked = false;  // a strict majority was alive in the tail
  bool converged = false;         // every live peer serving one state at the end
  HarnessStats stats;
};

FuzzOutcome run_schedule(uint64_t seed, const FuzzOptions& options);

// The command that replays `seed` with a log of every event.
std::string replay_command(uint64_t seed);

}  // namespace swarm::sync
