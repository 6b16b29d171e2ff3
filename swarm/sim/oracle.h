// oracle: the best throughput the peers alive at a moment could reach, the yardstick
// the simulated swarm is measured against.
//
// A stage of peers with summed throughput L (forward samples/s) and per-sample cost c
// (forward units: forward + backward) processes L / c samples/s, so an assignment of
// peers to stages yields min over stages of L_s / c_s. This is the compute bound
// only: it ignores the trainers' in-flight limit, link latency and bandwidth, state
// downloads and retries, all of which the simulated swarm pays.
//
// Finding the best assignment is a max-min partition problem (NP-hard in general), so
// best_assignment() is a heuristic: longest-processing-time greedy (fastest peer first,
// each into the stage with the least L_s / c_s), then a local search that moves one
// peer, or swaps two, into the weakest stage while that raises it and keeps the other
// above the old minimum. No assignment beats fluid_bound() = total / sum of costs.
//
//   auto best = swarm::sim::best_assignment({10, 10, 25, 4}, {3.5, 2.5});
//   double samples_per_second = best.throughput;
#pragma once

#include <vector>

namespace swarm::sim {

inline constexpr const char* kOracleMethod = "lpt-greedy+local-search";

// min over stages of totals[s] / costs[s]; 0 when a stage is empty (total 0).
double assignment_throughput(const std::vector<double>& stage_totals, const std::vector<double>& stage_costs);

// sum of throughputs / sum of costs: the bound no assignment exceeds.
double fluid_bound(const std::vector<double>& throughputs, const std::vector<double>& stage_costs);

struct Assignment {
  double throughput = 0;    // samples/s of the pipeline under stage_of
  std::vector<int> stage_of;  // per input peer
};

// The heuristic above; at most `max_rounds` local-search steps.
Assignment best_assignment(const std::vector<double>& throughputs, const std::vector<double>& stage_costs,
                           int max_rounds = 256);

}  // namespace swarm::sim
