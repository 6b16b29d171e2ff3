// The fuzzer: random fault schedules against the production round protocol, each
// checked for one lineage, liveness after healing and every sample counted once,
// and a sample of seeds replayed for byte-identical traces.
//
// Replay one seed, with every event logged:
//   SYNC_FUZZ_SEED=N SYNC_LOG=1 bazel-bin/tests/sync_harness/sync_harness_test -tc='the fuzzer*'
// More or other seeds: SYNC_FUZZ_BASE=B SYNC_FUZZ_COUNT=C (seeds B+1 .. B+C).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "tests/sync_harness/fault_fuzzer.h"

namespace swarm::sync {
namespace {

uint64_t env_or(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::strtoull(v, nullptr, 10) : fallback;
}

TEST_CASE("the fuzzer: 1,000 fault schedules keep one lineage, liveness, and every sample") {
  FuzzOptions options;
  options.log = std::getenv("SYNC_LOG") != nullptr;
  std::vector<uint64_t> seeds;
  if (std::getenv("SYNC_FUZZ_SEED") != nullptr) {
    seeds.push_back(env_or("SYNC_FUZZ_SEED", 0));
  } else {
    const uint64_t base = env_or("SYNC_FUZZ_BASE", 0), count = env_or("SYNC_FUZZ_COUNT", 1000);
    for (uint64_t s = base + 1; s <= base + count; ++s) seeds.push_back(s);
  }
  int failed = 0, live_checked = 0, converged = 0;
  double simulated = 0;
  int64_t steps = 0, aborted = 0, resyncs = 0, lost_lineages = 0;
  for (const uint64_t seed : seeds) {
    FuzzOutcome out = run_schedule(seed, options);
    if (seed % 50 == 0 || (seeds.size() == 1 && !options.log)) {  // determinism: the same seed, the same trace
      const FuzzOutcome again = run_schedule(seed, FuzzOptions{});
      if (again.digest != out.digest) {
        out.violations.push_back(fmt::format("determinism: digests {:016x} and {:016x}", out.digest, again.digest));
      }
    }
    live_checked += out.liveness_checked;
    converged += out.converged;
    simulated += out.simulated_seconds;
    steps += out.stats.steps_applied;
    aborted += out.stats.kind[static_cast<int>(RoundEvent::Kind::aborted)];
    resyncs += out.stats.resyncs_loaded;
    lost_lineages += out.stats.lineages_lost;
    if (out.violations.empty()) continue;
    ++failed;
    std::string text = fmt::format("seed {} ({} peers) broke:\n", seed, out.peers);
    for (size_t i = 0; i < out.violations.size() && i < 4; ++i) text += "  " + out.violations[i] + "\n";
    text += "schedule:\n" + out.schedule + "replay: " + replay_command(seed) + "\n";
    FAIL_CHECK(text);
    if (failed >= 10) break;
  }
  MESSAGE(fmt::format("{} schedules, {} with violations; liveness checked in {}, converged at the end in {}; "
                      "{:.0f} simulated s, {} replica steps, {} aborted-round events, {} downloads, {} steps of lost lineages",
                      seeds.size(), failed, live_checked, converged, simulated, steps, aborted, resyncs, lost_lineages));
  CHECK(failed == 0);
}

// Seeds that broke the protocol in a 10,000-schedule run of sync_fuzz_bench, each
// fixed since: they stay here so a change that brings a mechanism back fails
// at once, whatever the 1,000 seeds above happen to cover.
//   6482: a leader stopped past its record's lifetime committed DONEs from members
//         that had restarted and stepped without it: two lineages at one step.
//   9676, 63259: a stage split by a stop and a blind view stepped as two lineages
//         for good, each side a majority of its own membership.
//   97474: a member that voted DONE took a duplicated old BEGIN for its leader's
//          next round and voted at the same step again.
//   20787, 53787, 58666, 86740: liveness, no step in the 15 s after the faults healed
//         (a membership of peers all gone; a benched leader; a looking peer ahead).
//   1693, 5739: liveness; a newcomer serving the stage's state elected another
//         leader than its stage-mates (broke while the others were being fixed).
//   13775: the losing side of a split, its state ahead of the winners', waited for
//          them to pass it and saw a second hash at its step.
//   17707: a peer whose membership was all gone stepped alone while two restarted
//          stage-mates loaded its state (both from the 20,000-schedule run).
TEST_CASE("the fuzzer: seeds that once broke a check stay fixed") {
  for (const uint64_t seed : {6482, 9676, 63259, 97474, 20787, 53787, 58666, 86740, 1693, 5739, 13775, 17707}) {
    CAPTURE(seed);
    const FuzzOutcome out = run_schedule(seed, FuzzOptions{});
    std::string text;
    for (const auto& v : out.violations) text += v + "\n";
    text += "replay: " + replay_command(seed);
    CHECK_MESSAGE(out.violations.empty(), text);
  }
}

}  // namespace
}  // namespace swarm::sync
