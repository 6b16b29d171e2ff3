// ratio_report: every benchmark ends with ours-versus-baseline ratios from the same run.
//
// Absolute times on a shared machine are noise; a ratio of two things measured
// side by side is not. A benchmark file registers the pairs it wants compared,
// and bench_main prints one line per pair after Google Benchmark has run.
//
//   BENCHMARK(BM_TensorCopy)->Arg(1 << 20);
//   BENCHMARK(BM_Memcpy)->Arg(1 << 20);
//   SWARM_BENCH_RATIO("copy 1 MiB", "BM_TensorCopy/1048576", "BM_Memcpy/1048576");
#pragma once

#include <map>
#include <string>
#include <vector>

namespace swarm::bench {

struct RatioSpec {
  std::string label;
  std::string ours;      // full benchmark name, as Google Benchmark prints it
  std::string baseline;  // the same for the thing we compare against
};

bool register_ratio(RatioSpec spec);
const std::vector<RatioSpec>& registered_ratios();

// Real time per iteration (seconds) of each benchmark that ran, keyed by name.
struct Measured {
  double seconds_per_iteration = 0;
};

// Prints "ratio <label>: ours is X.XXx the speed of baseline" for each pair
// whose two halves both ran; returns how many were printed.
int print_ratios(const std::map<std::string, Measured>& measured);

}  // namespace swarm::bench

#define SWARM_BENCH_CONCAT_INNER(a, b) a##b
#define SWARM_BENCH_CONCAT(a, b) SWARM_BENCH_CONCAT_INNER(a, b)
#define SWARM_BENCH_RATIO(label, ours, baseline)                          \
  static const bool SWARM_BENCH_CONCAT(swarm_bench_ratio_, __LINE__) = \
      ::swarm::bench::register_ratio({label, ours, baseline})
