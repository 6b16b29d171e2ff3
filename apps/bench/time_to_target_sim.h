// time_to_target_sim: the simulator's step time for a timed run of `swarm bench
// time-to-target`, so each real step stands next to the simulator's under the same
// scoring (steps to the target x the steady step).
//
// The scenario comes from the run's own config.json: its swarm, batch, links (every
// peer's and the trainer's), hops, codecs and boundary layers (bytes per hidden
// tensor, its gradient and the all-reduce's parts), its emulated device (each stage's
// FLOPs) and its waits (--forward-hold, --round-wait). Rounds form as the round
// protocol forms them (sim::RoundTrigger::joins).
//
//   auto config = nlohmann::json::parse(std::ifstream(dir / "config.json"));
//   auto step = simulated_step(config);   // step->step_seconds
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "swarm/core/status.h"
#include "swarm/sim/scenario.h"

namespace swarm::apps {

// Refuses a run the simulator cannot stand for: no --emulated-device (real compute on
// shared cores has no fixed rate), a model other than the GPT, a field missing or out
// of range.
Result<sim::Scenario> scenario_of_run(const nlohmann::json& config);

// Over `seeds` seeds (the routers' draws): with no compute jitter the simulated
// pipeline is deterministic, and where waits couple the peers one draw can lock it
// into a pattern another does not.
// The `swarm sim` command line of that scenario (one seed, 120 simulated seconds), to
// rerun it or change one thing in it.
std::string sim_command_line(const sim::Scenario& s);

struct SimulatedStep {
  double step_seconds = 0;             // the steady step (the last tenth of each run), mean over seeds
  double step_min = 0, step_max = 0;   // over seeds
  double trainer_up_bytes = 0;         // per microbatch started
  double trainer_down_bytes = 0;       // per microbatch completed
  int64_t completed = 0;               // over all seeds
  std::string command;                 // sim_command_line of the scenario
};

Result<SimulatedStep> simulated_step(const nlohmann::json& config, double seconds = 120, int seeds = 5);

}  // namespace swarm::apps
