// The fuzzer at scale: 100,000 fault schedules (SYNC_BENCH_SCHEDULES to change,
// SYNC_BENCH_BASE to move the seeds), spread over the machine's cores, each run
// single-threaded as in the test. Prints schedules per second, the violations by
// invariant (and the first seeds that broke each), and simulated per wall second.
//
//   ./bazelw test --test_tag_filters=benchmark --test_output=all //tests/sync_harness:sync_fuzz_bench
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "tests/sync_harness/fault_fuzzer.h"

namespace {

uint64_t env_or(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::strtoull(v, nullptr, 10) : fallback;
}

}  // namespace

int main() {
  using swarm::sync::FuzzOptions;
  using swarm::sync::FuzzOutcome;
  const uint64_t count = env_or("SYNC_BENCH_SCHEDULES", 100000);
  const uint64_t base = env_or("SYNC_BENCH_BASE", 0);
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::atomic<uint64_t> next{0};
  std::mutex mu;
  std::map<std::string, std::vector<uint64_t>> broken;  // invariant -> seeds
  double simulated = 0;
  uint64_t failed = 0, live_checked = 0, converged = 0, lost_lineages = 0;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (uint64_t i = next++; i < count; i = next++) {
        const FuzzOutcome out = swarm::sync::run_schedule(base + i + 1, FuzzOptions{});
        std::lock_guard lock(mu);
        simulated += out.simulated_seconds;
        live_checked += out.liveness_checked;
        converged += out.converged;
        lost_lineages += out.stats.lineages_lost;
        failed += !out.violations.empty();
        for (const auto& v : out.violations) {
          auto& seeds = broken[v.substr(0, v.find(':'))];
          if (seeds.empty() || seeds.back() != out.seed) seeds.push_back(out.seed);
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print("{} schedules on {} threads in {:.1f} s: {:.1f} schedules/s\n", count, threads, wall, double(count) / wall);
  fmt::print("simulated {:.0f} s: {:.0f} simulated s per wall s ({:.0f} per core)\n", simulated, simulated / wall,
             simulated / wall / threads);
  fmt::print("schedules with violations: {}; liveness checked in {}, converged in {}; {} steps of lost lineages\n", failed,
             live_checked, converged, lost_lineages);
  for (const auto& [invariant, seeds] : broken) {
    std::vector<uint64_t> first(seeds.begin(), seeds.begin() + static_cast<long>(std::min<size_t>(seeds.size(), 10)));
    fmt::print("  {}: {} schedules, first seeds {}\n", invariant, seeds.size(), fmt::join(first, " "));
  }
  if (!broken.empty()) fmt::print("replay one: {}\n", swarm::sync::replay_command(broken.begin()->second.front()));
  return failed == 0 ? 0 : 1;
}
