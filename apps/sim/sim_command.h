// sim_command: `swarm sim`, the command line of the swarm simulator (swarm/sim).
//
//   CLI::App app{"swarm"};
//   int exit_code = 0;
//   swarm::apps::add_sim_command(app, &exit_code);
//   CLI11_PARSE(app, argc, argv);
//   return exit_code;
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "swarm/core/status.h"
#include "swarm/sim/scenario.h"

namespace swarm::apps {

// The flags as typed; distributions and lists stay text until scenario_from() parses them.
struct SimFlags {
  sim::Scenario scenario;  // the numeric flags land here directly
  double hours = 0;
  double seconds = 0;
  std::string peers_per_stage;
  std::string throughput = "const:10";
  std::string latency_ms = "const:50";
  std::string bandwidth_mbps = "const:100";
  std::string downtime = "const:120";
  std::string router = "stochastic";
  std::string announce_throughput = "stage";
  std::string schedule;
  std::string hops = "hub";
  std::string rounds = "records";
  bool no_rebalance = false;
  int64_t global_batch = 4096;
  std::string out;
};

// Registers every flag of `swarm sim` on `command`.
void add_sim_flags(CLI::App* command, SimFlags* flags);

// The validated scenario the flags describe; errors name the flag.
Result<sim::Scenario> scenario_from(const SimFlags& flags);

// Runs it: JSON lines to --out, one summary line to stdout, progress to stderr.
// Returns the process exit code (2 for bad flags, 1 for an I/O failure).
int run_sim(const SimFlags& flags);

// Adds the `sim` subcommand; when it runs, *exit_code receives run_sim's result.
void add_sim_command(CLI::App& app, int* exit_code);

}  // namespace swarm::apps
