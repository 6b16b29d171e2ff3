// What the simulator tests share: run a scenario, read its JSON lines back.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "swarm/sim/simulator.h"

namespace swarm::sim::testing {

struct Run {
  Summary summary;
  std::string lines;
  std::vector<nlohmann::json> records;

  std::vector<nlohmann::json> of_kind(const std::string& kind) const {
    std::vector<nlohmann::json> out;
    for (const auto& r : records) {
      if (r["kind"] == kind) out.push_back(r);
    }
    return out;
  }
};

inline Run run(const Scenario& scenario) {
  std::ostringstream out;
  auto summary = simulate(scenario, out);
  REQUIRE_MESSAGE(summary.is_ok(), summary.status().to_string());
  Run r{*summary, out.str(), {}};
  std::istringstream in(r.lines);
  for (std::string line; std::getline(in, line);) r.records.push_back(nlohmann::json::parse(line));
  return r;
}

// A small, busy scenario that exercises every event: heterogeneous peers, churn, joins,
// preemptions, a scheduled kill and join, rebalancing and global steps.
inline Scenario small_churny_scenario(uint64_t seed) {
  Scenario s;
  s.peers = 24;
  s.stages = 3;
  s.seconds = 600;
  s.seed = seed;
  s.throughput = *parse_distribution("choice:4,10,25");
  s.latency_ms = *parse_distribution("uniform:10:80");
  s.churn = 0.3;
  s.join_rate = 30;
  s.preempt_rate = 20;
  s.downtime = *parse_distribution("uniform:30:90");
  s.schedule = *parse_schedule("kill:1:100,join:200");
  s.rebalance_config.period_seconds = 20;
  s.global_batch.target_samples = 256;
  return s;
}

}  // namespace swarm::sim::testing
