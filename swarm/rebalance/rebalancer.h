// rebalancer: adaptive rebalancing (DESIGN §5.4, the paper's Algorithm 2), as a pure policy.
//
// Stochastic wiring balances load inside a stage; only a peer that changes stage can
// relieve the pipeline's bottleneck. Every peer runs this policy on the same registry
// view (each stage's announced peers: throughput and queue) and the time, and every
// one of them elects the same mover, so one peer moves per vacancy without a vote:
//   - the bottleneck is an empty stage if there is one, else the stage of least total
//     throughput (ties: the most queued work per unit of throughput, then the lowest index);
//   - the donor is the stage with the most spare capacity over the bottleneck among
//     stages that keep at least one peer after giving one away;
//   - the mover is the donor's slowest peer (ties, within `mover_tie_tolerance` of the
//     slowest: the lowest id);
//   - the move happens only if the pipeline throughput simulated after it beats the
//     current one by `min_gain`, on `confirmations` consecutive checks that plan a
//     move between the same stages (one check suffices to fill an empty stage:
//     nothing flows until then).
// A stage is never emptied. No I/O and no clock: the caller passes `now`, so the peer
// runtime, fake-clock tests and swarm/sim run this same code.
//
//   swarm::rebalance::Rebalancer policy({.period_seconds = 300}, "p03", /*seed=*/7, now);
//   if (now >= policy.next_check_at()) {
//     auto d = policy.check(loads, num_stages, now);
//     if (d.move) move_to(d.to_stage);
//   }
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "swarm/core/random.h"
#include "swarm/core/status.h"

namespace swarm::rebalance {

// One peer as the registry shows it. Its fields are a stranger's claims: a throughput that
// is not positive and finite counts as unmeasured, and a negative queue length as 0.
struct PeerLoad {
  std::string peer_id;
  int stage = 0;
  double throughput = 0;  // samples per second it can process; 0: not measured yet
  int64_t queue_length = 0;
};

struct RebalanceConfig {
  double period_seconds = 300;   // between checks (the paper's T)
  double jitter_fraction = 0.2;  // each interval is drawn from period x [1 - j, 1 + j]
  double min_gain = 0.1;         // required relative gain of the simulated pipeline throughput
  int confirmations = 2;         // consecutive checks planning a move between the same stages
  // Donor peers this close (relative) to the slowest count as equally slow: measured
  // throughputs of equal machines differ by noise, and the mover must not flip with it.
  double mover_tie_tolerance = 0.1;

  Status validate() const;
};

// A stage's totals, with unmeasured peers counted at the swarm's median throughput.
struct StageLoad {
  int stage = 0;
  int peers = 0;
  double throughput = 0;
  int64_t queued = 0;
};

struct PlannedMove {
  std::string peer_id;
  int from_stage = 0;
  int to_stage = 0;
  double pipeline_before = 0;  // samples/s: the slowest stage's throughput now
  double pipeline_after = 0;   // and after the move
};

// The throughput a peer is planned with: its own, or the median of the measured
// peers when it has none (a new or just-moved peer), or 1 when nobody is measured.
double planned_throughput(const PeerLoad& peer, const std::vector<PeerLoad>& peers);

// Loads of stages 0 .. num_stages - 1; peers announcing another stage are ignored.
std::vector<StageLoad> stage_loads(const std::vector<PeerLoad>& peers, int num_stages);

// The slowest stage's throughput: 0 when a stage is empty.
double pipeline_throughput(const std::vector<StageLoad>& loads);

// The stage that limits the pipeline (see the file comment). -1 for no stages.
int bottleneck_stage(const std::vector<StageLoad>& loads);

// The view a peer plans with: the registry's announcements, its own record among
// them, so every peer plans on the same numbers and elects the same mover. `self`,
// its load as it measures it now, stands in only where the registry shows no record
// of it at its stage (a young DHT node's view may miss it; a peer that just moved is
// announced at its old stage a while). Its fresh measurement in place of its record
// made views differ: under load two equally fast peers each found itself the
// slowest, and both moved (rebalancing_test under CI).
std::vector<PeerLoad> planning_view(std::vector<PeerLoad> announced, const PeerLoad& self);

// The one move this view calls for, without the confirmation rule: the same answer
// for the same view at every peer. None when no move gains `min_gain`.
std::optional<PlannedMove> plan_move(const RebalanceConfig& config, const std::vector<PeerLoad>& peers,
                                     int num_stages);

// Where a peer that joins without a stage should go: the stage whose throughput, with
// this peer added, raises the pipeline most (an empty stage first; ties: the lowest total
// throughput, then the lowest index). own_throughput <= 0 plans it at the median, as
// planned_throughput does. -1 when num_stages <= 0.
int stage_most_needed(const std::vector<PeerLoad>& peers, int num_stages, double own_throughput);

struct Decision {
  bool move = false;   // this peer should move now
  int to_stage = -1;
  std::optional<PlannedMove> plan;  // what the view calls for, whoever moves (for logs)
  int confirmations = 0;            // consecutive checks that planned this same move
};

// One peer's use of the policy over time: jittered check times and the confirmation
// count. Deterministic for a given seed and sequence of calls.
class Rebalancer {
 public:
  Rebalancer(RebalanceConfig config, std::string self_id, uint64_t seed, double now);

  double next_check_at() const { return next_check_at_; }

  // Runs one check (the caller calls it once now >= next_check_at()) and schedules
  // the next. Decision::move is set only for this peer, and only once the plan held
  // on enough consecutive checks.
  Decision check(const std::vector<PeerLoad>& peers, int num_stages, double now);

  // After this peer moved (or a move failed): forget the confirmations, and check
  // again a full jittered period from now.
  void reset(double now);

  const RebalanceConfig& config() const { return config_; }

 private:
  double next_interval();

  RebalanceConfig config_;
  std::string self_id_;
  SplitMix64 random_;
  double next_check_at_ = 0;
  std::optional<PlannedMove> last_plan_;
  int confirmations_ = 0;
};

}  // namespace swarm::rebalance
