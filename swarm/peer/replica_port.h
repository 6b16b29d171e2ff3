// replica_port: a peer's Replica as the round protocol sees it (RoundReplica).
//
// The protocol (swarm/averaging/round_protocol.h) knows no stage type; this adapter
// gives it the replica's step, hashes and samples, takes its gradients into a round
// and applies the averaged one with LAMB at the schedule's learning rate.
#pragma once

#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "swarm/averaging/round_protocol.h"
#include "swarm/optim/lr_schedule.h"
#include "swarm/peer/replica.h"

namespace swarm {

// For attack tests: a peer that plays a Byzantine stage-mate sends its gradient
// times `factor` to its rounds from global step `from_step` on (100 scales it up,
// -1 flips its sign); it applies the rounds' averages as an honest peer does.
struct ContributionScale {
  float factor = 1.0f;
  int64_t from_step = 0;
};

template <Stage S>
class ReplicaPort final : public RoundReplica {
 public:
  ReplicaPort(std::shared_ptr<Replica<S>> replica, optim::LrSchedule schedule, ContributionScale contribution_scale = {})
      : replica_(std::move(replica)), schedule_(schedule), contribution_scale_(contribution_scale) {}

  int64_t step() const override { return replica_->step(); }
  uint64_t params_hash() const override { return replica_->params_hash(); }
  std::vector<std::pair<int64_t, uint64_t>> recent_hashes() const override { return replica_->recent_hashes(); }
  int64_t pending_samples() const override { return replica_->accumulated_samples(); }
  Result<Taken> take_gradients() override {
    SWARM_ASSIGN_OR_RETURN(auto g, replica_->take_gradients());
    if (contribution_scale_.factor != 1.0f && replica_->step() >= contribution_scale_.from_step) {
      for (float& x : g.mean) x *= contribution_scale_.factor;
    }
    return Taken{std::move(g.mean), g.samples};
  }
  Status apply_step(std::span<const float> averaged, int64_t steps) override {
    return replica_->apply_global_step(averaged, schedule_, steps);
  }
  void lose_round_samples() override { replica_->lose_round_samples(); }
  void round_aborted() override { replica_->round_aborted(); }

 private:
  std::shared_ptr<Replica<S>> replica_;
  const optim::LrSchedule schedule_;
  const ContributionScale contribution_scale_;
};

}  // namespace swarm
