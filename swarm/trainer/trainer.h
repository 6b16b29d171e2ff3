// trainer: pushes microbatches through the stages of a swarm.
//
// Messages follow the typed stage protocol (swarm/protocol/stage_protocol.h). The
// trainer keeps the exact bytes each stage returned and passes them on, to the next
// stage and again with the backward, so activations are encoded once, by the peer
// that computed them, and a recomputed forward sees bit-identical input.
//
// For every hop the Router picks a peer of the next stage; a failed or late
// peer is reported and the hop is retried on another peer of the same stage.
// The trainer keeps each stage's input until that stage's backward is done,
// because any peer may serve the backward by recomputing the forward. Every
// microbatch ends in the ledger as completed or abandoned (with a reason):
// nothing is silently lost. Many threads may run microbatches at once.
//
// Each microbatch has an id, a random per-trainer nonce plus the trainer's
// microbatch counter, which every request of it carries (retries included), so a
// peer accumulates its backward at most once. Each attempt also carries a deadline
// a little before the trainer stops waiting: a peer that accepts the work in time
// has that margin to get its reply back before the hop is retried elsewhere.
//
//   swarm::Trainer<StochasticWiringRouter, ZmqTransport, DhtRegistry, StandardCodecs> trainer(config, routers, &registry);
//   MicrobatchOutcome outcome = trainer.run_microbatch(tokens, targets);
#pragma once

#include <algorithm>
#include <atomic>
#include <limits>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "swarm/api/codec.h"
#include "swarm/api/registry.h"
#include "swarm/api/router.h"
#include "swarm/api/transport.h"
#include "swarm/averaging/stage_view.h"
#include "swarm/core/log.h"
#include "swarm/core/random.h"
#include "swarm/protocol/client_cache.h"
#include "swarm/protocol/pipeline_result.h"
#include "swarm/protocol/records.h"
#include "swarm/protocol/stage_protocol.h"
#include "swarm/protocol/tensor_codec.h"
#include "swarm/trainer/hop_returns.h"
#include "swarm/wire/wire.h"

namespace swarm {

struct TrainerConfig {
  int num_stages = 2;
  // Peer to peer: a training microbatch goes to a peer of stage 0 as one pipeline
  // request and stage to stage through the peers; the trainer sends tokens and
  // targets and gets the loss. Evaluation stays in hub mode (forwards only).
  bool peer_to_peer = false;
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
  // A swarm with an owner: this trainer's certificate (text), sent with every stage
  // request, since peers serve certified callers only. Empty otherwise.
  std::string credential;
  // Activations travel in this codec, the backward's gradients in gradient_codec
  // (unset: codec); every stage must declare the same two (check_stages).
  CodecId codec = CodecId::blockwise8;
  std::optional<CodecId> gradient_codec;
  // Peer to peer in a secured swarm: the hop chain a pipeline request carries to
  // `next_peer`, made from the chain it arrived with (empty at the trainer, which
  // starts one). Unset: pipelines carry none.
  std::function<Result<std::string>(const protocol::StageRequest& request, std::string_view next_peer)> sign_hop;
  // Peer to peer: a peer that took a pipeline and sent nothing back by its deadline
  // (no reply at all; an error reply is its stage's trouble, not silence) is left out
  // of this trainer's pipeline choices, for this long the first time and twice as
  // long each time again, up to silent_peer_leave_out_max_seconds; an answer resets
  // it. The rendezvous choice would otherwise send it every microbatch it ranks
  // first, each costing a deadline, for as long as it keeps announcing itself; a
  // merely slow peer costs the stage a short while.
  double silent_peer_leave_out_seconds = 30.0;
  double silent_peer_leave_out_max_seconds = 600.0;
  // Peer to peer, the trainer a peer passes pipelines on with: that peer's id. Its
  // hops are answered at once (accepted, or busy and the like, retried at a
  // stage-mate at once) and their outcomes come back to the peer as
  // pipeline_result requests, which it hands to deliver_pipeline_result(). Empty:
  // a pipeline's reply is its outcome (the trainer's own, to stage 0).
  std::string reply_to;
};

// Pipeline payloads (all four transfers) this trainer sent and received, cumulative:
// logical values and encoded bytes. Every pipeline message has the trainer at one end.
struct WireVolume {
  int64_t values = 0;
  int64_t bytes = 0;
};

struct MicrobatchOutcome {
  bool completed = false;
  float loss = 0;
  std::vector<float> metrics;  // the loss stage's, after the loss, as its io_spec names them
  int retries = 0;
  std::string abandon_reason;
};

// Every microbatch started ends as completed or abandoned.
struct Ledger {
  int64_t started = 0;
  int64_t completed = 0;
  int64_t abandoned = 0;
  int64_t retries = 0;
  int64_t samples_completed = 0;  // rows of the completed microbatches: what each stage should have accumulated
  std::vector<std::string> abandon_reasons;
};

// Something a router decided about a peer, for the run's event log.
struct TrainerEvent {
  std::string event;  // "banned" (an error), "timed_out", "left_out_silent" (after a pipeline's timed_out)
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

// A peer's `info` answer as a run's report wants it.
struct PeerInfoReport {
  std::string peer;
  int stage = 0;
  Result<protocol::PeerInfo> info = unavailable("not asked");
};

template <Router Rt, Transport T, Registry R, CodecTable Codecs>
class Trainer {
 public:
  Trainer(TrainerConfig config, std::vector<Rt> routers, R* registry)
      : config_(std::move(config)), codecs_(codecs_of(config_)),
        registry_(registry), started_at_(Clock::now()),
        microbatch_nonce_(draw_nonce(config_.trainer_id)), clients_(config_.client) {
    for (auto& router : routers) stages_.push_back(std::make_unique<StageState>(std::move(router)));
  }

  // After `when`, a hop that finds no peer to serve it gives up at once instead
  // of waiting abandon_after_seconds: a run's time limit bounds its draining and
  // validation too. Calls already sent still end by their own timeouts.
  void give_up_waiting_after(Clock::time_point when) {
    give_up_by_ = std::chrono::duration<double>(when - started_at_).count();
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
      ledger_.samples_completed += tokens.shape().rank() > 0 ? tokens.shape()[0] : 1;
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

  // Registry records refused so far: malformed, out of range, or for another stage.
  int64_t bad_records() const { return bad_records_.load(); }

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

  WireVolume wire_volume() const {
    return {wire_values_.load(std::memory_order_relaxed), wire_bytes_.load(std::memory_order_relaxed)};
  }

  // A stage's StageSpec, asked of one of its peers (`info`). Errors: no peer known,
  // the peer unreachable, or a malformed answer.
  Result<protocol::StageSpec> stage_spec(int index) {
    if (index < 0 || index >= config_.num_stages) return invalid_argument("stage {} does not exist", index);
    StageState& stage = *stages_[index];
    refresh(stage, index, /*force=*/true);
    std::string address;
    {
      std::lock_guard lock(stage.mu);
      if (!stage.addresses.empty()) address = stage.addresses.begin()->second.address;
    }
    if (address.empty()) return unavailable("stage {} has no peers", index);
    auto client = client_for(address);
    if (!client) return unavailable("cannot connect to {}", address);
    SWARM_ASSIGN_OR_RETURN(wire::Frames request, protocol::encode_info_request(index, config_.credential));
    SWARM_ASSIGN_OR_RETURN(wire::Frames reply,
                           client->call(std::move(request), deadline_after(config_.forward_timeout_seconds)).get());
    return protocol::parse_info_reply(reply, wire::Limits{});
  }

  // Before training: every stage sends this trainer's codecs and the last one takes
  // targets, so a mismatch is one clear error rather than abandoned microbatches.
  Status check_stages() {
    std::optional<TensorSpec> previous_output;
    for (int s = 0; s < config_.num_stages; ++s) {
      SWARM_ASSIGN_OR_RETURN(protocol::StageSpec spec, stage_spec(s));
      if (previous_output && !fits(*previous_output, spec.io.input)) {
        return failed_precondition("stage {} returns {} but stage {} takes {}", s - 1, describe(*previous_output), s,
                                   describe(spec.io.input));
      }
      previous_output = spec.io.output;
      SWARM_RETURN_IF_ERROR(check_codecs(s, spec));
      if (spec.io.targets.has_value() != (s == config_.num_stages - 1)) {
        return failed_precondition("stage {} {} targets; only the last stage of {} does", s,
                                   spec.io.targets ? "takes" : "does not take", config_.num_stages);
      }
    }
    return Status::ok();
  }

  // Asks every given peer (id, stage, address) for its info at once; a peer that
  // does not answer by the deadline has an error there.
  std::vector<PeerInfoReport> peer_infos(const std::vector<std::tuple<std::string, int, std::string>>& peers,
                                         double timeout_seconds) {
    const Deadline deadline = deadline_after(timeout_seconds);
    std::vector<PeerInfoReport> reports;
    std::vector<std::optional<Call>> calls;
    for (const auto& [id, stage, address] : peers) {
      reports.push_back({id, stage});
      calls.emplace_back();
      auto client = client_for(address);
      auto request = protocol::encode_info_request(stage, config_.credential);
      if (!client || !request.is_ok()) {
        reports.back().info = client ? request.status() : unavailable("cannot connect to {}", address);
        continue;
      }
      calls.back() = client->call(std::move(request).value(), deadline);
    }
    for (size_t i = 0; i < reports.size(); ++i) {
      if (!calls[i]) continue;
      Result<wire::Frames> reply = calls[i]->get();
      reports[i].info = reply.is_ok() ? protocol::parse_peer_info(*reply, wire::Limits{})
                                      : Result<protocol::PeerInfo>(reply.status());
    }
    return reports;
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
    struct Known {
      std::string address;
      double seen = 0;  // when a record last announced it, on now()'s clock
    };
    std::map<std::string, Known> addresses;  // peer id -> where it serves
    double last_refresh = -1e9;
    std::set<std::string> banned;  // by the stage's majority: routed nothing
    double banned_read_at = -1e9;
    struct Silence {
      double until = 0;  // on now()'s clock
      int times = 0;     // silences since its last answer
    };
    std::map<std::string, Silence> silent;  // peer to peer: took a pipeline, never answered
  };

  // Longer than a record lives (the announce TTL), shorter than a flood takes to matter.
  static constexpr double kForgetPeerSeconds = 60.0;
  // How often a stage's progress records are read for its bans: a ban is for good,
  // and the lookup is a registry round trip per stage.
  static constexpr double kBannedReadSeconds = 5.0;
  // Forwards run again for one stage's backward when the peer of the last one
  // cannot take it; each costs a forward and a round trip.
  static constexpr int kMaxRebinds = 3;

  double now() const { return std::chrono::duration<double>(Clock::now() - started_at_).count(); }

  static protocol::StageSpec codecs_of(const TrainerConfig& config) {
    protocol::StageSpec codecs;
    codecs.codec = config.codec;
    codecs.gradient_codec = config.gradient_codec;
    return codecs;
  }

  // A stage that declares other codecs would refuse every request of this trainer.
  Status check_codecs(int s, const protocol::StageSpec& spec) const {
    if (spec.codec != config_.codec) {
      return failed_precondition("stage {} sends codec {}, this trainer runs {} (pass the same --codec everywhere)", s,
                                 codec_name(spec.codec), codec_name(config_.codec));
    }
    const CodecId theirs = protocol::codec_for(spec, protocol::TensorRole::grad_input);
    const CodecId ours = protocol::codec_for(codecs_, protocol::TensorRole::grad_input);
    if (theirs != ours) {
      return failed_precondition(
          "stage {} sends gradients in codec {}, this trainer runs {} (pass the same --gradient-codec everywhere)", s,
          codec_name(theirs), codec_name(ours));
    }
    return Status::ok();
  }

  // Random per trainer object, so two trainers (or two runs of one) never share ids.
  static uint64_t draw_nonce(const std::string& trainer_id) {
    std::random_device device;
    const uint64_t drawn = (static_cast<uint64_t>(device()) << 32) ^ device();
    const uint64_t time = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
    return SplitMix64(drawn ^ time ^ std::hash<std::string>{}(trainer_id)).next();
  }

  // Unique per microbatch of this trainer: the counter never repeats, and 0 (no id) is skipped.
  uint64_t next_microbatch_id() {
    while (true) {
      const uint64_t id = microbatch_nonce_ + next_microbatch_.fetch_add(1);
      if (id != 0) return id;
    }
  }

  MicrobatchOutcome run(const Tensor& tokens, const Tensor& targets, bool backward) {
    if (backward && config_.peer_to_peer) return run_pipeline(tokens, targets);
    MicrobatchOutcome outcome;
    const int last = config_.num_stages - 1;
    const uint64_t microbatch = next_microbatch_id();
    const int64_t batch = tokens.shape().rank() > 0 ? tokens.shape()[0] : 1;
    auto first = protocol::encode_floats<Codecs>(tokens, protocol::codec_for(codecs_, protocol::TensorRole::input));
    if (!first.is_ok()) return abandon(outcome, 0, "forward", first.status());
    // Each stage's input, as sent, until that stage's backward is done.
    std::vector<wire::EncodedTensor> inputs(config_.num_stages);
    inputs[0] = std::move(first).value();
    const wire::EncodedTensor labels = protocol::raw_tensor(targets);
    // The peer that served each stage's forward: a peer takes a backward only for
    // a forward it served this trainer (ForwardLedger).
    std::vector<std::string> forward_peer(config_.num_stages);
    for (int s = 0; s < last; ++s) {
      auto reply = call_stage(s, make_request(wire::MessageKind::forward, microbatch, inputs[s]), batch, &outcome,
                              &forward_peer[s]);
      if (!reply.is_ok()) return abandon(outcome, s, "forward", reply.status());
      if (!reply->tensor) return abandon(outcome, s, "forward", internal("the reply carries no output"));
      inputs[s + 1] = std::move(*reply->tensor);
    }
    if (!backward) {
      auto reply = call_stage(last, make_request(wire::MessageKind::forward, microbatch, inputs[last], {}, labels),
                              batch, &outcome);
      if (!reply.is_ok()) return abandon(outcome, last, "forward", reply.status());
      outcome.loss = *reply->loss;
      outcome.metrics = std::move(reply->metrics);
      outcome.completed = true;
      return outcome;
    }
    // The last stage's forward and backward are one request: its reply is
    // [input gradient, loss], which saves a forward and a round trip.
    Tensor d_loss = *Tensor::empty(Shape{1}, DType::f32);
    d_loss.data<float>()[0] = protocol::kLossGradient;
    wire::EncodedTensor grad = protocol::raw_tensor(d_loss);
    for (int s = last; s >= 0; --s) {
      auto reply = s == last ? call_stage(s, make_request(wire::MessageKind::backward, microbatch, inputs[s], grad,
                                                          labels),
                                          batch, &outcome)
                             : backward_where_forwarded(s, microbatch, inputs[s], grad, batch, &outcome,
                                                        forward_peer[s]);
      if (!reply.is_ok()) return abandon(outcome, s, "backward", reply.status());
      if (s == last) {
        outcome.loss = *reply->loss;
        outcome.metrics = std::move(reply->metrics);
      }
      if (s > 0) {
        if (!reply->tensor) return abandon(outcome, s, "backward", internal("the reply carries no input gradient"));
        grad = std::move(*reply->tensor);
      }
      inputs[s] = wire::EncodedTensor();  // this stage's backward is done: its input can go
    }
    outcome.completed = true;
    return outcome;
  }

  // A stage's backward at the peer that served its forward. When that peer cannot
  // take it (gone, busy past its deadline, or it forgot the forward), the forward
  // runs again at a peer the router picks, and the backward follows it there: the
  // output gradient belongs to the first forward's output, as with any recompute.
  Result<protocol::StageReply> backward_where_forwarded(int s, uint64_t microbatch, const wire::EncodedTensor& input,
                                                        const wire::EncodedTensor& grad, int64_t batch,
                                                        MicrobatchOutcome* outcome, std::string& peer) {
    Status last_error = unavailable("stage {}: no forward to take the backward", s);
    std::vector<std::string> failed;
    for (int attempt = 0; attempt <= kMaxRebinds; ++attempt) {
      if (attempt > 0) {
        auto again = call_stage(s, make_request(wire::MessageKind::forward, microbatch, input), batch, outcome, &peer,
                                nullptr, failed);
        if (!again.is_ok()) return again.status();
      }
      auto reply = call_stage(s, make_request(wire::MessageKind::backward, microbatch, input, grad), batch, outcome,
                              nullptr, &peer);
      if (reply.is_ok() || reply.status().code() == StatusCode::invalid_argument) return reply;
      // A retry whose first attempt the peer did accumulate (its reply came too
      // late): the first stage's backward replies nothing, so it is done.
      if (s == 0 && reply.status().code() == StatusCode::already_exists) return protocol::StageReply{};
      last_error = reply.status().with_context(peer);
      failed.push_back(peer);
      ++outcome->retries;
    }
    return last_error.with_context(fmt::format("stage {}: {} forwards, none took its backward", s, kMaxRebinds + 1));
  }

  // Peer to peer: the tokens and targets to a peer of stage 0, which passes the rest
  // on; the loss comes back. A failed attempt is retried at another stage-0 peer
  // under the same microbatch id.
  MicrobatchOutcome run_pipeline(const Tensor& tokens, const Tensor& targets) {
    MicrobatchOutcome outcome;
    const uint64_t microbatch = next_microbatch_id();
    const int64_t batch = tokens.shape().rank() > 0 ? tokens.shape()[0] : 1;
    auto first = protocol::encode_floats<Codecs>(tokens, protocol::codec_for(codecs_, protocol::TensorRole::input));
    if (!first.is_ok()) return abandon(outcome, 0, "pipeline", first.status());
    auto reply = call_stage(0, make_request(wire::MessageKind::pipeline, microbatch, *first, std::nullopt,
                                            protocol::raw_tensor(targets)),
                            batch, &outcome);
    if (!reply.is_ok()) return abandon(outcome, 0, "pipeline", reply.status());
    outcome.loss = *reply->loss;
    outcome.metrics = std::move(reply->metrics);
    outcome.completed = true;
    return outcome;
  }

 public:
  // Peer to peer, for a peer that embeds this trainer to reach the next stage:
  // routes the hop to a peer of hop.next_stage, retrying elsewhere until the
  // hop's deadline (less a margin for the sender's own backward and reply).
  Result<protocol::StageReply> pass_pipeline_on(const protocol::PipelineHop& hop) {
    if (hop.next_stage < 0 || hop.next_stage >= config_.num_stages) {
      return invalid_argument("no stage {} to pass a pipeline on to", hop.next_stage);
    }
    MicrobatchOutcome scratch;
    const int64_t batch = hop.output.dims.empty() ? 1 : hop.output.dims[0];
    protocol::StageRequest request =
        make_request(wire::MessageKind::pipeline, hop.microbatch_id, hop.output, std::nullopt, hop.targets);
    request.hop_chain = hop.hop_chain;  // call_peer extends it to the peer it picks
    return call_stage(hop.next_stage, std::move(request), batch, &scratch, nullptr, nullptr, {}, hop.deadline_unix_ms);
  }

  // Hops answered at once (config.reply_to set): the outcome of a pipeline this
  // trainer passed on, from the peer that took it; refused unless that peer sends
  // it for that microbatch under the pipeline's token (HopReturns).
  Status deliver_pipeline_result(protocol::PipelineResult result) { return returns_.deliver(std::move(result)); }
  // The peer stops: whatever waits for an outcome gives up now.
  void close_hop_returns() { returns_.close(); }

  // Hops answered at once: this peer took a pipeline from `peer` of `stage` and
  // sends its outcome back there, by the pipeline's deadline, but at least 1 s and
  // at most 30 s: a caller's far deadline must not hold the worker that long.
  Status return_pipeline_result(int stage, const std::string& peer, uint64_t microbatch, uint64_t return_id,
                                const Result<protocol::StageReply>& outcome, int64_t deadline_unix_ms) {
    if (stage < 0 || stage >= config_.num_stages) return invalid_argument("no stage {} to return a pipeline to", stage);
    StageState& state = *stages_[stage];
    std::string address;
    for (bool force : {false, true}) {
      refresh(state, stage, force);
      std::lock_guard lock(state.mu);
      if (auto known = state.addresses.find(peer); known != state.addresses.end()) address = known->second.address;
      if (!address.empty()) break;
    }
    if (address.empty()) return unavailable("peer {} of stage {} is not in the registry", peer, stage);
    SWARM_ASSIGN_OR_RETURN(wire::Frames frames,
                           protocol::encode_pipeline_result(stage, next_request_.fetch_add(1), microbatch,
                                                            config_.reply_to, return_id, outcome, config_.credential));
    auto client = client_for(address);
    if (!client) return unavailable("cannot connect to {}", address);
    const double left = (deadline_unix_ms - protocol::unix_millis_now()) / 1000.0;
    if (outcome.is_ok()) count_volume(protocol::volume_of(*outcome));
    auto answer = client->call(std::move(frames), deadline_after(std::clamp(left, 1.0, 30.0))).get();
    if (!answer.is_ok()) return answer.status();
    auto decoded = wire::decode_message(answer->views(), wire::Limits{});
    if (!decoded.is_ok()) return decoded.status();
    if (decoded->header.kind == wire::MessageKind::error) return wire::status_from_error_reply(decoded->header);
    return Status::ok();
  }

 private:
  protocol::StageRequest make_request(wire::MessageKind kind, uint64_t microbatch, const wire::EncodedTensor& input,
                                      std::optional<wire::EncodedTensor> grad_output = std::nullopt,
                                      std::optional<wire::EncodedTensor> targets = std::nullopt) {
    return protocol::StageRequest{kind,       next_request_.fetch_add(1), input,
                                  std::move(grad_output), std::move(targets), microbatch,
                                  0,          config_.credential};
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
    const std::set<std::string> banned = banned_in(stage, index);
    std::vector<PeerAnnouncement> peers;
    std::vector<std::pair<std::string, std::string>> addresses;
    for (const auto& record : *records) {
      auto announcement = PeerAnnouncementRecord::from_json(record.value);
      if (!announcement.is_ok() || announcement->stage != index) {
        bad_records_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      if (!announcement->serving) continue;  // still downloading the stage's state
      if (banned.count(announcement->peer_id) != 0) continue;
      addresses.emplace_back(announcement->peer_id, announcement->address);
      peers.push_back({announcement->peer_id, record.expires_at, announcement->queue_length});
    }
    const double t = now();
    std::lock_guard lock(stage.mu);
    for (auto& [id, address] : addresses) stage.addresses[id] = {address, t};
    // Peers gone for longer than any record lives are forgotten, so announcements
    // under ever-new ids cannot grow the map without bound.
    std::erase_if(stage.addresses, [&](const auto& entry) { return t - entry.second.seen > kForgetPeerSeconds; });
    stage.router.set_peers(peers, t);
  }

  // Whom the stage's majority banned from its rounds, by its progress records: the
  // samples such a peer takes would never be averaged. On a failed lookup, the
  // last answer stands.
  std::set<std::string> banned_in(StageState& stage, int index) {
    {
      std::lock_guard lock(stage.mu);
      if (now() - stage.banned_read_at < kBannedReadSeconds) return stage.banned;
      stage.banned_read_at = now();
    }
    auto records = registry_->get(progress_registry_key(index));
    std::lock_guard lock(stage.mu);
    if (!records.is_ok()) return stage.banned;
    std::vector<ProgressRecord> progress;
    for (const auto& record : *records) {
      auto parsed = ProgressRecord::from_json(record.value);
      if (parsed.is_ok() && parsed->stage == index && parsed->peer_id == record.subkey) progress.push_back(*parsed);
    }
    std::set<std::string> banned = banned_by_stage(progress, registry_->now(), GlobalBatchConfig{}.stale_after_seconds);
    for (const auto& id : banned) {
      if (stage.banned.count(id) == 0) log_warn("trainer: stage {} banned {} from its rounds; not routed to", index, id);
    }
    stage.banned = banned;
    return banned;
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

  // One hop: pick a peer, call it, retry elsewhere on failure. The reply's tensors
  // share the received frames.
  // `served_by`: set to the peer that answered. `pinned`: only that peer is asked,
  // once (its failure is the caller's to handle).
  Result<protocol::StageReply> call_stage(int index, protocol::StageRequest message, int64_t batch,
                                          MicrobatchOutcome* outcome, std::string* served_by = nullptr,
                                          const std::string* pinned = nullptr,
                                          const std::vector<std::string>& exclude = {},
                                          int64_t deadline_cap_unix_ms = 0) {
    StageState& stage = *stages_[index];
    const TaskKind kind = message.kind == wire::MessageKind::forward ? TaskKind::forward : TaskKind::backward;
    double give_up_at = std::min(now() + config_.abandon_after_seconds, give_up_by_.load());
    if (deadline_cap_unix_ms > 0) {
      give_up_at = std::min(give_up_at, now() + (deadline_cap_unix_ms - protocol::unix_millis_now()) / 1000.0);
    }
    // Encodable before any peer is asked.
    SWARM_RETURN_IF_ERROR(protocol::encode_request(message, index, reply_codec(message.kind)).status());
    Hop hop{index, kind, batch, message.targets.has_value(), protocol::volume_of(message)};
    // A pipeline from stage `index` runs every stage after it: a backward's time for each.
    hop.timeout_seconds = message.kind == wire::MessageKind::pipeline
                              ? config_.backward_timeout_seconds * (config_.num_stages - index)
                              : (kind == TaskKind::forward ? config_.forward_timeout_seconds
                                                           : config_.backward_timeout_seconds);
    hop.deadline_cap_unix_ms = deadline_cap_unix_ms;
    std::vector<std::string> tried = exclude;
    size_t failures = 0, busy_answers = 0;  // since the last look
    Status last_error = unavailable("stage {} has no peers", index);
    bool force_refresh = false;
    while (true) {
      refresh(stage, index, force_refresh);
      force_refresh = false;
      if (pinned != nullptr) {
        std::optional<std::pair<std::string, std::string>> peer = choose_pinned(stage, kind, batch, *pinned);
        if (!peer) return unavailable("stage {}: peer {} is no longer usable", index, *pinned);
        return call_peer(stage, hop, peer->first, peer->second, message);
      }
      std::optional<std::pair<std::string, std::string>> peer =
          message.kind == wire::MessageKind::pipeline ? choose_for_microbatch(stage, kind, batch, message.microbatch_id, tried)
                                                      : choose(stage, kind, batch, tried);
      if (!peer) {
        if (now() > give_up_at) {
          if (give_up_at == give_up_by_.load()) {
            return unavailable("no peer of stage {} could serve it before the run's deadline; last error: {}", index,
                               last_error.to_string());
          }
          return unavailable("no peer of stage {} could serve it for {:.0f} s; last error: {}", index,
                             config_.abandon_after_seconds, last_error.to_string());
        }
        // Every known peer failed this hop: look again, and let them be tried anew.
        // Peers that all answered busy are alive: no need to look again.
        force_refresh = !(failures > 0 && busy_answers == failures);
        tried.clear();
        failures = busy_answers = 0;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      Result<protocol::StageReply> reply = call_peer(stage, hop, peer->first, peer->second, message);
      if (reply.is_ok()) {
        if (served_by != nullptr) *served_by = peer->first;
        return reply;
      }
      // A bad request is our fault, not the peer's: retrying elsewhere cannot help.
      if (reply.status().code() == StatusCode::invalid_argument) return reply.status();
      // A pipeline that peer already accumulated, its reply no longer kept: a stage-mate
      // would count its samples a second time. Lost, and counted as lost, instead.
      if (message.kind == wire::MessageKind::pipeline && reply.status().code() == StatusCode::already_exists) {
        return reply.status().with_context(peer->first);
      }
      last_error = reply.status().with_context(peer->first);
      ++outcome->retries;
      tried.push_back(peer->first);
      ++failures;
      if (message.kind == wire::MessageKind::pipeline && reply.status().code() == StatusCode::resource_exhausted) {
        ++busy_answers;
      }
    }
  }

  struct Hop {
    int stage = 0;
    TaskKind kind = TaskKind::forward;
    int64_t batch = 0;
    bool has_loss = false;
    protocol::PayloadVolume request_volume;
    double timeout_seconds = 0;
    int64_t deadline_cap_unix_ms = 0;  // a pipeline hop's: its sender's own deadline
  };

  // (peer id, address) the router picks, never one already tried for this hop.
  std::optional<std::pair<std::string, std::string>> choose(StageState& stage, TaskKind kind, int64_t batch,
                                                            const std::vector<std::string>& tried) {
    std::lock_guard lock(stage.mu);
    std::optional<std::string> peer = stage.router.choose(kind, batch, now(), tried);
    if (!peer) return std::nullopt;
    auto known = stage.addresses.find(*peer);
    return std::make_pair(*peer, known == stage.addresses.end() ? std::string() : known->second.address);
  }

  // Peer to peer: the usable peer ranked first for this microbatch by rendezvous
  // hashing, so that every chooser with the same view picks the same one, and a
  // retry through another peer of the stage before comes back to the peer that
  // may already have accumulated it (it replays its reply). Each peer gets an
  // equal share whatever its speed: unlike the router's own choice, not
  // weighted by throughput.
  std::optional<std::pair<std::string, std::string>> choose_for_microbatch(StageState& stage, TaskKind kind,
                                                                           int64_t batch, uint64_t microbatch,
                                                                           const std::vector<std::string>& tried) {
    std::lock_guard lock(stage.mu);
    std::vector<std::pair<uint64_t, std::string>> ranked;
    const double t = now();
    // Bounded by the peers known: a forgotten one that announces again starts afresh.
    std::erase_if(stage.silent, [&](const auto& entry) { return stage.addresses.count(entry.first) == 0; });
    for (const auto& [id, known] : stage.addresses) {
      if (std::find(tried.begin(), tried.end(), id) != tried.end()) continue;
      if (auto silence = stage.silent.find(id); silence != stage.silent.end() && silence->second.until > t) continue;
      uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a: the same in every process
      for (unsigned char c : id) hash = (hash ^ c) * 0x100000001b3ull;
      ranked.emplace_back(SplitMix64(hash ^ microbatch).next(), id);
    }
    std::sort(ranked.begin(), ranked.end(), std::greater<>());
    for (const auto& [score, id] : ranked) {
      // The router still says whether it is usable (not banned, not timed out).
      if (router_takes_only(stage, kind, batch, id)) return std::make_pair(id, stage.addresses.at(id).address);
    }
    return std::nullopt;
  }

  // Whether the router, asked with every known peer but `peer` excluded, picks it:
  // it is usable, and the task counts in its wiring as any other. stage.mu held.
  bool router_takes_only(StageState& stage, TaskKind kind, int64_t batch, const std::string& peer) {
    std::vector<std::string> others;
    for (const auto& [id, known] : stage.addresses) {
      if (id != peer) others.push_back(id);
    }
    return stage.router.choose(kind, batch, now(), others) == peer;
  }

  // `pinned`, if the router still deems it usable: the router is asked with every
  // other known peer excluded, so the task counts in its wiring as any other.
  std::optional<std::pair<std::string, std::string>> choose_pinned(StageState& stage, TaskKind kind, int64_t batch,
                                                                   const std::string& pinned) {
    std::lock_guard lock(stage.mu);
    auto known = stage.addresses.find(pinned);
    if (known == stage.addresses.end()) return std::nullopt;
    if (!router_takes_only(stage, kind, batch, pinned)) return std::nullopt;
    return std::make_pair(pinned, known->second.address);
  }

  // A forward's reply carries activations, a backward's an input gradient.
  CodecId reply_codec(wire::MessageKind kind) const { return protocol::reply_codec_for(codecs_, kind); }

  // The peer's deadline leaves this much of the timeout for its reply to come back.
  static double reply_margin_seconds(double timeout) { return std::min(1.0, 0.25 * timeout); }

  // One attempt at one peer, with its own deadline; its outcome goes to the router,
  // the counts and the events.
  Result<protocol::StageReply> call_peer(StageState& stage, const Hop& hop, const std::string& peer,
                                         const std::string& address, protocol::StageRequest message) {
    auto client = client_for(address);
    double timeout = hop.timeout_seconds;
    if (hop.deadline_cap_unix_ms > 0) {
      // Leaves the sender the margin for its own backward and reply.
      const double left = (hop.deadline_cap_unix_ms - protocol::unix_millis_now()) / 1000.0;
      timeout = std::min(timeout, left - reply_margin_seconds(left));
      if (!(timeout > 0)) return deadline_exceeded("no time left for stage {} before the sender's deadline", hop.stage);
    }
    const double started = now();
    const Deadline wait_until = deadline_after(timeout);
    message.deadline_unix_ms =
        protocol::unix_millis_after(protocol::unix_millis_now(), timeout - reply_margin_seconds(timeout));
    if (message.kind == wire::MessageKind::pipeline && config_.sign_hop) {
      SWARM_ASSIGN_OR_RETURN(message.hop_chain, config_.sign_hop(message, peer));
    }
    const bool answered = message.kind == wire::MessageKind::pipeline && !config_.reply_to.empty();
    if (answered) {
      message.reply_to = config_.reply_to;
      message.return_id = returns_.expect(message.microbatch_id, peer);
    }
    Result<wire::Frames> frames = unavailable("cannot connect to {}", address);
    if (client) {
      auto request = protocol::encode_request(message, hop.stage, reply_codec(message.kind));
      if (!request.is_ok()) {
        returns_.forget(message.return_id);
        return request.status();  // checked before the first attempt: not the peer's doing
      }
      count_volume(hop.request_volume);
      frames = client->call(std::move(request).value(), wait_until).get();
    }
    // Silent: nothing came back by the deadline, neither an answer nor, once it
    // was accepted, an outcome.
    const bool accepted = answered && frames.is_ok() && protocol::is_acceptance(*frames);
    if (!accepted) returns_.forget(message.return_id);
    Result<protocol::StageReply> reply =
        accepted        ? returns_.wait(message.return_id, wait_until)
        : frames.is_ok() ? protocol::parse_reply(*frames, wire::Limits{}, hop.has_loss)
                         : Result<protocol::StageReply>(frames.status());
    const bool silent = (accepted ? reply.status() : frames.status()).code() == StatusCode::deadline_exceeded;
    const double duration = now() - started;
    const bool ok = reply.is_ok();
    const Outcome outcome = ok ? Outcome::success
                               : (reply.status().code() == StatusCode::deadline_exceeded ? Outcome::timeout
                                                                                         : Outcome::error);
    // Busy: a pipeline answered at once that the peer has no room. Not a failure
    // of the peer, whom an error would ban; the sender tries a stage-mate.
    const bool busy = message.kind == wire::MessageKind::pipeline && !ok &&
                      reply.status().code() == StatusCode::resource_exhausted;
    if (!busy) {
      std::lock_guard lock(stage.mu);
      stage.router.report(peer, hop.kind, hop.batch, outcome, duration, now());
    }
    if (message.kind == wire::MessageKind::pipeline) {
      if (silent) {
        leave_out_silent(stage, hop.stage, peer, duration);
      } else if (frames.is_ok()) {
        std::lock_guard lock(stage.mu);
        stage.silent.erase(peer);
      }
    }
    count(peer, hop.kind, ok);
    if (ok) {
      count_volume(protocol::volume_of(*reply));
    } else if (!busy) {
      std::lock_guard lock(served_mu_);
      events_.push_back({outcome == Outcome::timeout ? "timed_out" : "banned", peer, hop.stage,
                         reply.status().to_string()});
    }
    return reply;
  }

  void leave_out_silent(StageState& stage, int index, const std::string& peer, double waited) {
    const double t = now();
    double seconds = 0;
    {
      std::lock_guard lock(stage.mu);
      auto& silence = stage.silent[peer];
      // Pipelines it held together time out together: one silence, not one each.
      if (silence.until > t) return;
      ++silence.times;
      seconds = std::min(config_.silent_peer_leave_out_seconds * std::ldexp(1.0, std::min(silence.times - 1, 30)),
                         config_.silent_peer_leave_out_max_seconds);
      silence.until = t + seconds;
    }
    log_warn("{}: peer {} of stage {} took a pipeline and sent nothing back in {:.1f} s; left out of pipelines "
             "for {:.0f} s",
             config_.trainer_id, peer, index, waited, seconds);
    std::lock_guard lock(served_mu_);
    events_.push_back({"left_out_silent", peer, index, fmt::format("no reply in {:.1f} s; out for {:.0f} s", waited, seconds)});
  }

  void count_volume(const protocol::PayloadVolume& volume) {
    wire_values_.fetch_add(volume.values, std::memory_order_relaxed);
    wire_bytes_.fetch_add(volume.bytes, std::memory_order_relaxed);
  }

  TrainerConfig config_;
  HopReturns returns_;
  // config_'s codecs as a StageSpec (no tensors): every stage must declare them,
  // and the protocol's rule (protocol::codec_for) picks among them per tensor.
  const protocol::StageSpec codecs_;
  R* registry_;
  Clock::time_point started_at_;
  std::atomic<double> give_up_by_{std::numeric_limits<double>::infinity()};  // now() seconds
  std::vector<std::unique_ptr<StageState>> stages_;
  std::atomic<uint64_t> next_request_{1};
  const uint64_t microbatch_nonce_;
  std::atomic<uint64_t> next_microbatch_{0};
  std::atomic<int64_t> wire_values_{0};
  std::atomic<int64_t> wire_bytes_{0};

  ClientCache<T> clients_;
  std::atomic<int64_t> bad_records_{0};
  mutable std::mutex ledger_mu_;
  Ledger ledger_;
  mutable std::mutex served_mu_;
  std::map<std::string, ServedCounts> served_;
  std::vector<TrainerEvent> events_;
};

}  // namespace swarm
