// peer: the stage server runtime. Serves one Stage over a Transport, announces
// itself in a Registry, accumulates gradients and steps its optimizer.
//
// Requests are validated before the stage sees them (validating_handler).
// forward = [input] or [input, targets]; backward = [input, output gradient]
// or [input, d(loss), targets], served by recomputing the forward, so any
// peer of the stage can serve any backward.
//
// With global_batch_samples set, the peers of a stage train as one (DESIGN §5.3):
// each publishes its progress, and when the stage has processed the global batch
// they average their gradients (butterfly all-reduce, weighted by samples) and all
// apply the same LAMB step, ending bit-identical (checked by parameter hash). A
// peer that joins late, misses a round or diverges stops serving, downloads the
// state of a stage-mate, and serves again. Without it (solo mode) a peer takes a
// local AdamW step every `step_every_samples` samples.
//
//   swarm::Peer<GptStage<CpuBackend>, ZmqTransport, DhtRegistry> peer(config, std::move(stage), &registry);
//   SWARM_RETURN_IF_ERROR(peer.start());
//   ... peer.stop();
#pragma once

#include <signal.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "swarm/averaging/all_reduce.h"
#include "swarm/averaging/progress.h"
#include "swarm/averaging/state_transfer.h"
#include "swarm/core/log.h"
#include "swarm/core/random.h"
#include "swarm/optim/lr_schedule.h"
#include "swarm/peer/stage_state.h"
#include "swarm/optim/optimizer.h"
#include "swarm/registry/registry.h"
#include "swarm/stage/stage.h"
#include "swarm/wire/wire.h"
#include "transports/transport.h"
#include "transports/validating_handler.h"

namespace swarm {

inline std::string stage_registry_key(int stage) { return fmt::format("swarm/stage/{}", stage); }

struct PeerConfig {
  int stage_index = 0;
  std::string peer_id;
  std::string bind_address = "tcp://127.0.0.1:*";
  ServerOptions server;
  double announce_period_seconds = 1.0;
  double announce_ttl_seconds = 5.0;
  optim::OptimizerConfig optimizer;
  float learning_rate = 1e-3f;
  int64_t warmup_steps = 0;  // linear warm-up, in optimizer steps (local or global)
  int64_t step_every_samples = 16;
  // Forward requests that arrive together (from several trainers) are run as
  // one batch of up to this many requests. 1 turns batching off and serves
  // requests on the server's I/O thread, the lowest-latency path.
  int max_batch = 1;
  wire::Limits limits;
  // Test and experiment knobs. A peer with slowdown 2 takes twice as long per
  // request, emulating a slower machine. emulated_seconds_per_sample adds a
  // fixed cost per sample (x2.5 for backward), so routing tests measure the
  // knob rather than the noise of a shared machine.
  double slowdown = 1.0;
  double emulated_seconds_per_sample = 0;

  // Stage synchronization; 0 keeps the solo mode above.
  int64_t global_batch_samples = 0;
  double progress_period_seconds = 0.2;  // publish progress and re-read stage-mates'
  double progress_stale_seconds = 5.0;   // a stage-mate silent this long is not counted
  bool start_on_estimated_arrival = true;
  double gather_timeout_seconds = 2.0;   // wait for stage-mates to join a round
  AllReduceConfig all_reduce;
  StateTransferConfig state_transfer;
  int64_t total_steps = 0;  // for the lr decay; 0: constant after warm-up
  // The stage-mate first in id order writes the stage's checkpoint here every so many global steps.
  std::string checkpoint_path;
  int64_t checkpoint_every_steps = 0;
  std::string resume_from;  // a stage checkpoint to start from

  // Fault-injection hooks for tests: die (stop answering, or SIGKILL the process
  // with die_by_signal) after sending this many all-reduce parts in one round, or
  // after serving this many state chunks. 0 disables.
  int64_t test_die_after_allreduce_sends = 0;
  int64_t test_die_after_state_chunks = 0;
  bool test_die_by_signal = false;
};

// A peer's announcement in the registry: where it listens and how fast it is.
struct PeerAnnouncementRecord {
  std::string peer_id;
  std::string address;
  int stage = 0;
  double throughput = 0;  // samples per second
  int64_t queue_length = 0;

  std::string to_json() const {
    return nlohmann::json{{"peer", peer_id}, {"address", address}, {"stage", stage},
                          {"throughput", throughput}, {"queue", queue_length}}
        .dump();
  }
  static Result<PeerAnnouncementRecord> from_json(const std::string& text) {
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("peer") || !j.contains("address")) {
      return invalid_argument("malformed peer announcement");
    }
    PeerAnnouncementRecord record;
    record.peer_id = j.value("peer", "");
    record.address = j.value("address", "");
    record.stage = j.value("stage", 0);
    record.throughput = j.value("throughput", 0.0);
    record.queue_length = j.value("queue", int64_t{0});
    return record;
  }
};

struct PeerStats {
  int64_t forward = 0;
  int64_t backward = 0;
  int64_t samples = 0;
  int64_t optimizer_steps = 0;
  int64_t rejected = 0;
  int64_t forward_batches = 0;  // stage calls that served forward requests
  double throughput = 0;  // samples per second of compute, smoothed
  // Stage synchronization.
  int64_t global_step = 0;
  uint64_t params_hash = 0;
  int64_t rounds_completed = 0;
  int64_t rounds_failed = 0;
  int64_t lost_samples = 0;      // accumulated, then lost with a failed round
  int64_t state_downloads = 0;
  int64_t diverged = 0;          // rounds after which this replica's hash was not the stage's
  int64_t last_download_donors = 0;      // donors the last state download used (2+: one failed)
  int64_t last_download_resumed_at = -1; // byte offset a later donor continued from
  bool serving = false;
};

template <Stage S, Transport T, Registry R>
class Peer {
 public:
  Peer(PeerConfig config, S stage, R* registry)
      : config_(std::move(config)), stage_(std::move(stage)), registry_(registry),
        optimizer_(config_.optimizer), lamb_(config_.optimizer),
        counters_(std::make_shared<wire::ValidationCounters>()) {}

  ~Peer() { stop(); }

  Status start() {
    ServerOptions options = config_.server;
    // Batching needs requests to wait side by side, so one worker per batch slot;
    // the stage itself is only ever entered under compute_mu_.
    options.worker_threads = std::max(1, config_.max_batch);
    if (global_mode() && !config_.resume_from.empty()) {
      SWARM_ASSIGN_OR_RETURN(Checkpoint resumed, load_checkpoint(config_.resume_from));
      SWARM_RETURN_IF_ERROR(load_stage_checkpoint(stage_, lamb_, resumed).with_context(config_.resume_from));
      global_step_ = resumed.step;
      log_info("peer {} resumed stage {} at step {} from {}", config_.peer_id, config_.stage_index, resumed.step,
               config_.resume_from);
    }
    params_hash_ = parameters_hash(stage_);
    remember_hash();
    if (config_.test_die_after_state_chunks > 0) {
      donor_.after_chunk = [this](int64_t served) {
        return served >= config_.test_die_after_state_chunks ? die_now("while serving state") : Status::ok();
      };
    }
    SWARM_ASSIGN_OR_RETURN(auto server, T::bind(config_.bind_address, options));
    server_.emplace(std::move(server));
    SWARM_RETURN_IF_ERROR(server_->serve(validating_handler(
        config_.limits, counters_,
        [this](const PeerIdentity& from, const wire::DecodedMessage& message) { return handle(message); })));
    if (global_mode()) {
      // A stage-mate already ahead means this replica must not serve its stale state.
      SWARM_RETURN_IF_ERROR(publish_progress(false));
      // Stage-mates find each other through these records, so make sure the DHT can
      // answer with ours before taking part (a young DHT can lose early puts).
      const auto visible_by = Clock::now() + std::chrono::seconds(5);
      while (!progress_visible() && Clock::now() < visible_by) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        (void)publish_progress(false);
      }
      // Not serving until the sync loop has looked at the stage a few times: a
      // joiner's young DHT node may not show the stage-mates it must sync from.
      set_serving(false);
      sync_thread_ = std::thread([this] { sync_loop(); });
    } else {
      set_serving(true);
    }
    if (serving_) SWARM_RETURN_IF_ERROR(announce());
    announcer_ = std::thread([this] { announce_loop(); });
    log_info("peer {} {} stage {} at {}", config_.peer_id, serving_ ? "serves" : "syncs, then serves,", config_.stage_index, address());
    return Status::ok();
  }

  // Stops announcing, withdraws, and closes the server.
  void stop() {
    {
      std::lock_guard lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_all();
    if (announcer_.joinable()) announcer_.join();
    if (sync_thread_.joinable()) sync_thread_.join();
    if (registry_ != nullptr && server_ && !dead_) {
      (void)registry_->withdraw(stage_registry_key(config_.stage_index), config_.peer_id);
      if (global_mode()) (void)registry_->withdraw(progress_registry_key(config_.stage_index), config_.peer_id);
    }
    if (server_) server_->stop();
  }

  std::string address() const { return server_ ? std::string(server_->address()) : std::string(); }
  const PeerConfig& config() const { return config_; }

  // Requests being served or waiting to be; beyond one, this is the queue.
  int64_t requests_in_service() const { return in_service_.load(); }

  PeerStats stats() const {
    std::lock_guard lock(stats_mu_);
    PeerStats out = stats_;
    out.rejected = static_cast<int64_t>(counters_->total());
    out.serving = serving_ && !dead_;
    return out;
  }

  // True once a test hook has "killed" this peer.
  bool dead() const { return dead_; }

  // Blocks until done(stats()) holds or the deadline passes; returns whether it holds.
  // Woken by every change of step, serving state or served counts, so tests and
  // tools wait on the peer itself rather than poll it.
  template <typename Predicate>
  bool wait_for_stats(Predicate done, Deadline deadline) const {
    std::unique_lock lock(stats_mu_);
    auto current = [&] {
      PeerStats out = stats_;
      out.rejected = static_cast<int64_t>(counters_->total());
      out.serving = serving_ && !dead_;
      return out;
    };
    return stats_cv_.wait_until(lock, deadline, [&] { return done(current()); });
  }

 private:
  Status announce() {
    if (dead_ || !serving_) return Status::ok();
    PeerAnnouncementRecord record{config_.peer_id, address(), config_.stage_index, stats().throughput,
                                  std::max<int64_t>(0, in_service_.load() - 1)};
    return registry_->announce(stage_registry_key(config_.stage_index), config_.peer_id, record.to_json(),
                               registry_->now() + config_.announce_ttl_seconds);
  }

  void announce_loop() {
    std::unique_lock lock(mu_);
    while (!stopping_) {
      cv_.wait_for(lock, std::chrono::duration<double>(config_.announce_period_seconds),
                   [&] { return stopping_; });
      if (stopping_ || dead_) break;
      lock.unlock();
      Status status = announce();
      if (!status.is_ok()) log_warn("peer {}: announce failed: {}", config_.peer_id, status.to_string());
      lock.lock();
    }
  }

  wire::Frames reply(const wire::DecodedMessage& request, const Tensor* tensor, const Tensor* loss = nullptr) {
    wire::MessageHeader header;
    header.kind = wire::MessageKind::result;
    header.stage = static_cast<uint32_t>(config_.stage_index);
    header.request_id = request.header.request_id;
    std::vector<TensorView> views;
    if (tensor != nullptr && tensor->defined()) views.push_back(*tensor);
    if (loss != nullptr && loss->defined()) views.push_back(*loss);
    auto frames = wire::encode_message(header, views);
    if (!frames.is_ok()) return wire::make_error_reply(request.header.request_id, header.stage, frames.status());
    return std::move(frames).value();
  }

  wire::Frames error(const wire::DecodedMessage& request, const Status& status) {
    return wire::make_error_reply(request.header.request_id, static_cast<uint32_t>(config_.stage_index), status);
  }

  // The requests waiting here beyond the one being computed form the queue
  // length that peers announce and routers use.
  struct InService {
    std::atomic<int64_t>& count;
    explicit InService(std::atomic<int64_t>& c) : count(c) { ++count; }
    ~InService() { --count; }
  };

  struct PendingForward {
    const TensorView* input;
    std::promise<Result<Tensor>> done;
  };

  static bool stackable(const TensorView& a, const TensorView& b) {
    if (a.dtype() != b.dtype() || a.shape().rank() != b.shape().rank() || a.shape().rank() == 0) return false;
    for (int i = 1; i < a.shape().rank(); ++i) {
      if (a.shape()[i] != b.shape()[i]) return false;
    }
    return true;
  }

  // Forward of a stage that takes no targets, batched with whatever forwards
  // are waiting. Each caller enqueues itself, then takes the compute lock and
  // runs everything queued that stacks with the first: a request already run
  // by an earlier caller's batch just collects its result.
  Result<Tensor> batched_forward(const TensorView& input) {
    PendingForward me{&input, {}};
    auto result = me.done.get_future();
    {
      std::lock_guard lock(queue_mu_);
      queue_.push_back(&me);
    }
    {
      std::lock_guard compute(compute_mu_);
      std::vector<PendingForward*> batch;
      {
        std::lock_guard lock(queue_mu_);
        while (!queue_.empty() && batch.size() < static_cast<size_t>(config_.max_batch) &&
               (batch.empty() || stackable(*batch[0]->input, *queue_.front()->input))) {
          batch.push_back(queue_.front());
          queue_.pop_front();
        }
      }
      if (!batch.empty()) run_forward_batch(batch);
    }
    return result.get();
  }

  void run_forward_batch(const std::vector<PendingForward*>& batch) {
    {
      std::lock_guard lock(stats_mu_);
      ++stats_.forward_batches;
    }
    if (batch.size() == 1) {
      batch[0]->done.set_value(stage_.forward(*batch[0]->input, nullptr));
      return;
    }
    const TensorView& first = *batch[0]->input;
    std::vector<int64_t> dims(first.shape().dims().begin(), first.shape().dims().end());
    dims[0] = 0;
    for (auto* p : batch) dims[0] += p->input->shape()[0];
    auto stacked = Tensor::empty(*Shape::from_dims(dims), first.dtype());
    if (!stacked.is_ok()) {
      for (auto* p : batch) p->done.set_value(stacked.status());
      return;
    }
    size_t offset = 0;
    for (auto* p : batch) {
      std::memcpy(static_cast<char*>(stacked->raw_data()) + offset, p->input->raw_data(), p->input->size_bytes());
      offset += p->input->size_bytes();
    }
    Result<Tensor> output = stage_.forward(*stacked, nullptr);
    if (!output.is_ok()) {
      for (auto* p : batch) p->done.set_value(output.status());
      return;
    }
    // Split the output back by rows.
    const int64_t row_bytes = static_cast<int64_t>(output->size_bytes()) / output->shape()[0];
    int64_t row = 0;
    for (auto* p : batch) {
      const int64_t rows = p->input->shape()[0];
      std::vector<int64_t> out_dims(output->shape().dims().begin(), output->shape().dims().end());
      out_dims[0] = rows;
      TensorView slice(static_cast<char*>(output->raw_data()) + row * row_bytes, output->dtype(),
                       *Shape::from_dims(out_dims), output->device());
      p->done.set_value(Tensor::copy_of(slice));
      row += rows;
    }
  }

  wire::Frames handle(const wire::DecodedMessage& request) {
    InService in_service(in_service_);
    const auto started = std::chrono::steady_clock::now();
    if (request.header.stage != static_cast<uint32_t>(config_.stage_index)) {
      return error(request, invalid_argument("this peer serves stage {}, not {}", config_.stage_index,
                                             request.header.stage));
    }
    if (dead_) return error(request, unavailable("peer {} is dead (test hook)", config_.peer_id));
    switch (request.header.kind) {
      case wire::MessageKind::allreduce_part: {
        Status delivered = inbox_.deliver(request);
        return delivered.is_ok() ? reply(request, nullptr) : error(request, delivered);
      }
      case wire::MessageKind::state_chunk:
        // Donates even while not serving: a peer waiting out a failed round still holds
        // its step's state, and a joiner may need exactly that. Joiners check the hash.
        return donor_.handle(request, config_.stage_index, global_step_.load(), [this]() -> Result<Checkpoint> {
          std::lock_guard compute(compute_mu_);
          return stage_checkpoint(stage_, lamb_, global_step_.load());
        });
      case wire::MessageKind::forward:
      case wire::MessageKind::backward:
        if (!serving_) {
          return error(request, unavailable("peer {} is re-syncing its state and does not serve yet", config_.peer_id));
        }
        break;
      default:
        break;
    }
    const bool targets = stage_.takes_targets();
    const auto& tensors = request.tensors;
    Result<Tensor> result = Status(StatusCode::internal, "unhandled");
    Tensor loss;  // the last stage's backward also returns its loss
    int64_t batch = 0;
    bool is_backward = false;
    if (request.header.kind == wire::MessageKind::forward) {
      if (tensors.size() != (targets ? 2u : 1u)) {
        return error(request, invalid_argument("forward takes {} tensors, got {}", targets ? 2 : 1, tensors.size()));
      }
      batch = tensors[0].shape.rank() > 0 ? tensors[0].shape[0] : 0;
      if (!targets && config_.max_batch > 1) {
        result = batched_forward(tensors[0].view);
      } else {
        std::lock_guard compute(compute_mu_);
        result = stage_.forward(tensors[0].view, targets ? &tensors[1].view : nullptr);
        std::lock_guard lock(stats_mu_);
        ++stats_.forward_batches;
      }
    } else if (request.header.kind == wire::MessageKind::backward) {
      if (tensors.size() != (targets ? 3u : 2u)) {
        return error(request, invalid_argument("backward takes {} tensors, got {}", targets ? 3 : 2, tensors.size()));
      }
      batch = tensors[0].shape.rank() > 0 ? tensors[0].shape[0] : 0;
      is_backward = true;
      std::lock_guard compute(compute_mu_);
      if (targets) {
        auto both = forward_and_backward(tensors[0].view, tensors[1].view, tensors[2].view);
        if (both.is_ok()) {
          loss = std::move(both->first);
          result = std::move(both->second);
        } else {
          result = both.status();
        }
      } else {
        result = stage_.backward(tensors[0].view, tensors[1].view, nullptr);
      }
    } else if (request.header.kind == wire::MessageKind::ping) {
      return reply(request, nullptr);
    } else {
      return error(request, unimplemented("peers do not serve message kind {}", static_cast<int>(request.header.kind)));
    }
    if (!result.is_ok()) return error(request, result.status());
    if (is_backward) {
      std::lock_guard compute(compute_mu_);
      if (global_mode()) {
        accumulated_samples_ += batch;
        ++accumulated_microbatches_;
      } else {
        maybe_step(batch);
      }
    }
    if (is_backward && global_mode()) {
      {
        std::lock_guard lock(mu_);
        samples_arrived_ = true;
      }
      cv_.notify_all();  // the sync loop re-checks the global batch now, not at its next tick
    }
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    const double emulated = config_.emulated_seconds_per_sample * batch * (is_backward ? 2.5 : 1.0);
    // Total time becomes (compute + emulated) * slowdown.
    const double extra = emulated * config_.slowdown + seconds * std::max(0.0, config_.slowdown - 1.0);
    if (extra > 0) std::this_thread::sleep_for(std::chrono::duration<double>(extra));
    record(is_backward, batch, seconds + extra);
    return reply(request, &*result, &loss);
  }

  // (loss, input gradient) for the stage that takes targets. A stage that can
  // run its backward on the forward it just did (GptStage) computes the forward
  // once; any other Stage pays for a second forward inside backward().
  Result<std::pair<Tensor, Tensor>> forward_and_backward(const TensorView& input, const TensorView& grad_output,
                                                        const TensorView& targets) {
    SWARM_ASSIGN_OR_RETURN(Tensor loss, stage_.forward(input, &targets));
    Result<Tensor> grad = Status(StatusCode::internal, "unset");
    if constexpr (requires { stage_.backward_after_forward(grad_output); }) {
      grad = stage_.backward_after_forward(grad_output);
    } else {
      grad = stage_.backward(input, grad_output, &targets);
    }
    if (!grad.is_ok()) return grad.status();
    return std::make_pair(std::move(loss), std::move(grad).value());
  }

  void maybe_step(int64_t batch) {
    samples_since_step_ += batch;
    if (samples_since_step_ < config_.step_every_samples) return;
    std::vector<optim::ParamRef> refs;
    for (auto& view : stage_.parameter_views()) {
      refs.push_back({view.name, view.value, view.grad, view.apply_weight_decay});
    }
    const double warmup = config_.warmup_steps > 0
                              ? std::min(1.0, double(optimizer_.steps_taken() + 1) / double(config_.warmup_steps))
                              : 1.0;
    Status status = optimizer_.step(refs, static_cast<float>(config_.learning_rate * warmup));
    if (!status.is_ok()) log_warn("peer {}: optimizer step skipped: {}", config_.peer_id, status.to_string());
    (void)stage_.zero_grad();
    // Forwards kept for a later backward were computed with the old weights.
    if constexpr (requires { stage_.drop_cached_activations(); }) stage_.drop_cached_activations();
    samples_since_step_ = 0;
    std::lock_guard lock(stats_mu_);
    ++stats_.optimizer_steps;
  }

  bool global_mode() const { return config_.global_batch_samples > 0; }

  // Returns the previous value; wakes wait_for_stats().
  bool set_serving(bool serving) {
    const bool was = serving_.exchange(serving);
    notify_stats();
    return was;
  }
  void notify_stats() {
    { std::lock_guard lock(stats_mu_); }  // a waiter between its check and its wait sees the change
    stats_cv_.notify_all();
  }

  GlobalBatchConfig batch_config() const {
    return GlobalBatchConfig{config_.global_batch_samples, config_.progress_stale_seconds,
                             config_.start_on_estimated_arrival};
  }

  void remember_hash() {  // under compute_mu_ or before serving
    recent_hashes_.emplace_back(global_step_.load(), params_hash_);
    while (recent_hashes_.size() > 16) recent_hashes_.pop_front();
    {
      std::lock_guard lock(stats_mu_);
      stats_.global_step = global_step_.load();
      stats_.params_hash = params_hash_;
    }
    stats_cv_.notify_all();
  }

  ProgressRecord own_progress(bool averaging, int64_t samples_override = -1) {
    ProgressRecord r;
    r.peer_id = config_.peer_id;
    r.address = address();
    r.stage = config_.stage_index;
    r.published_at = registry_->now();
    r.averaging = averaging;
    r.samples_per_second = samples_per_second_;
    std::lock_guard compute(compute_mu_);
    r.step = global_step_.load();
    r.samples = samples_override >= 0 ? samples_override : accumulated_samples_;
    r.params_hash = params_hash_;
    r.recent_hashes.assign(recent_hashes_.begin(), recent_hashes_.end());
    r.round_nonce = averaging ? round_nonce_ : 0;
    r.stage_mates_seen = static_cast<int>(stage_progress_.size());
    return r;
  }

  Status publish_progress(bool averaging, int64_t samples_override = -1) {
    ProgressRecord record = own_progress(averaging, samples_override);
    return registry_->announce(progress_registry_key(config_.stage_index), config_.peer_id, record.to_json(),
                               registry_->now() + config_.announce_ttl_seconds);
  }

  bool progress_visible() {
    auto records = registry_->get(progress_registry_key(config_.stage_index));
    if (!records.is_ok()) return false;
    return std::any_of(records->begin(), records->end(),
                       [&](const Record& r) { return r.subkey == config_.peer_id; });
  }

  // Stage-mates' records (never this peer's own: that one is always taken live).
  // Merged into what was known, newest record per peer, and forgotten only once
  // stale: a DHT lookup that misses a record (a young DHT does) must not make a
  // stage-mate vanish and this peer average alone.
  void read_progress() {
    auto records = registry_->get(progress_registry_key(config_.stage_index));
    const double now = registry_->now();
    last_progress_read_ = now;
    std::map<std::string, ProgressRecord> merged;
    for (auto& r : stage_progress_) merged[r.peer_id] = std::move(r);
    if (records.is_ok()) {
      ++progress_reads_;
      for (const auto& record : *records) {
        auto progress = ProgressRecord::from_json(record.value);
        if (!progress.is_ok() || progress->peer_id == config_.peer_id) continue;
        auto it = merged.find(progress->peer_id);
        if (it == merged.end() || progress->published_at >= it->second.published_at) {
          merged[progress->peer_id] = *progress;
        }
      }
    }
    stage_progress_.clear();
    for (auto& [id, r] : merged) {
      if (r.published_at >= now - config_.progress_stale_seconds) stage_progress_.push_back(std::move(r));
    }
  }

  GlobalBatchDecision decide() {
    std::vector<ProgressRecord> all = stage_progress_;
    all.push_back(own_progress(false));
    return decide_global_batch(batch_config(), global_step_.load(), all, registry_->now());
  }

  void update_rate() {
    const double now = registry_->now();
    int64_t total;
    {
      std::lock_guard lock(stats_mu_);
      total = stats_.samples;
    }
    if (rate_window_start_ < 0) {
      rate_window_start_ = now;
      rate_window_samples_ = total;
      return;
    }
    const double elapsed = now - rate_window_start_;
    if (elapsed < config_.progress_period_seconds) return;
    const double rate = static_cast<double>(total - rate_window_samples_) / elapsed;
    samples_per_second_ = samples_per_second_ == 0 ? rate : 0.7 * samples_per_second_ + 0.3 * rate;
    rate_window_start_ = now;
    rate_window_samples_ = total;
  }

  void sync_loop() {
    double last_publish = -1e9;
    while (true) {
      {
        std::unique_lock lock(mu_);
        cv_.wait_for(lock, std::chrono::duration<double>(config_.progress_period_seconds / 2),
                     [&] { return stopping_ || samples_arrived_; });
        samples_arrived_ = false;
        if (stopping_ || dead_) return;
      }
      update_rate();
      const double now = registry_->now();
      if (now - last_publish >= config_.progress_period_seconds) {
        (void)publish_progress(false);
        last_publish = now;
      }
      if (now - last_progress_read_ >= config_.progress_period_seconds) read_progress();
      GlobalBatchDecision decision = decide();
      if (decision.behind || !serving_) {
        resync();
      } else if (decision.ready) {
        run_round();
        last_publish = -1e9;
      }
    }
  }

  // Not serving until this replica holds the stage's state: that of a stage-mate at
  // a later step, or, after a failed or diverged round, of one at the same step
  // whose parameters differ. Trainers see errors meanwhile and route elsewhere; the
  // routing record is left to lapse rather than withdrawn, so the next announce
  // (with a later expiry) brings the peer back.
  void resync() {
    const int64_t my_step = global_step_.load();
    if (set_serving(false)) {
      log_info("peer {}: stops serving at step {} to re-sync", config_.peer_id, my_step);
      needs_resync_ = true;
    }
    std::vector<ProgressRecord> donors;
    bool stage_mate_catching_up = false;
    const double now = registry_->now();
    for (const auto& r : stage_progress_) {
      if (r.published_at < now - config_.progress_stale_seconds || r.address.empty()) continue;
      if (r.step > my_step || (r.step == my_step && needs_resync_ && r.params_hash != params_hash_)) {
        donors.push_back(r);
      } else if (r.step == my_step - 1 && r.averaging) {
        stage_mate_catching_up = true;  // still in the round this peer just left
      }
    }
    if (donors.empty() && progress_reads_ < 3) return;  // not looked long enough to be sure
    if (donors.empty()) {
      // Nobody holds other state. After a bad round, wait for stage-mates still
      // finishing theirs before concluding this state is the stage's.
      // Bounded: a stage-mate that stays "in the round" longer than a record lives is stuck or gone.
      if (needs_resync_ && stage_mate_catching_up) {
        if (catching_up_since_ < 0) catching_up_since_ = now;
        if (now - catching_up_since_ < config_.progress_stale_seconds) return;
      }
      catching_up_since_ = -1;
      const bool was_resyncing = needs_resync_;
      needs_resync_ = false;
      set_serving(true);
      (void)announce();
      if (was_resyncing) log_info("peer {}: serving at step {}: no stage-mate holds other state", config_.peer_id, my_step);
      return;
    }
    std::vector<AllReduceMember> members;
    for (const auto& d : donors) members.push_back({d.peer_id, d.address});
    StateDownloadReport report;
    auto state = download_state(clients_, config_.stage_index, members, config_.state_transfer, &report);
    if (!state.is_ok()) {
      log_warn("peer {}: state download failed: {}", config_.peer_id, state.status().to_string());
      read_progress();
      return;
    }
    {
      std::lock_guard compute(compute_mu_);
      Status loaded = load_stage_checkpoint(stage_, lamb_, *state);
      if (!loaded.is_ok()) {
        log_warn("peer {}: downloaded state does not fit: {}", config_.peer_id, loaded.to_string());
        return;
      }
      global_step_ = state->step;
      params_hash_ = parameters_hash(stage_);
      (void)stage_.zero_grad();
      if constexpr (requires { stage_.drop_cached_activations(); }) stage_.drop_cached_activations();
      accumulated_samples_ = 0;
      accumulated_microbatches_ = 0;
      remember_hash();
    }
    // The donor's published hash for that step must match what arrived.
    for (const auto& d : donors) {
      for (const auto& [step, hash] : d.recent_hashes) {
        if (step == state->step && hash != params_hash_) {
          log_warn("peer {}: state from {} hashes to {:016x}, {} announced {:016x}", config_.peer_id,
                   report.donors_used.back(), params_hash_, d.peer_id, hash);
          return;
        }
      }
    }
    inbox_.finish_step(state->step - 1);
    needs_resync_ = false;
    {
      std::lock_guard lock(stats_mu_);
      ++stats_.state_downloads;
      stats_.last_download_donors = static_cast<int64_t>(report.donors_used.size());
      stats_.last_download_resumed_at = report.resumed_at;
    }
    stats_cv_.notify_all();
    log_info("peer {}: downloaded {} bytes of step {} from {} (resumed at {}), hash {:016x}; serving", config_.peer_id,
             report.bytes, state->step, fmt::join(report.donors_used, ","), report.resumed_at, params_hash_);
    (void)publish_progress(false);
    set_serving(true);
    (void)announce();
  }

  Status die_now(std::string_view where) {
    log_warn("peer {}: test hook: dying {}", config_.peer_id, where);
    if (config_.test_die_by_signal) ::raise(SIGKILL);
    dead_ = true;
    cv_.notify_all();
    notify_stats();
    return cancelled("peer {} died (test hook) {}", config_.peer_id, where);
  }

  void run_round() {
    const int64_t step = global_step_.load();
    std::vector<float> local_mean;
    int64_t weight = 0;
    uint64_t hash_before = 0;
    {
      std::lock_guard compute(compute_mu_);
      weight = accumulated_samples_;
      local_mean = flatten_gradients(stage_, static_cast<double>(accumulated_microbatches_));
      (void)stage_.zero_grad();
      accumulated_samples_ = 0;
      accumulated_microbatches_ = 0;
      hash_before = params_hash_;
    }
    // Join, and wait for the stage-mates that are at this step to join too.
    round_nonce_ = nonce_source_.next() | 1;  // never 0, which means "not seen"
    (void)publish_progress(true, weight);
    const auto gather_until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                 std::chrono::duration<double>(config_.gather_timeout_seconds));
    while (true) {
      read_progress();
      const GroupReadiness readiness =
          group_readiness(stage_progress_, step, registry_->now(), config_.progress_stale_seconds);
      if (readiness == GroupReadiness::someone_ahead) {
        // A stage-mate already stepped past this round: it cannot happen any more.
        log_warn("peer {}: a stage-mate is past step {}; dropping this round", config_.peer_id, step);
        std::lock_guard lock(stats_mu_);
        ++stats_.rounds_failed;
        stats_.lost_samples += weight;
        needs_resync_ = true;
        return;
      }
      if (readiness == GroupReadiness::complete || Clock::now() >= gather_until) break;
      std::unique_lock lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(10), [&] { return stopping_; });
      if (stopping_) return;
    }
    AllReduceRound round;
    round.stage = config_.stage_index;
    round.step = step;
    round.my_id = config_.peer_id;
    round.weight = static_cast<double>(weight);
    round.params_hash = hash_before;
    round.members.push_back({config_.peer_id, address(), round_nonce_});
    for (const auto& r : round_members(stage_progress_, step, registry_->now(), config_.progress_stale_seconds)) {
      round.members.push_back({r.peer_id, r.address, r.averaging ? r.round_nonce : 0});
    }
    AllReduceHooks hooks;
    if (config_.test_die_after_allreduce_sends > 0) {
      hooks.after_send = [this](int64_t sent) {
        return sent >= config_.test_die_after_allreduce_sends ? die_now("in the middle of an all-reduce")
                                                              : Status::ok();
      };
    }
    auto result = butterfly_all_reduce(clients_, inbox_, round, local_mean, config_.all_reduce, hooks);
    if (dead_) {
      if (server_) server_->stop();  // unreachable from now on, like a killed process
      return;
    }
    if (!result.is_ok()) {
      log_warn("peer {}: round of step {} failed: {}", config_.peer_id, step, result.status().to_string());
      {
        std::lock_guard lock(stats_mu_);
        ++stats_.rounds_failed;
        stats_.lost_samples += weight;
      }
      needs_resync_ = true;
      set_serving(false);  // the stage-mates that finished hold the stage's state now (takes stats_mu_)
      return;
    }
    const uint64_t consensus = consensus_hash(result->params_hashes);
    bool leader = result->members.front().peer_id == config_.peer_id;
    {
      std::lock_guard compute(compute_mu_);
      std::vector<optim::ParamRef> refs;
      size_t offset = 0;
      for (auto& view : stage_.parameter_views()) {
        TensorView grad(result->averaged.data() + offset, DType::f32, view.value.shape(), Device::cpu);
        offset += static_cast<size_t>(view.value.numel());
        refs.push_back({view.name, view.value, grad, view.apply_weight_decay});
      }
      optim::LrSchedule schedule{.peak_lr = config_.learning_rate, .warmup_steps = config_.warmup_steps,
                                 .total_steps = config_.total_steps};
      Status stepped = lamb_.step(refs, schedule.lr_at(step + 1));
      if (!stepped.is_ok()) log_warn("peer {}: step {} skipped: {}", config_.peer_id, step + 1, stepped.to_string());
      if constexpr (requires { stage_.drop_cached_activations(); }) stage_.drop_cached_activations();
      global_step_ = step + 1;
      params_hash_ = parameters_hash(stage_);
      {
        // Counted with the step itself, so whoever sees the new step sees the round too.
        std::lock_guard lock(stats_mu_);
        ++stats_.rounds_completed;
        ++stats_.optimizer_steps;
        if (hash_before != consensus) ++stats_.diverged;
      }
      remember_hash();
    }
    inbox_.finish_step(step);
    if (hash_before != consensus) {
      // Stepped from different parameters than the stage: this replica is wrong.
      log_warn("peer {}: parameters at step {} hashed {:016x}, the stage's {:016x}: re-syncing", config_.peer_id, step,
               hash_before, consensus);
      set_serving(false);
      needs_resync_ = true;
      leader = false;
    }
    (void)publish_progress(false);
    if (leader && !config_.checkpoint_path.empty() && config_.checkpoint_every_steps > 0 &&
        (step + 1) % config_.checkpoint_every_steps == 0) {
      Result<Checkpoint> state = [&] {
        std::lock_guard compute(compute_mu_);
        return stage_checkpoint(stage_, lamb_, global_step_.load());
      }();
      Status saved = state.is_ok() ? save_checkpoint(config_.checkpoint_path, *state) : state.status();
      if (!saved.is_ok()) log_warn("peer {}: checkpoint failed: {}", config_.peer_id, saved.to_string());
    }
  }

  void record(bool backward, int64_t batch, double seconds) {
    {
      std::lock_guard lock(stats_mu_);
      (backward ? stats_.backward : stats_.forward) += 1;
      if (backward) stats_.samples += batch;
      if (seconds > 0 && batch > 0) {
        // Backward costs about 2.5 forwards; count it as such for a comparable rate.
        const double rate = batch * (backward ? 2.5 : 1.0) / seconds;
        stats_.throughput = stats_.throughput == 0 ? rate : 0.9 * stats_.throughput + 0.1 * rate;
      }
    }
    stats_cv_.notify_all();
  }

  PeerConfig config_;
  S stage_;
  R* registry_;
  optim::AdamW optimizer_;  // solo mode
  optim::Lamb lamb_;        // global steps
  std::atomic<int64_t> global_step_{0};
  uint64_t params_hash_ = 0;                        // under compute_mu_
  std::deque<std::pair<int64_t, uint64_t>> recent_hashes_;  // under compute_mu_
  int64_t accumulated_samples_ = 0;                 // under compute_mu_, toward global_step_ + 1
  int64_t accumulated_microbatches_ = 0;
  std::atomic<bool> serving_{false};
  bool needs_resync_ = false;
  double catching_up_since_ = -1;  // sync thread only
  uint64_t round_nonce_ = 0;  // sync thread (and own_progress under it)
  SplitMix64 nonce_source_{static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
                           std::hash<std::string>{}(config_.peer_id)};
  int64_t progress_reads_ = 0;  // sync thread only  // sync thread only: a round failed or this replica diverged
  std::atomic<bool> dead_{false};
  AllReduceInbox inbox_;
  StateDonor donor_;
  ClientCache<T> clients_;
  std::vector<ProgressRecord> stage_progress_;      // sync thread only
  double last_progress_read_ = -1e9;
  double rate_window_start_ = -1;
  int64_t rate_window_samples_ = 0;
  int64_t samples_since_rate_ = 0;
  double samples_per_second_ = 0;
  std::thread sync_thread_;
  std::shared_ptr<wire::ValidationCounters> counters_;
  std::optional<typename T::server_type> server_;
  int64_t samples_since_step_ = 0;
  std::mutex compute_mu_;  // the stage and the optimizer are not re-entrant
  std::mutex queue_mu_;
  std::deque<PendingForward*> queue_;
  std::atomic<int64_t> in_service_{0};

  mutable std::mutex stats_mu_;
  mutable std::condition_variable stats_cv_;
  PeerStats stats_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool samples_arrived_ = false;  // under mu_: a backward finished since the sync loop last looked
  std::thread announcer_;
};

}  // namespace swarm
