// training_loop: keeps microbatches flowing through a swarm and reports steps.
//
// Each trainer gets `in_flight` worker threads, created once for the whole
// run; a worker starts its next microbatch as soon as its last one ends, so the
// pipeline never drains between steps (DESIGN.md 5.2, "the trainer flows").
// Steps exist only for reporting: microbatches are numbered in start order over
// all trainers, step k is [(k - first_step) * per_step, ... + per_step), and its
// report goes to the sink, in step order and from the thread that called run(),
// once every microbatch of it has ended. In-flight microbatches always end
// before run() returns, so each trainer's ledger balances.
//
//   TrainingLoop<SwarmTrainer> loop({&trainer}, std::move(samplers), options,
//                                   [](const StepReport& report) { ... });
//   TrainingLoop<SwarmTrainer, Points> points_loop({&trainer}, {Points(seed)}, options, sink);
//   SWARM_ASSIGN_OR_RETURN(TrainingSummary summary, loop.run());
//   SWARM_ASSIGN_OR_RETURN(double loss, validation_loss(trainer, windows));
//
// The trainer and the data source are template parameters: this header knows no
// transport, registry, peer or model (BatchSampler is the default source, for
// validation windows of tokens).
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "swarm/api/data_source.h"
#include "swarm/core/clock.h"
#include "swarm/core/log.h"
#include "swarm/core/status.h"
#include "swarm/core/tensor.h"
#include "swarm/data/batch_sampler.h"
#include "swarm/trainer/metric_means.h"

namespace swarm {

// The loss stage's metrics of an outcome, for a trainer whose outcomes carry them.
template <typename Outcome>
const std::vector<float>* metrics_of(const Outcome& outcome) {
  if constexpr (requires { { outcome.metrics } -> std::convertible_to<const std::vector<float>&>; }) {
    return &outcome.metrics;
  } else {
    return nullptr;
  }
}

// What the loop needs of a trainer (Trainer<Router, Transport, Registry> is one):
// thread-safe run_microbatch and evaluate, and a ledger of what it started.
template <typename T>
concept LoopTrainer = requires(T& trainer, const T& const_trainer, const Tensor& tensor) {
  { trainer.run_microbatch(tensor, tensor).completed } -> std::convertible_to<bool>;
  { trainer.run_microbatch(tensor, tensor).loss } -> std::convertible_to<double>;
  { trainer.run_microbatch(tensor, tensor).abandon_reason } -> std::convertible_to<std::string>;
  { trainer.evaluate(tensor, tensor).completed } -> std::convertible_to<bool>;
  { const_trainer.ledger().started } -> std::convertible_to<int64_t>;
  { const_trainer.ledger().completed } -> std::convertible_to<int64_t>;
  { const_trainer.ledger().abandoned } -> std::convertible_to<int64_t>;
  { const_trainer.ledger().retries } -> std::convertible_to<int64_t>;
};

// The trainers' ledgers, summed.
struct LedgerTotals {
  int64_t started = 0;
  int64_t completed = 0;
  int64_t abandoned = 0;
  int64_t retries = 0;
  bool balanced() const { return started == completed + abandoned; }
};

// One microbatch's life, in seconds since run() began.
struct MicrobatchSpan {
  int64_t index = 0;  // in start order, from 0
  int trainer = 0;
  double started = 0;
  double ended = 0;
  bool completed = false;
};

struct StepReport {
  int64_t step = 0;
  int microbatches = 0;  // per_step, or fewer for a last step that a stop cut short
  int completed = 0;
  std::optional<double> loss;  // mean over its completed microbatches; none if none completed
  std::vector<double> metrics;  // the loss stage's metrics, the same way; empty if none
  double tokens_per_second = 0;  // completed units (tokens of a token source) per second, sliding window
  double seconds = 0;            // since run() began
  LedgerTotals ledger;           // over all trainers, when the report was made
  std::vector<MicrobatchSpan> spans;  // in start order
};

enum class StopReason { finished, time_limit, stop_requested };

struct TrainingSummary {
  int64_t last_step = 0;  // the last step reported; first_step - 1 if none
  int64_t steps_reported = 0;
  int64_t tokens = 0;  // units in completed microbatches
  double seconds = 0;
  LedgerTotals ledger;
  StopReason stopped_by = StopReason::finished;
};

struct TrainingLoopOptions {
  int64_t first_step = 1;  // a resumed run numbers on from where it was
  int64_t last_step = 1;
  int microbatches_per_step = 1;  // over all trainers
  int in_flight = 1;              // per trainer
  double time_limit_seconds = 0;  // 0: none
  // Asked on the calling thread, between reports (about every 20 ms).
  std::function<bool()> stop_requested;
  double throughput_window_seconds = 10;
  size_t metrics = 0;  // the loss stage's metrics (its io_spec's names) averaged into each step's report
};

// Runs on the thread that called run(), never on a worker; it must not throw.
using StepSink = std::function<void(const StepReport&)>;

template <LoopTrainer T, DataSource D = BatchSampler>
class TrainingLoop {
 public:
  // One source per trainer; the trainers must outlive the loop.
  TrainingLoop(std::vector<T*> trainers, std::vector<D> sources, TrainingLoopOptions options, StepSink sink)
      : trainers_(std::move(trainers)), sources_(std::move(sources)), source_mu_(sources_.size()),
        options_(std::move(options)), sink_(std::move(sink)) {}

  // Trains until every step has ended, the time limit, a stop or a source's
  // error. Errors: invalid_argument for options it cannot run; a source's own
  // error, after every microbatch in flight has ended.
  Result<TrainingSummary> run() {
    SWARM_RETURN_IF_ERROR(check_options());
    reset();
    if (options_.stop_requested && options_.stop_requested()) close(StopReason::stop_requested);
    std::vector<std::thread> workers;
    for (int t = 0; t < static_cast<int>(trainers_.size()); ++t) {
      for (int w = 0; w < options_.in_flight; ++w) workers.emplace_back([this, t] { work(t); });
    }
    report_until_done();
    for (auto& worker : workers) worker.join();
    if (!source_error_.is_ok()) return source_error_;
    return summary();
  }

  // Steps [first, last] of the same run, after an earlier run(): the sources go on
  // where they stopped, so a run can pause between segments (to evaluate, say).
  // The time limit counts from this call; 0: none.
  Result<TrainingSummary> run_steps(int64_t first, int64_t last, double time_limit_seconds) {
    options_.first_step = first;
    options_.last_step = last;
    options_.time_limit_seconds = time_limit_seconds;
    return run();
  }

  // From any thread while run() runs: start no more microbatches (the
  // in-flight ones end, and run() returns once they have).
  void request_stop() {
    std::lock_guard lock(mu_);
    close_locked(StopReason::stop_requested);
  }

 private:
  using Clock = std::chrono::steady_clock;

  struct Claim {
    int64_t index = 0;
    double started = 0;
  };

  // What has ended of one step so far.
  struct StepTally {
    int ended = 0;
    int completed = 0;
    double loss_sum = 0;
    std::optional<MetricMeans> metrics;
    std::vector<MicrobatchSpan> spans;
  };

  Status check_options() const {
    if (trainers_.empty() || trainers_.size() != sources_.size()) {
      return invalid_argument("the loop needs one data source per trainer ({} trainers, {} sources)",
                              trainers_.size(), sources_.size());
    }
    if (options_.microbatches_per_step < 1 || options_.in_flight < 1 || options_.last_step < options_.first_step) {
      return invalid_argument("microbatches per step and in-flight counts must be >= 1, and last_step >= first_step");
    }
    return Status::ok();
  }

  void reset() {
    std::lock_guard lock(mu_);
    started_at_ = Clock::now();
    total_ = (options_.last_step - options_.first_step + 1) * options_.microbatches_per_step;
    next_index_ = 0;
    closed_ = false;
    stopped_by_ = StopReason::finished;
    tallies_.clear();
    tokens_ = 0;
    source_error_ = Status::ok();
    running_ = static_cast<int>(trainers_.size()) * options_.in_flight;
    next_report_ = 0;
    steps_reported_ = 0;
    throughput_samples_ = {{0.0, 0}};
  }

  double now() const { return std::chrono::duration<double>(Clock::now() - started_at_).count(); }

  void close(StopReason reason) {
    std::lock_guard lock(mu_);
    close_locked(reason);
  }

  void close_locked(StopReason reason) {
    if (closed_) return;
    closed_ = true;
    stopped_by_ = reason;
    ended_cv_.notify_all();
  }

  void work(int trainer) {
    while (std::optional<Claim> claim = next_claim()) {
      Result<Microbatch> batch = next_batch(trainer);
      if (!batch.is_ok()) {
        fail(*claim, trainer, batch.status());
        break;
      }
      auto outcome = trainers_[trainer]->run_microbatch(batch->inputs, batch->targets);
      if (!outcome.completed) log_warn("microbatch {} abandoned: {}", claim->index, outcome.abandon_reason);
      end(*claim, trainer, outcome.completed, outcome.loss, metrics_of(outcome), batch->units);
    }
    std::lock_guard lock(mu_);
    --running_;
    ended_cv_.notify_all();
  }

  std::optional<Claim> next_claim() {
    std::lock_guard lock(mu_);
    if (closed_ || next_index_ >= total_) return std::nullopt;
    const double t = now();
    if (options_.time_limit_seconds > 0 && t >= options_.time_limit_seconds) {
      close_locked(StopReason::time_limit);
      return std::nullopt;
    }
    return Claim{next_index_++, t};
  }

  Result<Microbatch> next_batch(int trainer) {
    std::lock_guard lock(source_mu_[trainer]);
    return sources_[trainer].next();
  }

  // A source that cannot give a microbatch ends the run: its claim ends unstarted
  // (no trainer saw it), and run() returns the source's error.
  void fail(const Claim& claim, int trainer, const Status& error) {
    log_error("trainer {}'s data source failed: {}", trainer, error.to_string());
    end(claim, trainer, false, 0, nullptr, 0);
    std::lock_guard lock(mu_);
    if (source_error_.is_ok()) source_error_ = error;
    close_locked(StopReason::stop_requested);
  }

  void end(const Claim& claim, int trainer, bool completed, double loss, const std::vector<float>* metrics,
           int64_t tokens) {
    std::lock_guard lock(mu_);
    StepTally& tally = tallies_[claim.index / options_.microbatches_per_step];
    ++tally.ended;
    tally.spans.push_back({claim.index, trainer, claim.started, now(), completed});
    if (completed) {
      ++tally.completed;
      tally.loss_sum += loss;
      if (!tally.metrics) tally.metrics.emplace(options_.metrics);
      tally.metrics->add(metrics ? *metrics : std::vector<float>(), 1.0);
      tokens_ += tokens;
    }
    ended_cv_.notify_all();
  }

  // Microbatches of step `offset` (from 0) started so far; final once claims are closed.
  int claimed_in(int64_t offset) const {
    const int64_t claimed = std::min(next_index_, total_) - offset * options_.microbatches_per_step;
    return static_cast<int>(std::clamp<int64_t>(claimed, 0, options_.microbatches_per_step));
  }

  bool next_step_ended() const {
    const int claimed = claimed_in(next_report_);
    if (claimed == 0) return false;
    const bool final_count = claimed == options_.microbatches_per_step || closed_ || next_index_ >= total_;
    auto it = tallies_.find(next_report_);
    return final_count && it != tallies_.end() && it->second.ended == claimed;
  }

  // The calling thread's side: reports steps as they end, asks the stop
  // predicate between them, and returns once every worker has finished.
  void report_until_done() {
    std::unique_lock lock(mu_);
    while (true) {
      ended_cv_.wait_for(lock, std::chrono::milliseconds(20), [&] { return next_step_ended() || running_ == 0; });
      while (next_step_ended()) emit_next(lock);
      if (running_ == 0) return;
      lock.unlock();
      const bool stop = options_.stop_requested && options_.stop_requested();
      lock.lock();
      if (stop) close_locked(StopReason::stop_requested);
    }
  }

  // Called with the lock held; the sink runs without it, so workers keep going.
  void emit_next(std::unique_lock<std::mutex>& lock) {
    StepTally tally = std::move(tallies_[next_report_]);
    tallies_.erase(next_report_);
    StepReport report;
    report.step = options_.first_step + next_report_++;
    report.seconds = now();
    report.tokens_per_second = window_rate(report.seconds, tokens_);
    ++steps_reported_;
    lock.unlock();
    report.microbatches = tally.ended;
    report.completed = tally.completed;
    if (tally.completed > 0) report.loss = tally.loss_sum / tally.completed;
    if (tally.metrics) report.metrics = tally.metrics->means();
    std::sort(tally.spans.begin(), tally.spans.end(),
              [](const MicrobatchSpan& a, const MicrobatchSpan& b) { return a.index < b.index; });
    report.spans = std::move(tally.spans);
    report.ledger = ledger_totals();
    if (sink_) sink_(report);
    lock.lock();
  }

  // Tokens per second since the oldest sample still inside the window.
  double window_rate(double t, int64_t tokens) {
    throughput_samples_.emplace_back(t, tokens);
    while (throughput_samples_.size() > 2 && throughput_samples_[1].first <= t - options_.throughput_window_seconds) {
      throughput_samples_.pop_front();
    }
    const auto& [t0, tokens0] = throughput_samples_.front();
    return (tokens - tokens0) / std::max(1e-9, t - t0);
  }

  LedgerTotals ledger_totals() const {
    LedgerTotals totals;
    for (const T* trainer : trainers_) {
      const auto ledger = trainer->ledger();
      totals.started += ledger.started;
      totals.completed += ledger.completed;
      totals.abandoned += ledger.abandoned;
      totals.retries += ledger.retries;
    }
    return totals;
  }

  TrainingSummary summary() {
    std::lock_guard lock(mu_);
    TrainingSummary out;
    out.last_step = options_.first_step + next_report_ - 1;
    out.steps_reported = steps_reported_;
    out.tokens = tokens_;
    out.seconds = now();
    out.ledger = ledger_totals();
    out.stopped_by = stopped_by_;
    return out;
  }

  std::vector<T*> trainers_;
  std::vector<D> sources_;
  std::vector<std::mutex> source_mu_;  // one per source: trainers draw independently
  TrainingLoopOptions options_;
  StepSink sink_;

  std::mutex mu_;  // guards everything below
  std::condition_variable ended_cv_;
  Clock::time_point started_at_;
  int64_t total_ = 0;  // microbatches in all steps
  int64_t next_index_ = 0;
  bool closed_ = false;  // no more microbatches start
  StopReason stopped_by_ = StopReason::finished;
  std::map<int64_t, StepTally> tallies_;  // by step offset, until reported
  int64_t tokens_ = 0;
  Status source_error_;  // the first source's failure; ok while none failed
  int running_ = 0;  // workers not yet finished
  int64_t next_report_ = 0;
  int64_t steps_reported_ = 0;
  std::deque<std::pair<double, int64_t>> throughput_samples_;  // (seconds, tokens so far)
};

namespace training_loop_detail {

// Rows [begin, begin + count) of the windows' inputs or targets, as an i32 [count, seq] tensor.
inline Result<Tensor> window_rows(const std::vector<TokenWindow>& windows, size_t begin, size_t count, bool targets) {
  const size_t seq = windows[begin].inputs.size();
  SWARM_ASSIGN_OR_RETURN(Tensor out, Tensor::empty(Shape{static_cast<int64_t>(count), static_cast<int64_t>(seq)},
                                                   DType::i32));
  for (size_t i = 0; i < count; ++i) {
    const auto& row = targets ? windows[begin + i].targets : windows[begin + i].inputs;
    if (row.size() != seq) {
      return invalid_argument("validation window {} has {} tokens, not {}", begin + i, row.size(), seq);
    }
    std::copy(row.begin(), row.end(), out.data<int32_t>() + i * seq);
  }
  return out;
}

}  // namespace training_loop_detail

// How far a validation got: the mean over the windows evaluated, and why it
// stopped early if it did.
struct ValidationResult {
  std::optional<double> loss;  // over windows_done windows; none if none
  std::vector<double> metrics;  // the loss stage's, weighted as the loss; empty if none
  size_t windows_done = 0;
  size_t windows = 0;
  Status stopped_early;  // ok when every window was evaluated
};

// Mean loss per token over the windows, forward only through the swarm, in
// batches of `batch_windows`, until `deadline` (checked between batches).
// A batch that cannot be evaluated ends it with the trainer's reason.
template <LoopTrainer T>
ValidationResult validate_until(T& trainer, const std::vector<TokenWindow>& windows,
                                std::optional<Clock::time_point> deadline, int batch_windows = 8) {
  ValidationResult result;
  result.windows = windows.size();
  if (windows.empty() || batch_windows < 1) {
    result.stopped_early = invalid_argument("validation needs windows and a batch size >= 1");
    return result;
  }
  double sum = 0;
  for (size_t begin = 0; begin < windows.size(); begin += batch_windows) {
    if (deadline && Clock::now() >= *deadline) {
      result.stopped_early = deadline_exceeded("cut short by the time limit after {} of {} windows", begin,
                                               windows.size());
      break;
    }
    const size_t count = std::min<size_t>(batch_windows, windows.size() - begin);
    auto tokens = training_loop_detail::window_rows(windows, begin, count, false);
    auto targets = training_loop_detail::window_rows(windows, begin, count, true);
    if (!tokens.is_ok() || !targets.is_ok()) {
      result.stopped_early = tokens.is_ok() ? targets.status() : tokens.status();
      break;
    }
    auto outcome = trainer.evaluate(*tokens, *targets);
    if (!outcome.completed) {
      result.stopped_early = unavailable("validation windows {}..{} could not be evaluated: {}", begin,
                                         begin + count - 1, outcome.abandon_reason);
      break;
    }
    sum += outcome.loss * static_cast<double>(count);
    result.windows_done += count;
  }
  if (result.windows_done > 0) result.loss = sum / static_cast<double>(result.windows_done);
  return result;
}

// The same over held-out microbatches of any data source: the mean loss per
// unit (each microbatch weighted by its units), rows counted as "windows".
template <LoopTrainer T>
ValidationResult validate_until(T& trainer, const std::vector<Microbatch>& batches,
                                std::optional<Clock::time_point> deadline, size_t metrics = 0) {
  MetricMeans metric_means(metrics);
  auto rows_of = [](const Microbatch& batch) {
    return batch.inputs.shape().rank() > 0 ? static_cast<size_t>(batch.inputs.shape().dim(0)) : size_t{1};
  };
  ValidationResult result;
  for (const Microbatch& batch : batches) result.windows += rows_of(batch);
  if (batches.empty()) {
    result.stopped_early = invalid_argument("validation needs at least one microbatch");
    return result;
  }
  double sum = 0, units = 0;
  for (size_t i = 0; i < batches.size(); ++i) {
    const size_t rows = rows_of(batches[i]);
    if (deadline && Clock::now() >= *deadline) {
      result.stopped_early = deadline_exceeded("cut short by the time limit after {} of {}", result.windows_done,
                                               result.windows);
      break;
    }
    if (batches[i].units <= 0) {
      result.stopped_early = invalid_argument("validation microbatch {} has no units", i);
      break;
    }
    auto outcome = trainer.evaluate(batches[i].inputs, batches[i].targets);
    if (!outcome.completed) {
      result.stopped_early = unavailable("validation rows {}..{} could not be evaluated: {}", result.windows_done,
                                         result.windows_done + rows - 1, outcome.abandon_reason);
      break;
    }
    sum += outcome.loss * static_cast<double>(batches[i].units);
    units += static_cast<double>(batches[i].units);
    if (const std::vector<float>* values = metrics_of(outcome)) {
      metric_means.add(*values, static_cast<double>(batches[i].units));
    }
    result.windows_done += rows;
  }
  if (units > 0) result.loss = sum / units;
  result.metrics = metric_means.means();
  return result;
}

// The mean over every window, or an error: invalid_argument for no or ragged
// windows; unavailable, with the trainer's reason, when a batch cannot be
// evaluated (a partial mean would not compare with other runs').
template <LoopTrainer T>
Result<double> validation_loss(T& trainer, const std::vector<TokenWindow>& windows, int batch_windows = 8) {
  ValidationResult result = validate_until(trainer, windows, std::nullopt, batch_windows);
  if (!result.stopped_early.is_ok()) return result.stopped_early;
  return *result.loss;
}

// The mean loss over held-out microbatches of any data source, each weighted by
// its units (a stage's loss is a mean over its batch), forward only through the
// swarm. Errors: invalid_argument for no batches or one without units;
// unavailable, with the trainer's reason, when one cannot be evaluated.
template <LoopTrainer T>
Result<double> validation_loss(T& trainer, const std::vector<Microbatch>& batches) {
  if (batches.empty()) return invalid_argument("validation needs at least one microbatch");
  double sum = 0, units = 0;
  for (size_t i = 0; i < batches.size(); ++i) {
    if (batches[i].units <= 0) return invalid_argument("validation microbatch {} has no units", i);
    auto outcome = trainer.evaluate(batches[i].inputs, batches[i].targets);
    if (!outcome.completed) {
      return unavailable("validation microbatch {} could not be evaluated: {}", i, outcome.abandon_reason);
    }
    sum += outcome.loss * static_cast<double>(batches[i].units);
    units += static_cast<double>(batches[i].units);
  }
  return sum / units;
}

}  // namespace swarm
