// peer: the stage server runtime. Serves one Stage over a Transport, announces
// itself in a Registry, accumulates gradients and steps its optimizer.
//
// Requests are validated before the stage sees them (validating_handler).
// forward = [input] or [input, targets]; backward = [input, output gradient]
// or [input, d(loss), targets], served by recomputing the forward, so any
// peer of the stage can serve any backward. Until stage-wide averaging lands,
// a peer takes a local optimizer step every `step_every_samples` samples.
//
//   swarm::Peer<GptStage<CpuBackend>, ZmqTransport, DhtRegistry> peer(config, std::move(stage), &registry);
//   SWARM_RETURN_IF_ERROR(peer.start());
//   ... peer.stop();
#pragma once

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

#include "swarm/core/log.h"
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
  int64_t warmup_steps = 0;  // linear warm-up of the local steps
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
};

template <Stage S, Transport T, Registry R>
class Peer {
 public:
  Peer(PeerConfig config, S stage, R* registry)
      : config_(std::move(config)), stage_(std::move(stage)), registry_(registry),
        optimizer_(config_.optimizer),
        counters_(std::make_shared<wire::ValidationCounters>()) {}

  ~Peer() { stop(); }

  Status start() {
    ServerOptions options = config_.server;
    // Batching needs requests to wait side by side, so one worker per batch slot;
    // the stage itself is only ever entered under compute_mu_.
    options.worker_threads = std::max(1, config_.max_batch);
    SWARM_ASSIGN_OR_RETURN(auto server, T::bind(config_.bind_address, options));
    server_.emplace(std::move(server));
    SWARM_RETURN_IF_ERROR(server_->serve(validating_handler(
        config_.limits, counters_,
        [this](const PeerIdentity& from, const wire::DecodedMessage& message) { return handle(message); })));
    SWARM_RETURN_IF_ERROR(announce());
    announcer_ = std::thread([this] { announce_loop(); });
    log_info("peer {} serves stage {} at {}", config_.peer_id, config_.stage_index, address());
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
    if (registry_ != nullptr && server_) {
      (void)registry_->withdraw(stage_registry_key(config_.stage_index), config_.peer_id);
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
    return out;
  }

 private:
  Status announce() {
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
      if (stopping_) break;
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
      maybe_step(batch);
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

  void record(bool backward, int64_t batch, double seconds) {
    std::lock_guard lock(stats_mu_);
    (backward ? stats_.backward : stats_.forward) += 1;
    if (backward) stats_.samples += batch;
    if (seconds > 0 && batch > 0) {
      // Backward costs about 2.5 forwards; count it as such for a comparable rate.
      const double rate = batch * (backward ? 2.5 : 1.0) / seconds;
      stats_.throughput = stats_.throughput == 0 ? rate : 0.9 * stats_.throughput + 0.1 * rate;
    }
  }

  PeerConfig config_;
  S stage_;
  R* registry_;
  optim::AdamW optimizer_;
  std::shared_ptr<wire::ValidationCounters> counters_;
  std::optional<typename T::server_type> server_;
  int64_t samples_since_step_ = 0;
  std::mutex compute_mu_;  // the stage and the optimizer are not re-entrant
  std::mutex queue_mu_;
  std::deque<PendingForward*> queue_;
  std::atomic<int64_t> in_service_{0};

  mutable std::mutex stats_mu_;
  PeerStats stats_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread announcer_;
};

}  // namespace swarm
