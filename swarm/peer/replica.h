// replica: one peer's copy of a stage, with everything that must change together
// with its weights: the stage, its optimizers, its global step, its parameter hash
// and recent hash history, and the gradients accumulated toward the next step.
//
// One lock serializes the stage and the optimizers (neither is re-entrant). The
// peer reaches the replica through a shared pointer, so a peer that changes stage,
// or moves its replica to another device, swaps in a new Replica without touching
// its server, batcher or announcer.
//
// The replica never reads parameters or gradients itself: they stay on the device
// the stage computes on. The optimizer steps run in a ParameterUpdater for that
// device (the stage names it as `updater_type`; host stages get HostUpdater), and
// the all-reduce, the hash and checkpoints reach the host through stage_state.h.
//
// A backward's gradient and its samples are added in one critical section, at most
// once per microbatch id, and only if its deadline has not passed by the end of
// the compute (otherwise the gradients are put back as they were). The replica
// keeps the stage's SampleLedger: where every accepted sample went.
//
//   auto replica = std::make_shared<Replica<GptStage<CpuBackend>>>(0, std::move(stage), optimizer);
//   auto out = replica->forward(input, nullptr);
//   auto grad = replica->backward(input, grad_output, BackwardTicket{id, deadline_ms, 8});
//   SWARM_ASSIGN_OR_RETURN(auto g, replica->take_gradients());   // then all-reduce g.mean
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <span>
#include <unordered_set>
#include <utility>
#include <vector>

#include "swarm/api/stage.h"
#include "swarm/api/updater.h"
#include "swarm/checkpoint/checkpoint.h"
#include "swarm/core/log.h"
#include "swarm/core/status.h"
#include "swarm/optim/host_updater.h"
#include "swarm/optim/lr_schedule.h"
#include "swarm/optim/optimizer.h"
#include "swarm/peer/stage_state.h"
#include "swarm/protocol/stage_protocol.h"

namespace swarm {

// What the replica needs to accept one backward.
struct BackwardTicket {
  uint64_t microbatch_id = 0;
  int64_t deadline_unix_ms = 0;  // not accumulated once this has passed
  int64_t samples = 0;
  // Runs after the compute, before the deadline check: an emulated slow machine
  // sleeps out its extra time here, so the check sees when its work really ends.
  std::function<void()> after_compute;
};

namespace detail {
template <typename S>
struct updater_of {
  using type = optim::HostUpdater;
};
template <typename S>
  requires requires { typename S::updater_type; }
struct updater_of<S> {
  using type = typename S::updater_type;
};
}  // namespace detail

// The updater of a stage's device: S::updater_type, or HostUpdater.
template <typename S>
using stage_updater_t = typename detail::updater_of<S>::type;

template <Stage S, ParameterUpdater U = stage_updater_t<S>>
class Replica {
 public:
  static constexpr size_t kRecentHashes = 16;
  // Microbatch ids remembered against duplicates: far more than are in flight
  // across a swarm within a timeout, a few hundred KiB.
  static constexpr size_t kRememberedMicrobatches = 16384;

  Replica(int stage_index, S stage, const optim::OptimizerConfig& optimizer)
      : stage_index_(stage_index),
        stage_(std::move(stage)),
        solo_(optimizer, optim::Rule::adamw),
        global_(optimizer, optim::Rule::lamb) {
    // A device that cannot copy its weights out fails every later call as well.
    params_hash_ = whole_state_hash().value_or(0);
    remember_hash();
  }

  int stage_index() const { return stage_index_; }
  StageIoSpec io_spec() const { return stage_.io_spec(); }
  bool takes_targets() const { return stage_.takes_targets(); }

  // Runs f(stage) alone with the stage (the batcher stacks requests inside it).
  // A forward, like a backward, waits for a round's step (wait_for_round_step),
  // and first for a round to take the gradients pending here (hold_forwards_for_pending).
  template <typename F>
  auto exclusive(F&& f) {
    std::unique_lock lock(mu_);
    await_pending_taken(lock);
    await_round_step(lock);
    return f(stage_);
  }

  Result<Tensor> forward(const TensorView& input, const TensorView* targets) {
    std::unique_lock lock(mu_);
    await_pending_taken(lock);
    await_round_step(lock);
    return stage_.forward(input, targets);
  }

  // Errors besides the stage's: already_exists for a microbatch id already
  // accumulated, deadline_exceeded when the deadline passed before or during the
  // compute (nothing accumulated either way).
  Result<Tensor> backward(const TensorView& input, const TensorView& grad_output, const BackwardTicket& ticket) {
    return accumulate(ticket, [&] { return stage_.backward(input, grad_output, nullptr); });
  }

  // (loss, input gradient) for the stage that takes targets. A stage that can run
  // its backward on the forward it just did computes the forward once.
  Result<std::pair<Tensor, Tensor>> forward_and_backward(const TensorView& input, const TensorView& grad_output,
                                                        const TensorView& targets, const BackwardTicket& ticket) {
    return accumulate(ticket, [&]() -> Result<std::pair<Tensor, Tensor>> {
      SWARM_ASSIGN_OR_RETURN(Tensor loss, stage_.forward(input, &targets));
      Result<Tensor> grad = Status(StatusCode::internal, "unset");
      if constexpr (BackwardAfterForwardStage<S>) {
        grad = stage_.backward_after_forward(grad_output);
      } else {
        grad = stage_.backward(input, grad_output, &targets);
      }
      if (!grad.is_ok()) return grad.status();
      return std::make_pair(std::move(loss), std::move(grad).value());
    });
  }

  // Requests refused before they reached the replica, for the ledger.
  void count_expired() { change_ledger([](protocol::SampleLedger& l) { ++l.expired_dropped; }); }
  void count_deadline_refused() { change_ledger([](protocol::SampleLedger& l) { ++l.deadline_refused; }); }

  // A consistent copy; never waits for a compute.
  protocol::SampleLedger sample_ledger() const {
    std::lock_guard lock(ledger_mu_);
    return ledger_;
  }

  // The samples of the last take_gradients() whose round failed. Their gradients
  // left the stage with take_gradients, so mu_ is not needed.
  void lose_round_samples() {
    {
      std::lock_guard lock(mu_);
      end_round();
    }
    change_ledger([](protocol::SampleLedger& l) { move_samples(l.samples_in_round, l.samples_lost_failed_round); });
  }

  // The round that took the last gradients ended without a step; the protocol
  // holds them for its next attempt, and nothing waits on this round any more.
  void round_aborted() {
    std::lock_guard lock(mu_);
    end_round();
  }

  // The peer leaves this stage without a round to take its pending samples: their
  // gradients go with this replica, and the ledger says where.
  void lose_pending_to_move() {
    std::lock_guard lock(mu_);
    (void)stage_.zero_grad();
    accumulated_microbatches_ = 0;
    round_step_cv_.notify_all();  // nothing pending to hold forwards for
    change_ledger([](protocol::SampleLedger& l) { move_samples(l.samples_pending, l.samples_lost_moved); });
  }

  // A forward or backward that arrives while this replica's gradients are in a
  // round waits, up to `seconds`, for the round's step: its gradient is then taken
  // at the weights it will be applied to, not one step before them (2 peers per
  // stage ended 2.4% worse at equal tokens with every such backward one step
  // stale), and a forward's activations, which the next stage's gradient follows,
  // come from those weights too. The wait is bounded so that a round stuck on a
  // silent member costs each request at most that long. 0: never wait.
  void wait_for_round_step(double seconds) {
    std::lock_guard lock(mu_);
    round_wait_seconds_ = seconds;
  }

  // A forward that arrives while gradients accumulated here wait for a round
  // waits, up to `seconds`, for a round to take them (and then for its step): its
  // activations, and the next stage's gradient that follows them, come from the
  // weights that round produces, not the ones it replaces. Without it about half
  // the main job's microbatches ran their forward one global step before their
  // backward, and more (58%) with 2 peers per stage, whose rounds form over the
  // network; with a 20 ms hold both setups ended lower (bench/sync/fidelity.sh,
  // docs/RUNNING.md "Fidelity"). A short hold bounds what a slow round costs each forward.
  // Only for global steps: in solo mode no round ever takes them. 0: never wait.
  void hold_forwards_for_pending(double seconds) {
    std::lock_guard lock(mu_);
    pending_hold_seconds_ = seconds;
  }

  struct Gradients {
    std::vector<float> mean;  // in parameter_views() order, the same on every replica
    int64_t samples = 0;
    uint64_t params_hash = 0;  // of the parameters the gradients were taken at
  };

  // The mean accumulated gradient; the accumulators start again from zero, so
  // samples that arrive during a round count toward the next step.
  // An error (the device could not copy them out) leaves them accumulated.
  Result<Gradients> take_gradients() {
    std::lock_guard lock(mu_);
    SWARM_ASSIGN_OR_RETURN(std::vector<float> mean,
                           flatten_gradients(stage_, static_cast<double>(accumulated_microbatches_)));
    Gradients out{std::move(mean), sample_ledger().samples_pending, params_hash_};
    in_round_ = true;
    round_step_cv_.notify_all();  // forwards held for the pending gradients go on to wait for the step
    (void)stage_.zero_grad();
    accumulated_microbatches_ = 0;
    change_ledger([](protocol::SampleLedger& l) { move_samples(l.samples_pending, l.samples_in_round); });
    return out;
  }

  // Applies the stage's averaged gradient with LAMB and moves to global step +
  // `steps`: a round that took several global batches' samples counts for as many
  // steps, so the step (and the learning-rate schedule on it) follows samples.
  // A step the optimizer refuses (non-finite) leaves the weights, not the step.
  // The round's samples (those of the last take_gradients) are stepped or lost.
  Status apply_global_step(std::span<const float> averaged, const optim::LrSchedule& schedule, int64_t steps = 1) {
    std::lock_guard lock(mu_);
    if (averaged.size() != static_cast<size_t>(swarm::parameter_count(stage_))) {
      end_round();
      change_ledger([](protocol::SampleLedger& l) { move_samples(l.samples_in_round, l.samples_lost_failed_round); });
      return invalid_argument("an averaged gradient of {} values for a stage of {}", averaged.size(),
                              swarm::parameter_count(stage_));
    }
    const int64_t next = step_.load() + std::max<int64_t>(steps, 1);
    // A round that stands for several global batches applies their averaged
    // gradient once per batch, each at its step's learning rate: one LAMB update
    // moves each tensor by about lr times its norm whatever the batch, so a single
    // update would move the stage as far as one batch where one peer moves it as
    // far as several (2 peers per stage had ~2.7% of rounds at 2 batches).
    Status stepped = Status::ok();
    for (int64_t s = step_.load() + 1; s <= next && stepped.is_ok(); ++s) {
      stepped = global_.step_with_gradients(stage_.parameter_views(), averaged, schedule.lr_at(s));
      ++optimizer_steps_;
    }
    change_ledger([&](protocol::SampleLedger& l) {
      move_samples(l.samples_in_round, stepped.is_ok() ? l.samples_stepped : l.samples_lost_nonfinite);
    });
    drop_cached_activations(stage_);
    end_round();
    step_ = next;
    params_hash_ = whole_state_hash().value_or(0);
    remember_hash();
    return stepped;
  }

  // Solo mode: a local AdamW step once `every` samples have arrived. True if it stepped.
  Result<bool> maybe_local_step(int64_t every, float peak_lr, int64_t warmup_steps) {
    std::lock_guard lock(mu_);
    if (sample_ledger().samples_pending < every) return false;
    const double warmup =
        warmup_steps > 0 ? std::min(1.0, double(solo_.steps_taken() + 1) / double(warmup_steps)) : 1.0;
    Status status = solo_.step(stage_.parameter_views(), static_cast<float>(peak_lr * warmup));
    (void)stage_.zero_grad();
    drop_cached_activations(stage_);  // forwards kept for a later backward used the old weights
    accumulated_microbatches_ = 0;
    change_ledger([&](protocol::SampleLedger& l) {
      move_samples(l.samples_pending, status.is_ok() ? l.samples_stepped : l.samples_lost_nonfinite);
    });
    ++optimizer_steps_;
    if (!status.is_ok()) return status;
    return true;
  }

  // Parameters and optimizer state from a checkpoint or a download; checked before
  // anything changes. Accumulated gradients are dropped (they belong to other weights).
  Status load(const Checkpoint& state) {
    std::lock_guard lock(mu_);
    SWARM_RETURN_IF_ERROR(load_stage_checkpoint(stage_, global_, state));
    end_round();
    step_ = state.step;
    SWARM_ASSIGN_OR_RETURN(params_hash_, whole_state_hash());
    (void)stage_.zero_grad();
    drop_cached_activations(stage_);
    accumulated_microbatches_ = 0;
    change_ledger([](protocol::SampleLedger& l) { move_samples(l.samples_pending, l.samples_lost_resync); });
    remember_hash();
    return Status::ok();
  }

  Result<Checkpoint> checkpoint() {
    std::lock_guard lock(mu_);
    SWARM_ASSIGN_OR_RETURN(OptimizerState optimizer_state, global_.export_state());
    return stage_checkpoint(stage_, optimizer_state, step_.load());
  }

  int64_t step() const { return step_.load(); }
  int64_t parameter_count() {
    std::lock_guard lock(mu_);
    return swarm::parameter_count(stage_);
  }
  int64_t optimizer_steps() const { return optimizer_steps_.load(); }
  // The hash stage-mates vouch for. Named for what it once covered; it is of the
  // whole state now (stage_state_hash): parameters, optimizer state and step.
  uint64_t params_hash() const {
    std::lock_guard lock(mu_);
    return params_hash_;
  }
  int64_t accumulated_samples() const { return sample_ledger().samples_pending; }
  std::vector<std::pair<int64_t, uint64_t>> recent_hashes() const {
    std::lock_guard lock(mu_);
    return {recent_hashes_.begin(), recent_hashes_.end()};
  }

 private:
  void end_round() {  // under mu_: backwards waiting for the round's step go on
    in_round_ = false;
    round_step_cv_.notify_all();
  }

  // Under mu_: what params_hash() answers, of parameters, optimizer state and step.
  Result<uint64_t> whole_state_hash() {
    SWARM_ASSIGN_OR_RETURN(OptimizerState optimizer_state, global_.export_state());
    return stage_state_hash(stage_, optimizer_state, step_.load());
  }

  void remember_hash() {  // under mu_
    recent_hashes_.emplace_back(step_.load(), params_hash_);
    while (recent_hashes_.size() > kRecentHashes) recent_hashes_.pop_front();
  }

  // Ledger changes that go with the gradients are made under mu_ too; readers
  // take only ledger_mu_, which is never held while taking another lock.
  template <typename Change>
  void change_ledger(Change change) {
    std::lock_guard lock(ledger_mu_);
    change(ledger_);
  }

  static void add_samples(int64_t& to, int64_t samples) {
    if (__builtin_add_overflow(to, samples, &to)) to = INT64_MAX;
  }
  static void move_samples(int64_t& from, int64_t& to) {
    add_samples(to, from);
    from = 0;
  }

  void await_pending_taken(std::unique_lock<std::mutex>& lock) {
    if (accumulated_microbatches_ > 0 && !in_round_ && pending_hold_seconds_ > 0) {
      round_step_cv_.wait_for(lock, std::chrono::duration<double>(pending_hold_seconds_),
                              [&] { return accumulated_microbatches_ == 0 || in_round_; });
    }
  }

  void await_round_step(std::unique_lock<std::mutex>& lock) {
    if (in_round_ && round_wait_seconds_ > 0) {
      round_step_cv_.wait_for(lock, std::chrono::duration<double>(round_wait_seconds_), [&] { return !in_round_; });
    }
  }

  // The one place a backward reaches the gradients: refused before compute when a
  // duplicate or expired, rolled back when it failed or outlived its deadline.
  template <typename Compute>
  auto accumulate(const BackwardTicket& ticket, Compute compute) -> decltype(compute()) {
    std::unique_lock lock(mu_);
    await_round_step(lock);
    if (seen_microbatches_.count(ticket.microbatch_id) != 0) {
      change_ledger([](protocol::SampleLedger& l) { ++l.backward_duplicates_refused; });
      return already_exists("microbatch {:016x} was already accumulated by this replica", ticket.microbatch_id);
    }
    if (Status timely = expired(ticket); !timely.is_ok()) return timely;
    SWARM_RETURN_IF_ERROR(save_gradients());  // refused before any compute
    auto result = compute();
    if (ticket.after_compute) ticket.after_compute();
    Status done = result.is_ok() ? expired(ticket) : result.status();
    // Finite inputs can still overflow (1e30 times 1e10): such a backward would spoil
    // every sample of the step beside it, and its reply could not be encoded anyway.
    if (done.is_ok() && !(finite_outputs(*result) && gradients_finite(stage_).value_or(false))) {
      done = invalid_argument("backward of microbatch {:016x} overflowed to a non-finite value; not accumulated",
                              ticket.microbatch_id);
    }
    if (!done.is_ok()) {
      // Only a failing device cannot copy them back; say so rather than hide it.
      if (Status restored = restore_gradients(); !restored.is_ok()) {
        log_warn("replica of stage {}: could not restore gradients: {}", stage_index_, restored.to_string());
      }
      return done;
    }
    remember_microbatch(ticket.microbatch_id);
    ++accumulated_microbatches_;
    change_ledger([&](protocol::SampleLedger& l) {
      add_samples(l.samples_accumulated_total, ticket.samples);
      add_samples(l.samples_pending, ticket.samples);
    });
    return result;
  }

  static bool finite(const Tensor& t) {
    if (!t.defined() || t.dtype() != DType::f32) return true;
    const float* v = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (!std::isfinite(v[i])) return false;
    }
    return true;
  }
  static bool finite_outputs(const Tensor& grad) { return finite(grad); }
  static bool finite_outputs(const std::pair<Tensor, Tensor>& loss_and_grad) {
    return finite(loss_and_grad.first) && finite(loss_and_grad.second);
  }
  Status expired(const BackwardTicket& ticket) {
    const int64_t now = protocol::unix_millis_now();
    if (ticket.deadline_unix_ms > now) return Status::ok();
    change_ledger([](protocol::SampleLedger& l) { ++l.expired_dropped; });
    return deadline_exceeded("backward of microbatch {:016x} outlived its deadline by {} ms; not accumulated",
                             ticket.microbatch_id, now - ticket.deadline_unix_ms);
  }

  // With nothing accumulated the gradients are zero: no copy to take (half the
  // backwards at two microbatches per step). Otherwise one copy of the
  // gradients on their device, small beside the backward that writes them.
  Status save_gradients() {
    if (accumulated_microbatches_ == 0) return Status::ok();
    return snapshot_gradients(stage_, saved_gradients_);
  }

  Status restore_gradients() {
    if (accumulated_microbatches_ == 0) return stage_.zero_grad();
    return swarm::restore_gradients(stage_, saved_gradients_);
  }

  void remember_microbatch(uint64_t id) {
    seen_microbatches_.insert(id);
    seen_order_.push_back(id);
    while (seen_order_.size() > kRememberedMicrobatches) {
      seen_microbatches_.erase(seen_order_.front());
      seen_order_.pop_front();
    }
  }

  const int stage_index_;
  mutable std::mutex mu_;
  std::condition_variable round_step_cv_;  // a round's step (or failure) ended in_round_
  double pending_hold_seconds_ = 0;        // see hold_forwards_for_pending
  bool in_round_ = false;                  // take_gradients ran; its step has not
  double round_wait_seconds_ = 0;
  S stage_;
  U solo_;    // AdamW, solo mode
  U global_;  // LAMB, global steps; checkpoints and downloads carry its state
  std::atomic<int64_t> step_{0};
  std::atomic<int64_t> optimizer_steps_{0};
  uint64_t params_hash_ = 0;  // whole_state_hash() after the last step or load
  std::deque<std::pair<int64_t, uint64_t>> recent_hashes_;
  int64_t accumulated_microbatches_ = 0;  // toward step_ + 1
  std::vector<Tensor> saved_gradients_;   // on the stage's device
  std::unordered_set<uint64_t> seen_microbatches_;
  std::deque<uint64_t> seen_order_;        // oldest first, to forget them in order
  mutable std::mutex ledger_mu_;
  protocol::SampleLedger ledger_;          // samples_pending: toward step_ + 1
};

}  // namespace swarm
