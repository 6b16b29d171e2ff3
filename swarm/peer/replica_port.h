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

template <Stage S>
class ReplicaPort final : public RoundReplica {
 public:
  ReplicaPort(std::shared_ptr<Replica<S>> replica, optim::LrSchedule schedule)
      : replica_(std::move(replica)), schedule_(schedule) {}

  int64_t step() const override { return replica_->step(); }
  uint64_t params_hash() const override { return replica_->params_hash(); }
  std::vector<std::pair<int64_t, uint64_t>> recent_hashes() const override { return replica_->recent_hashes(); }
  int64_t pending_samples() const override { return replica_->accumulated_samples(); }
  Result<Taken> take_gradients() override {
    SWARM_ASSIGN_OR_RETURN(auto g, replica_->take_gradients());
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
};

}  // namespace swarm
