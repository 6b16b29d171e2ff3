#include <doctest/doctest.h>
#include <fmt/format.h>
#include "tests/sync_harness/fault_fuzzer.h"
using namespace swarm; using namespace swarm::sync;
TEST_CASE("scratch") {
  for (uint64_t s = 1; s <= 300; ++s) {
    auto out = run_schedule(s, FuzzOptions{});
    if (out.stats.lineages_lost > 0) fmt::print("seed {} lost {}\n{}", s, out.stats.lineages_lost, out.schedule);
  }
}
