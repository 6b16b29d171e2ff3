#include "tests/sync_harness/stub_replica.h"

#include <fmt/format.h>
#include <xxhash.h>

namespace swarm::sync {

std::optional<uint64_t> Lineage::record(int64_t step, uint64_t hash, double now) {
  (void)now;
  auto [it, inserted] = first_.emplace(step, hash);
  if (inserted) return std::nullopt;
  return it->second;
}

StubReplica::StubReplica(OnStep on_step) : on_step_(std::move(on_step)), params_(kParams), grad_sum_(kParams, 0.0) {
  SplitMix64 init(0x5eed);  // one genesis for every replica
  for (float& p : params_) p = static_cast<float>(init.next_unit() - 0.5);
  rehash();
  history_.push_back(hash_);
}

std::optional<uint64_t> StubReplica::hash_at(int64_t step) const {
  if (step < 0 || step >= static_cast<int64_t>(history_.size()) || history_[static_cast<size_t>(step)] == 0) {
    return std::nullopt;
  }
  return history_[static_cast<size_t>(step)];
}

void StubReplica::rehash() {
  hash_ = XXH3_64bits(params_.data(), params_.size() * sizeof(float));
}

void StubReplica::add_samples(int64_t n, SplitMix64& rng) {
  for (int64_t s = 0; s < n; ++s) {
    for (double& g : grad_sum_) g += rng.next_unit() - 0.5;
  }
  ledger_.pending += n;
}

void StubReplica::load_state(const StubState& state) {
  params_ = state.params;
  step_ = state.step;
  hash_ = state.hash;
  recent_ = state.recent;
  history_ = state.history;
  ledger_.lost += ledger_.pending + ledger_.in_round;
  ledger_.pending = ledger_.in_round = 0;
  std::fill(grad_sum_.begin(), grad_sum_.end(), 0.0);
}

Result<RoundReplica::Taken> StubReplica::take_gradients() {
  Taken t;
  t.samples = ledger_.pending;
  t.mean.assign(params_.size(), 0.0f);
  if (t.samples > 0) {
    for (size_t i = 0; i < params_.size(); ++i) t.mean[i] = static_cast<float>(grad_sum_[i] / double(t.samples));
  }
  std::fill(grad_sum_.begin(), grad_sum_.end(), 0.0);
  ledger_.in_round += ledger_.pending;
  ledger_.pending = 0;
  return t;
}

Status StubReplica::apply_step(std::span<const float> averaged, int64_t steps) {
  if (averaged.size() != params_.size()) {
    return invalid_argument("an averaged gradient of {} values for {} parameters", averaged.size(), params_.size());
  }
  if (steps < 1) return invalid_argument("a round that counts for {} steps", steps);
  constexpr float kLr = 0.1f;
  for (size_t i = 0; i < params_.size(); ++i) params_[i] -= kLr * averaged[i];
  step_ += steps;
  rehash();
  recent_.emplace_back(step_, hash_);
  if (recent_.size() > kRecent) recent_.erase(recent_.begin());
  history_.resize(static_cast<size_t>(step_), 0);  // the steps this round stood for but nobody stood at
  history_.push_back(hash_);
  ledger_.stepped += ledger_.in_round;
  ledger_.in_round = 0;
  if (on_step_) on_step_(step_, hash_);
  return Status::ok();
}

void StubReplica::lose_round_samples() {
  ledger_.lost += ledger_.in_round;
  ledger_.in_round = 0;
}

}  // namespace swarm::sync
