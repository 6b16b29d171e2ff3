// stub_replica: a RoundReplica small enough to run thousands of schedules, with a
// ledger of where every sample went and a stage-wide record of each step's hash.
//
// Parameters are a few floats, a sample is a seeded pseudo-gradient, and the hash
// is XXH3 of the parameter bytes: two replicas that reach one step by different
// rounds hash differently, which is what the lineage check needs to see.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "swarm/averaging/round_protocol.h"
#include "swarm/core/random.h"

namespace swarm::sync {

// Where the samples of one replica went: fed = pending + in_round + stepped + lost.
struct Ledger {
  int64_t pending = 0;   // accumulated, not taken into a round
  int64_t in_round = 0;  // taken into a round, not stepped or lost yet
  int64_t stepped = 0;
  int64_t lost = 0;
  int64_t total() const { return pending + in_round + stepped + lost; }
};

// The first hash seen at each step, stage-wide, and when the stage first got there.
class Lineage {
 public:
  // The hash recorded for `step`, or none; `hash` is recorded if there was none.
  std::optional<uint64_t> record(int64_t step, uint64_t hash, double now);
  // A lineage every holder of which died: the step's hash is the one the survivors reach.
  void replace(int64_t step, uint64_t hash) { first_[step] = hash; }
  int64_t newest() const { return first_.empty() ? 0 : first_.rbegin()->first; }

 private:
  std::map<int64_t, uint64_t> first_;
};

// What a download carries: the donor's parameters and where they stand.
struct StubState {
  std::vector<float> params;
  int64_t step = 0;
  uint64_t hash = 0;
  std::vector<std::pair<int64_t, uint64_t>> recent;
  std::vector<uint64_t> history;  // the hash at every step so far, [0] the genesis; 0 where a round skipped the step
};

class StubReplica final : public RoundReplica {
 public:
  static constexpr int kParams = 16;
  static constexpr size_t kRecent = 16;
  using OnStep = std::function<void(int64_t step, uint64_t hash)>;

  // Every replica starts from the same parameters: a fresh stage is one lineage.
  explicit StubReplica(OnStep on_step);

  // `n` samples from the trainers; their gradient is drawn from `rng`.
  void add_samples(int64_t n, SplitMix64& rng);
  // A download: the donor's state replaces this one's; gradients of the old
  // parameters are thrown away (lost).
  void load_state(const StubState& state);
  StubState snapshot() const { return {params_, step_, hash_, recent_, history_}; }
  // The hash this replica's lineage had at `step`, if it stood there (a round may count for several steps).
  std::optional<uint64_t> hash_at(int64_t step) const;

  int64_t step() const override { return step_; }
  uint64_t params_hash() const override { return hash_; }
  std::vector<std::pair<int64_t, uint64_t>> recent_hashes() const override { return recent_; }
  int64_t pending_samples() const override { return ledger_.pending; }
  Result<Taken> take_gradients() override;
  Status apply_step(std::span<const float> averaged, int64_t steps) override;
  void lose_round_samples() override;

  const Ledger& ledger() const { return ledger_; }

 private:
  void rehash();

  OnStep on_step_;
  std::vector<float> params_;
  std::vector<double> grad_sum_;
  int64_t step_ = 0;
  uint64_t hash_ = 0;
  std::vector<std::pair<int64_t, uint64_t>> recent_;
  std::vector<uint64_t> history_;
  Ledger ledger_;
};

}  // namespace swarm::sync
