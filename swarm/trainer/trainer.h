// trainer: pushes microbatches through the stages of a swarm.
//
// For every hop the Router picks a peer of the next stage; a failed or late
// peer is reported and the hop is retried on another peer of the same stage.
// The trainer keeps each stage's input until that stage's backward is done,
// because any peer may serve the backward by recomputing the forward. Every
// microbatch ends in the ledger as completed or abandoned (with a reason):
// nothing is silently lost. Many threads may run microbatches at once.
//
//   swarm::Trainer<StochasticWiringRouter, ZmqTransport, DhtRegistry> trainer(config, routers, &registry);
//   MicrobatchOutcome outcome = trainer.run_microbatch(tokens, targets);
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "swarm/core/log.h"
#include "swarm/peer/peer.h"
#include "swarm/registry/registry.h"
#include "swarm/wiring/router.h"
#include "swarm/wire/wire.h"
#include "transports/client_cache.h"
#include "transports/transport.h"

namespace swarm {

struct TrainerConfig {
  int num_stages = 2;
  std::string trainer_id = "trainer";
  double forward_timeout_seconds = 10.0;
  double backward_timeout_seconds = 25.0;
  // How often the peer lists are re-read from the registry (also at once when
  // a stage has no usable peer).
  double refresh_period_seconds = 1.0;
  // A microbatch is abandoned when one of its hops finds no peer that can
  // serve it for this long.
  double abandon_after_seconds = 60.0;
  ClientOptions client;
};

struct MicrobatchOutcome {
  bool completed = false;
  float loss = 0;
  int retries = 0;
  std::string abandon_reason;
};

// Every microbatch started ends as completed or abandoned.
struct Ledger {
  int64_t started = 0;
  int64_t completed = 0;
  int64_t abandoned = 0;
  int64_t retries = 0;
  std::vector<std::string> abandon_reasons;
};

// Something a router decided about a peer, for the run's event log.
struct TrainerEvent {
  std::string event;  // "banned" (an error), "timed_out"
  std::string peer;
  int stage = 0;
  std::string detail;
};

// Who served what, as the trainer saw it (per peer id).
struct ServedCounts {
  int64_t forward = 0;
  int64_t backward = 0;
  int64_t failures = 0;
};

template <Router Rt, Transport T, Registry R>
class Trainer {
 public:
  Trainer(TrainerConfig config, std::vector<Rt> routers, R* registry)
      : config_(std::move(config)), registry_(registry), started_at_(Clock::now()), clients_(config_.client) {
    for (auto& router : routers) stages_.push_back(std::make_unique<StageState>(std::move(router)));
  }

  // Forward through every stage, then backward; retries hops on other peers.
  MicrobatchOutcome run_microbatch(const Tensor& tokens, const Tensor& targets) {
    {
      std::lock_guard lock(ledger_mu_);
      ++ledger_.started;
    }
    MicrobatchOutcome outcome = run(tokens, targets, /*backward=*/true);
    std::lock_guard lock(ledger_mu_);
    ledger_.retries += outcome.retries;
    if (outcome.completed) {
      ++ledger_.completed;
    } else {
      ++ledger_.abandoned;
      ledger_.abandon_reasons.push_back(outcome.abandon_reason);
    }
    return outcome;
  }

  // Forward only (validation); not part of the ledger.
  MicrobatchOutcome evaluate(const Tensor& tokens, const Tensor& targets) {
    return run(tokens, targets, /*backward=*/false);
  }

  Ledger ledger() const {
    std::lock_guard lock(ledger_mu_);
    return ledger_;
  }

  std::map<std::string, ServedCounts> served() const {
    std::lock_guard lock(served_mu_);
    return served_;
  }

  // Events since the last call.
  std::vector<TrainerEvent> take_events() {
    std::lock_guard lock(served_mu_);
    std::vector<TrainerEvent> out;
    out.swap(events_);
    return out;
  }

  // Peers each stage can use now, as the router sees them.
  std::vector<size_t> usable_peers() {
    std::vector<size_t> counts;
    for (auto& stage : stages_) {
      std::lock_guard lock(stage->mu);
      counts.push_back(stage->router.usable_peers());
    }
    return counts;
  }

 private:
  struct StageState {
    explicit StageState(Rt r) : router(std::move(r)) {}
    std::mutex mu;  // guards router, addresses, last_refresh
    Rt router;
    std::map<std::string, std::string> addresses;  // peer id -> address
    double last_refresh = -1e9;
  };

  double now() const { return std::chrono::duration<double>(Clock::now() - started_at_).count(); }

  MicrobatchOutcome run(const Tensor& tokens, const Tensor& targets, bool backward) {
    MicrobatchOutcome outcome;
    const int stages = config_.num_stages;
    const int last = stages - 1;
    const int64_t batch = tokens.shape().rank() > 0 ? tokens.shape()[0] : 1;
    std::vector<Tensor> inputs(stages);
    inputs[0] = tokens;
    for (int s = 0; s < last; ++s) {
      auto output = call_stage(s, TaskKind::forward, wire::MessageKind::forward, {inputs[s]}, batch, &outcome);
      if (!output.is_ok()) return abandon(outcome, s, "forward", output.status());
      inputs[s + 1] = std::move((*output)[0]);
    }
    if (!backward) {
      auto loss = call_stage(last, TaskKind::forward, wire::MessageKind::forward, {inputs[last], targets}, batch,
                             &outcome);
      if (!loss.is_ok()) return abandon(outcome, last, "forward", loss.status());
      outcome.loss = (*loss)[0].template data<float>()[0];
      outcome.completed = true;
      return outcome;
    }
    // The last stage's forward and backward are one request: its reply is
    // [input gradient, loss], which saves a forward and a round trip.
    Tensor grad = *Tensor::empty(Shape{1}, DType::f32);
    grad.data<float>()[0] = 1.0f;
    for (int s = last; s >= 0; --s) {
      std::vector<TensorView> tensors{inputs[s], grad};
      if (s == last) tensors.push_back(targets);
      auto reply = call_stage(s, TaskKind::backward, wire::MessageKind::backward, tensors, batch, &outcome);
      if (!reply.is_ok()) return abandon(outcome, s, "backward", reply.status());
      if (s == last) {
        if (reply->size() < 2 || (*reply)[1].numel() != 1) {
          return abandon(outcome, s, "backward", internal("the last stage's reply lacks the loss"));
        }
        outcome.loss = (*reply)[1].template data<float>()[0];
      }
      grad = std::move((*reply)[0]);
      inputs[s] = Tensor();  // this stage's backward is done: its input can go
    }
    outcome.completed = true;
    return outcome;
  }

  MicrobatchOutcome abandon(MicrobatchOutcome outcome, int stage, const char* what, const Status& status) {
    outcome.completed = false;
    outcome.abandon_reason = fmt::format("stage {} {}: {}", stage, what, status.to_string());
    return outcome;
  }

  void refresh(StageState& stage, int index, bool force) {
    {
      std::lock_guard lock(stage.mu);
      const double t = now();
      if (!force && t - stage.last_refresh < config_.refresh_period_seconds) return;
      stage.last_refresh = t;  // claimed: other threads keep routing meanwhile
    }
    // A registry lookup is a network round trip: never hold the router's lock across it.
    auto records = registry_->get(stage_registry_key(index));
    if (!records.is_ok()) {
      log_warn("trainer: reading stage {} peers: {}", index, records.status().to_string());
      return;
    }
    std::vector<PeerAnnouncement> peers;
    std::vector<std::pair<std::string, std::string>> addresses;
    for (const auto& record : *records) {
      auto announcement = PeerAnnouncementRecord::from_json(record.value);
      if (!announcement.is_ok()) continue;
      addresses.emplace_back(announcement->peer_id, announcement->address);
      peers.push_back({announcement->peer_id, record.expires_at, announcement->queue_length});
    }
    std::lock_guard lock(stage.mu);
    for (auto& [id, address] : addresses) stage.addresses[id] = address;
    stage.router.set_peers(peers, now());
  }

  std::shared_ptr<typename T::client_type> client_for(const std::string& address) { return clients_.get(address); }

  void count(const std::string& peer, TaskKind kind, bool ok) {
    std::lock_guard lock(served_mu_);
    ServedCounts& counts = served_[peer];
    if (!ok) {
      ++counts.failures;
    } else if (kind == TaskKind::forward) {
      ++counts.forward;
    } else {
      ++counts.backward;
    }
  }

  // One hop: pick a peer, call it, retry elsewhere on failure. The result is an
  // owned copy of the reply's tensors.
  Result<std::vector<Tensor>> call_stage(int index, TaskKind kind, wire::MessageKind message_kind,
                            const std::vector<TensorView>& tensors, int64_t batch, MicrobatchOutcome* outcome) {
    StageState& stage = *stages_[index];
    const double give_up_at = now() + config_.abandon_after_seconds;
    std::vector<std::string> tried;
    wire::MessageHeader header;
    header.kind = message_kind;
    header.stage = static_cast<uint32_t>(index);
    header.request_id = next_request_.fetch_add(1);
    SWARM_ASSIGN_OR_RETURN(wire::Frames request, wire::encode_message(header, tensors));
    Status last_error = unavailable("stage {} has no peers", index);
    bool force_refresh = false;
    while (true) {
      refresh(stage, index, force_refresh);
      force_refresh = false;
      std::optional<std::string> peer;
      std::string address;
      {
        std::lock_guard lock(stage.mu);
        peer = stage.router.choose(kind, batch, now(), tried);
        if (peer) address = stage.addresses[*peer];
      }
      if (!peer) {
        if (now() > give_up_at) {
          return unavailable("no peer of stage {} could serve it for {:.0f} s; last error: {}", index,
                             config_.abandon_after_seconds, last_error.to_string());
        }
        // Every known peer failed this hop: look again, and let them be tried anew.
        tried.clear();
        force_refresh = true;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      auto client = client_for(address);
      const double timeout = kind == TaskKind::forward ? config_.forward_timeout_seconds
                                                               : config_.backward_timeout_seconds;
      const double started = now();
      Result<wire::Frames> reply = unavailable("cannot connect to {}", address);
      if (client) {
        reply = client->call(request, Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                        std::chrono::duration<double>(timeout)))
                    .get();
      }
      const double duration = now() - started;
      Result<std::vector<Tensor>> tensor = decode_reply(reply);
      const bool ok = tensor.is_ok();
      const auto outcome_kind = ok ? Outcome::success
                                   : (tensor.status().code() == StatusCode::deadline_exceeded ? Outcome::timeout
                                                                                              : Outcome::error);
      {
        std::lock_guard lock(stage.mu);
        stage.router.report(*peer, kind, batch, outcome_kind, duration, now());
      }
      count(*peer, kind, ok);
      if (!ok) {
        std::lock_guard lock(served_mu_);
        events_.push_back({outcome_kind == Outcome::timeout ? "timed_out" : "banned", *peer, index,
                           tensor.status().to_string()});
      }
      if (ok) return tensor;
      // A bad request is our fault, not the peer's: retrying elsewhere cannot help.
      if (tensor.status().code() == StatusCode::invalid_argument) return tensor.status();
      last_error = tensor.status().with_context(*peer);
      ++outcome->retries;
      tried.push_back(*peer);
    }
  }

  static Result<std::vector<Tensor>> decode_reply(const Result<wire::Frames>& reply) {
    if (!reply.is_ok()) return reply.status();
    SWARM_ASSIGN_OR_RETURN(wire::DecodedMessage message, wire::decode_message(reply->views(), wire::Limits{}));
    if (message.header.kind == wire::MessageKind::error) return wire::status_from_error_reply(message.header);
    if (message.header.kind != wire::MessageKind::result) return internal("unexpected reply kind");
    std::vector<Tensor> tensors;
    for (const auto& decoded : message.tensors) {
      SWARM_ASSIGN_OR_RETURN(Tensor copy, Tensor::copy_of(decoded.view));
      tensors.push_back(std::move(copy));
    }
    if (tensors.empty()) tensors.emplace_back();  // e.g. the first stage's backward: no input gradient
    return tensors;
  }

  TrainerConfig config_;
  R* registry_;
  Clock::time_point started_at_;
  std::vector<std::unique_ptr<StageState>> stages_;
  std::atomic<uint64_t> next_request_{1};

  ClientCache<T> clients_;
  mutable std::mutex ledger_mu_;
  Ledger ledger_;
  mutable std::mutex served_mu_;
  std::map<std::string, ServedCounts> served_;
  std::vector<TrainerEvent> events_;
};

}  // namespace swarm
