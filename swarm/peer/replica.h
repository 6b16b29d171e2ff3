// replica: one peer's copy of a stage, with everything that must change together
// with its weights: the stage, its optimizers, its global step, its parameter hash
// and recent hash history, and the gradients accumulated toward the next step.
//
// One lock serializes the stage and the optimizers (neither is re-entrant). The
// peer reaches the replica through a shared pointer, so a peer that changes stage,
// or moves its replica to another device, swaps in a new Replica without touching
// its server, batcher or announcer.
//
//   auto replica = std::make_shared<Replica<GptStage<CpuBackend>>>(0, std::move(stage), optimizer);
//   auto out = replica->forward(input, nullptr);
//   replica->count_backward(8);
//   Replica<...>::Gradients g = replica->take_gradients();   // then all-reduce g.mean
#pragma once

#include <atomic>
#include <deque>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "swarm/api/stage.h"
#include "swarm/checkpoint/checkpoint.h"
#include "swarm/core/status.h"
#include "swarm/optim/lr_schedule.h"
#include "swarm/optim/optimizer.h"
#include "swarm/peer/stage_state.h"

namespace swarm {

template <Stage S>
class Replica {
 public:
  static constexpr size_t kRecentHashes = 16;

  Replica(int stage_index, S stage, const optim::OptimizerConfig& optimizer)
      : stage_index_(stage_index), stage_(std::move(stage)), adamw_(optimizer), lamb_(optimizer) {
    params_hash_ = parameters_hash(stage_);
    remember_hash();
  }

  int stage_index() const { return stage_index_; }
  StageIoSpec io_spec() const { return stage_.io_spec(); }
  bool takes_targets() const { return stage_.takes_targets(); }

  // Runs f(stage) alone with the stage (the batcher stacks requests inside it).
  template <typename F>
  auto exclusive(F&& f) {
    std::lock_guard lock(mu_);
    return f(stage_);
  }

  Result<Tensor> forward(const TensorView& input, const TensorView* targets) {
    std::lock_guard lock(mu_);
    return stage_.forward(input, targets);
  }

  Result<Tensor> backward(const TensorView& input, const TensorView& grad_output) {
    std::lock_guard lock(mu_);
    return stage_.backward(input, grad_output, nullptr);
  }

  // (loss, input gradient) for the stage that takes targets. A stage that can run
  // its backward on the forward it just did computes the forward once.
  Result<std::pair<Tensor, Tensor>> forward_and_backward(const TensorView& input, const TensorView& grad_output,
                                                        const TensorView& targets) {
    std::lock_guard lock(mu_);
    SWARM_ASSIGN_OR_RETURN(Tensor loss, stage_.forward(input, &targets));
    Result<Tensor> grad = Status(StatusCode::internal, "unset");
    if constexpr (BackwardAfterForwardStage<S>) {
      grad = stage_.backward_after_forward(grad_output);
    } else {
      grad = stage_.backward(input, grad_output, &targets);
    }
    if (!grad.is_ok()) return grad.status();
    return std::make_pair(std::move(loss), std::move(grad).value());
  }

  // A backward's samples, counted toward the next global step.
  void count_backward(int64_t samples) {
    std::lock_guard lock(mu_);
    accumulated_samples_ += samples;
    ++accumulated_microbatches_;
  }

  struct Gradients {
    std::vector<float> mean;  // in parameter_views() order, the same on every replica
    int64_t samples = 0;
    uint64_t params_hash = 0;  // of the parameters the gradients were taken at
  };

  // The mean accumulated gradient; the accumulators start again from zero, so
  // samples that arrive during a round count toward the next step.
  Gradients take_gradients() {
    std::lock_guard lock(mu_);
    Gradients out{flatten_gradients(stage_, static_cast<double>(accumulated_microbatches_)), accumulated_samples_,
                  params_hash_};
    (void)stage_.zero_grad();
    accumulated_samples_ = 0;
    accumulated_microbatches_ = 0;
    return out;
  }

  // Applies the stage's averaged gradient with LAMB and moves to global step + 1.
  // A step the optimizer refuses (non-finite) leaves the weights, not the step.
  Status apply_global_step(std::span<const float> averaged, const optim::LrSchedule& schedule) {
    std::lock_guard lock(mu_);
    std::vector<optim::ParamRef> refs;
    size_t offset = 0;
    for (auto& view : stage_.parameter_views()) {
      if (offset + static_cast<size_t>(view.value.numel()) > averaged.size()) {
        return invalid_argument("averaged gradient of {} values is too short for the stage", averaged.size());
      }
      TensorView grad(const_cast<float*>(averaged.data()) + offset, DType::f32, view.value.shape(), Device::cpu);
      offset += static_cast<size_t>(view.value.numel());
      refs.push_back({view.name, view.value, grad, view.apply_weight_decay});
    }
    const int64_t next = step_.load() + 1;
    Status stepped = lamb_.step(refs, schedule.lr_at(next));
    drop_cached_activations(stage_);
    step_ = next;
    params_hash_ = parameters_hash(stage_);
    ++optimizer_steps_;
    remember_hash();
    return stepped;
  }

  // Solo mode: a local AdamW step once `every` samples have arrived. True if it stepped.
  Result<bool> maybe_local_step(int64_t every, float peak_lr, int64_t warmup_steps) {
    std::lock_guard lock(mu_);
    if (accumulated_samples_ < every) return false;
    std::vector<optim::ParamRef> refs;
    for (auto& view : stage_.parameter_views()) refs.push_back({view.name, view.value, view.grad, view.apply_weight_decay});
    const double warmup =
        warmup_steps > 0 ? std::min(1.0, double(adamw_.steps_taken() + 1) / double(warmup_steps)) : 1.0;
    Status status = adamw_.step(refs, static_cast<float>(peak_lr * warmup));
    (void)stage_.zero_grad();
    drop_cached_activations(stage_);  // forwards kept for a later backward used the old weights
    accumulated_samples_ = 0;
    accumulated_microbatches_ = 0;
    ++optimizer_steps_;
    if (!status.is_ok()) return status;
    return true;
  }

  // Parameters and optimizer state from a checkpoint or a download; checked before
  // anything changes. Accumulated gradients are dropped (they belong to other weights).
  Status load(const Checkpoint& state) {
    std::lock_guard lock(mu_);
    SWARM_RETURN_IF_ERROR(load_stage_checkpoint(stage_, lamb_, state));
    step_ = state.step;
    params_hash_ = parameters_hash(stage_);
    (void)stage_.zero_grad();
    drop_cached_activations(stage_);
    accumulated_samples_ = 0;
    accumulated_microbatches_ = 0;
    remember_hash();
    return Status::ok();
  }

  Result<Checkpoint> checkpoint() {
    std::lock_guard lock(mu_);
    return stage_checkpoint(stage_, lamb_, step_.load());
  }

  int64_t step() const { return step_.load(); }
  int64_t parameter_count() {
    std::lock_guard lock(mu_);
    return swarm::parameter_count(stage_);
  }
  int64_t optimizer_steps() const { return optimizer_steps_.load(); }
  uint64_t params_hash() const {
    std::lock_guard lock(mu_);
    return params_hash_;
  }
  int64_t accumulated_samples() const {
    std::lock_guard lock(mu_);
    return accumulated_samples_;
  }
  std::vector<std::pair<int64_t, uint64_t>> recent_hashes() const {
    std::lock_guard lock(mu_);
    return {recent_hashes_.begin(), recent_hashes_.end()};
  }

 private:
  void remember_hash() {  // under mu_
    recent_hashes_.emplace_back(step_.load(), params_hash_);
    while (recent_hashes_.size() > kRecentHashes) recent_hashes_.pop_front();
  }

  const int stage_index_;
  mutable std::mutex mu_;
  S stage_;
  optim::AdamW adamw_;  // solo mode
  optim::Lamb lamb_;    // global steps
  std::atomic<int64_t> step_{0};
  std::atomic<int64_t> optimizer_steps_{0};
  uint64_t params_hash_ = 0;
  std::deque<std::pair<int64_t, uint64_t>> recent_hashes_;
  int64_t accumulated_samples_ = 0;  // toward step_ + 1
  int64_t accumulated_microbatches_ = 0;
};

}  // namespace swarm
