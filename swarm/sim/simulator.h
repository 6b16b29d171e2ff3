// simulator: a deterministic discrete-event simulation of a SWARM swarm that runs the
// production policies (DESIGN §5.6): the routers of swarm/wiring, the rebalancer of
// swarm/rebalance and decide_global_batch of swarm/averaging, against a simulated clock.
//
// It writes JSON lines to `out` (samples, moves, joins and leaves, a final summary; see
// docs/SIMULATOR.md) and returns the summary. Same scenario, same bytes.
//
//   swarm::sim::Scenario s;
//   s.peers = 40; s.seconds = 600; s.churn = 0.3;
//   std::ostringstream lines;
//   auto summary = swarm::sim::simulate(s, lines);
//   if (summary.is_ok()) use(summary->efficiency);
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "swarm/core/status.h"
#include "swarm/sim/scenario.h"

namespace swarm::sim {

struct Summary {
  double throughput_mean = 0;   // samples/s completed, mean over sample windows
  double oracle_mean = 0;       // the oracle (oracle.h), mean over the same windows
  double assignment_mean = 0;   // the compute bound of the swarm's own assignment
  double efficiency = 0;        // mean over windows of throughput / oracle
  double throughput_start = 0;  // mean of the first tenth of windows after the first (warm-up)
  double throughput_end = 0;    // mean of the last tenth of windows
  int windows = 0;

  int64_t microbatches_started = 0;
  int64_t microbatches_completed = 0;
  int64_t microbatches_abandoned = 0;
  int64_t microbatches_in_flight = 0;

  int64_t moves = 0;
  int64_t departures = 0;   // --churn
  int64_t kills = 0;        // --schedule kill
  int64_t preemptions = 0;  // --preempt-rate
  int64_t joins = 0;        // --join-rate, --schedule join and preempted peers rejoining
  int64_t timeouts = 0;
  int64_t errors = 0;
  int64_t expired_dropped = 0;  // queued tasks a peer skipped because their trainer gave up
  int64_t lost_samples = 0;     // accepted samples whose peer died or moved before a step
  int64_t stepped_samples = 0;  // samples averaged into global steps
  std::vector<int64_t> stage_samples;  // per stage: samples its peers accumulated, each microbatch once
  int64_t path_restarts = 0;           // peer to peer: paths broken after stage 0, retried from the trainer
  int64_t duplicates_refused = 0;      // a retried path's stage that had accumulated the microbatch already
  double trainer_up_bytes = 0;         // all trainers' links, over the run
  double trainer_down_bytes = 0;
  std::vector<int64_t> global_steps;
  std::vector<int> peers_per_stage;  // at the end
  uint64_t events = 0;
};

// Called when the simulated time passes another tenth of the run (for progress lines).
using ProgressFn = std::function<void(double sim_seconds, double total_seconds)>;

// Validates and resolves the scenario (Scenario::resolved) first.
Result<Summary> simulate(const Scenario& scenario, std::ostream& out, const ProgressFn& progress = {});

}  // namespace swarm::sim
