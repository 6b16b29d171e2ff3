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

}  // namespace
}  // namespace swarm::sync
