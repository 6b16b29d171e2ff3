// scenario: everything a simulated swarm is made of, as one validated config.
//
// `swarm sim` fills it from flags; tests fill it directly. validate() checks every
// field and names the flag it came from, so a bad command line gets a clear error.
// Fields documented as "0: auto" are resolved by resolved() (see each comment).
//
//   swarm::sim::Scenario s;
//   s.peers = 40; s.stages = 4; s.seconds = 600; s.churn = 0.3;
//   auto ready = s.resolved();   // validated, autos filled in
//   if (!ready.is_ok()) fail(ready.status());
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "swarm/averaging/progress.h"
#include "swarm/core/status.h"
#include "swarm/rebalance/rebalancer.h"
#include "swarm/sim/distribution.h"

namespace swarm::sim {

enum class RouterKind { stochastic, round_robin, random, least_loaded };

// Who carries a microbatch between stages. hub: the trainer sends every hop and gets
// every reply, so each stage's traffic crosses its link. peer_to_peer: the trainer
// sends tokens to stage 0, each peer sends its output to a peer of the next stage and
// the gradient comes back along the same path (docs/SIMULATOR.md "Hops").
enum class HopMode { hub, peer_to_peer };

// When a stage's round starts. records: once the published progress records add up to
// the global batch, checked every announce period (decide_global_batch). joins: as the
// round protocol does (swarm/averaging/round_protocol.h): members JOIN the leader as
// their samples change and it BEGINs once the batch is in, each a link crossing.
enum class RoundTrigger { records, joins };

Result<HopMode> parse_hop_mode(const std::string& name);
const char* hop_mode_name(HopMode mode);
Result<RoundTrigger> parse_round_trigger(const std::string& name);
const char* round_trigger_name(RoundTrigger trigger);

// What a peer announces as its throughput. runtime: StageService's measure, forward
// units per second with every backward request counted as backward_cost (so the last
// stage's fused request counts as one backward). stage: samples of its own stage's work
// per second, scaled to the forward units of a middle stage, so stage totals compare
// like for like when the last stage's cost differs from the others'.
enum class ThroughputReport { stage, runtime };

Result<ThroughputReport> parse_throughput_report(const std::string& name);
const char* throughput_report_name(ThroughputReport report);

Result<RouterKind> parse_router(const std::string& name);
const char* router_name(RouterKind kind);

// One entry of --schedule: kill a live peer of `stage`, or add a peer, at `at` seconds.
struct ScheduledEvent {
  enum class Kind { kill, join };
  Kind kind = Kind::kill;
  int stage = -1;  // kill only
  double at = 0;
};

// "kill:STAGE:AT_S,join:AT_S,...", sorted by time (stable for equal times).
Result<std::vector<ScheduledEvent>> parse_schedule(const std::string& text);

struct Scenario {
  // The swarm.
  int peers = 16;
  int stages = 4;
  std::vector<int> peers_per_stage;  // empty: peer i starts at stage i % stages
  // Few trainers with deep windows keep every peer's queue non-empty: see docs/SIMULATOR.md.
  int trainers = 0;                  // 0: auto, ceil(peers / 100)
  int in_flight = 0;                 // per trainer; 0: auto, ceil(4 * peers / trainers)
  int64_t microbatch = 8;            // samples (sequences) per microbatch

  // Time. Sim seconds; sample_every 0: auto, min(60, seconds / 20).
  double seconds = 3600;
  double sample_every = 0;
  uint64_t seed = 0;

  // Compute, in forward units: a peer of throughput X does X forward samples per second.
  Distribution throughput = Distribution::constant(10);
  double backward_cost = 2.5;    // per backward sample (swarm/peer/stage_service.h)
  double last_stage_cost = 2.5;  // the last stage's fused forward+backward, one backward request
  double compute_jitter = 0.05;  // each task takes its nominal time x U[1 - j, 1 + j]
  ThroughputReport announce_throughput = ThroughputReport::stage;

  // Links: per peer, drawn once.
  Distribution latency_ms = Distribution::constant(50);
  Distribution bandwidth_mbps = Distribution::constant(100);
  int64_t seq_len = 128;
  int64_t d_model = 1024;
  int64_t activation_bytes = 0;   // per hidden tensor; 0: auto, 8-bit codec of microbatch x seq x d_model
  int64_t activation_gradient_bytes = 0;  // per gradient of one; 0: auto, activation_bytes
  int64_t stage_params = 50'000'000;
  int64_t state_bytes = 0;        // downloaded by a joining or moving peer; 0: auto, 12 x stage_params
  int64_t gradient_bytes = 0;     // all-reduced per step; 0: auto, 1 x stage_params (8-bit)
  int64_t token_bytes = 0;        // a microbatch's tokens, and again its targets; 0: auto, 4 x microbatch x seq_len
  int64_t loss_bytes = 64;        // stage 0's answer to its trainer in peer-to-peer mode: loss and receipt

  // Hops, and the trainers' own links: 0 bandwidth is an unlimited link. A message waits
  // for its sender's link, then its receiver's, then the larger latency, as
  // `swarm local --link` emulates it.
  HopMode hops = HopMode::hub;
  double trainer_bandwidth_mbps = 0;
  double trainer_latency_ms = 0;

  // Trainers.
  RouterKind router = RouterKind::stochastic;
  double forward_timeout = 30;   // seconds per attempt (the reference's deadlines, DESIGN §10)
  double backward_timeout = 75;
  double abandon_after = 60;     // a hop with no usable peer for this long abandons the microbatch

  // The registry view.
  double announce_period = 1;    // peers re-announce, and the view is rebuilt, this often
  double announce_ttl = 5;       // a record lives this long after its announcement
  double refresh_period = 1;     // trainers hand their routers the view this often

  // Churn.
  double churn = 0;          // fraction of the initial peers leaving over the run (Poisson)
  double join_rate = 0;      // peers per hour joining (Poisson)
  double preempt_rate = 0;   // peers per hour preempted (Poisson): leave, rejoin after a downtime
  Distribution downtime = Distribution::constant(120);
  std::vector<ScheduledEvent> schedule;

  // The policies under test.
  bool rebalance = true;
  rebalance::RebalanceConfig rebalance_config{.period_seconds = 60,
                                              .jitter_fraction = 0.2,
                                              .min_gain = 0.001,
                                              .confirmations = 2};
  GlobalBatchConfig global_batch{.target_samples = 4096};
  RoundTrigger rounds = RoundTrigger::records;
  // A forward that finds gradients waiting here for a round waits this long at most
  // for a round to take them (PeerConfig::forward_waits_for_pending_seconds).
  double forward_hold = 0;
  // Work that reaches a peer of a stage in a round waits this long at most for the
  // round's step (PeerConfig::compute_waits_for_round_seconds); 0: it never waits.
  double round_wait = 0;

  Status validate() const;
  // A copy with every "0: auto" filled in, validated.
  Result<Scenario> resolved() const;

  // Per-sample cost of each stage in forward units: forward + backward, the last one fused.
  std::vector<double> stage_costs() const;
};

}  // namespace swarm::sim
