#include "bench/ratio_report.h"

#include <fmt/core.h>

namespace swarm::bench {

static std::vector<RatioSpec>& ratios() {
  static std::vector<RatioSpec> specs;
  return specs;
}

bool register_ratio(RatioSpec spec) {
  ratios().push_back(std::move(spec));
  return true;
}

const std::vector<RatioSpec>& registered_ratios() { return ratios(); }

int print_ratios(const std::map<std::string, Measured>& measured) {
  int printed = 0;
  for (const RatioSpec& spec : ratios()) {
    auto ours = measured.find(spec.ours);
    auto baseline = measured.find(spec.baseline);
    if (ours == measured.end() || baseline == measured.end()) continue;
    if (ours->second.seconds_per_iteration <= 0) continue;
    double speed = baseline->second.seconds_per_iteration / ours->second.seconds_per_iteration;
    fmt::print("ratio {}: ours is {:.3f}x the speed of the baseline ({} vs {})\n", spec.label,
               speed, spec.ours, spec.baseline);
    ++printed;
  }
  return printed;
}

}  // namespace swarm::bench
