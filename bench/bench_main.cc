// Shared main for Google Benchmark programs: runs them, then prints the
// registered ours/baseline ratios from the same run.
#include <benchmark/benchmark.h>
#include <fmt/core.h>

#include "bench/ratio_report.h"

namespace {

class CollectingReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.run_type != Run::RT_Iteration || run.iterations == 0) continue;
      measured[run.benchmark_name()].seconds_per_iteration =
          run.real_accumulated_time / static_cast<double>(run.iterations);
    }
    ConsoleReporter::ReportRuns(runs);
  }
  std::map<std::string, swarm::bench::Measured> measured;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  CollectingReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  int printed = swarm::bench::print_ratios(reporter.measured);
  if (printed == 0 && !swarm::bench::registered_ratios().empty()) {
    fmt::print("no ratio printed: a benchmark pair did not run (check --benchmark_filter)\n");
  }
  return 0;
}
