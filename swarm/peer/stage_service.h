// stage_service: serves forward and backward requests for the peer's replica.
//
// Every request is checked against the stage's StageSpec before any compute
// (protocol::check_request); float inputs are decoded from the codec the check
// accepted, and replies encoded in the codec protocol::codec_for gives their role
// (activations in the codec, input gradients in the gradient codec). A request whose deadline has passed is dropped before it
// is computed, and a backward is accumulated by the replica (once per microbatch,
// only within its deadline); each refusal is an error reply and a ledger count.
// The replica is reached through a shared pointer that set_replica swaps, so the
// next request already runs on the new one. A stage that does not compute the loss
// takes a backward only for a forward it served the same caller with the same
// input (ForwardLedger), and only once. A pipeline request (peer to peer) runs
// this stage's forward, the rest of the pipeline through the pass_on hook, and
// this stage's backward. From a trainer it is answered when all that is done;
// from a peer (reply_to set) it is answered at once, accepted or busy, runs on a
// HopWorkers thread, and its outcome goes back through the return_pipeline hook
// as a pipeline_result, which the peer that passed it on takes here
// (deliver_result) for the pipeline that waits for it.
//
//   StageService<S, Codecs> service(options, replica, &stats, hooks);
//   wire::Frames reply = service.handle(from, decoded_request);
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>

#include <xxhash.h>

#include "swarm/api/codec.h"
#include "swarm/api/stage.h"
#include "swarm/api/transport.h"
#include "swarm/core/log.h"
#include "swarm/peer/forward_batcher.h"
#include "swarm/peer/forward_ledger.h"
#include "swarm/peer/hop_workers.h"
#include "swarm/peer/peer_stats.h"
#include "swarm/peer/pipeline_replays.h"
#include "swarm/peer/replica.h"
#include "swarm/protocol/pipeline_result.h"
#include "swarm/protocol/stage_protocol.h"
#include "swarm/protocol/tensor_codec.h"
#include "swarm/wire/owned_message.h"
#include "swarm/wire/wire.h"

namespace swarm {

struct StageServiceOptions {
  CodecId codec = CodecId::blockwise8;  // activations
  std::optional<CodecId> gradient_codec;  // the backward's gradients; unset: codec
  int max_batch = 1;
  // Sequences one request may carry: a larger one is refused before any compute,
  // so one caller cannot make the peer allocate activations for an absurd batch.
  int64_t max_request_rows = 256;
  // Emulated machines (tests, routing experiments): total time becomes
  // (compute + emulated_seconds_per_sample x samples, x2.5 for backward) x slowdown.
  double slowdown = 1.0;
  double emulated_seconds_per_sample = 0;
  ForwardLedgerLimits forwards;
  // Pipelines answered at once and in progress here; beyond them a pipeline is
  // answered busy.
  size_t max_answered_pipelines = 64;
  // Pipelines from trainers in progress here at once, each holding a server worker
  // until its outcome; beyond them a pipeline is answered busy. With hops answered
  // at once the outcomes come back to this server, so the server needs workers to
  // spare beyond these, or it would wait for outcomes queued behind the pipelines
  // that wait for them. 0: no bound (hops answered when done).
  size_t max_trainer_pipelines = 0;
};

// What the service asks of the rest of the peer.
// Whether a caller may use this peer's compute, from the key the transport
// authenticated and the credential its request carried; unset, everyone may.
using AdmitCaller = std::function<Status(const PeerIdentity& from, std::string_view credential)>;

// Peer to peer: sends the rest of a pipeline on to a peer of hop.next_stage
// (which one, and retries elsewhere, are the hook's) and returns its reply: the
// gradient of this stage's output and the loss. Blocks until then or the deadline.
using PassPipelineOn = std::function<Result<protocol::StageReply>(const protocol::PipelineHop& hop)>;

// Peer to peer in a secured swarm: the trainer that started a pipeline, from the
// hop chain it carries (checked back to that trainer, ending here, sent by its
// last signer), or permission_denied. A pipeline's retries are told apart by
// (origin, microbatch id), so a member cannot claim another trainer's ids.
using PipelineOrigin = std::function<Result<std::string>(const PeerIdentity& from, const protocol::StageCall& call)>;

// Peer to peer, hops answered at once: sends a pipeline's outcome to the peer of
// `stage` that passed it on (its reply_to), under its return_id, by its deadline.
using ReturnPipeline = std::function<Status(int stage, const std::string& peer, uint64_t microbatch,
                                            uint64_t return_id, const Result<protocol::StageReply>& outcome,
                                            int64_t deadline_unix_ms)>;
// ... and takes one sent here, for the pipeline this peer passed on that waits for it.
using DeliverPipelineResult = std::function<Status(protocol::PipelineResult result)>;

struct StageServiceHooks {
  std::function<Status()> can_serve;                 // an error reply while re-syncing or dead
  std::function<void(int64_t samples)> on_backward;  // the sync loop or the local step
  AdmitCaller admit_caller;                          // a swarm with an owner: certified callers only
  PassPipelineOn pass_on;                            // unset: pipeline requests are refused below the last stage
  PipelineOrigin pipeline_origin;                    // unset: ids alone key pipelines (a swarm of one owner's machines)
  ReturnPipeline return_pipeline;                    // unset: pipelines are answered when done
  DeliverPipelineResult deliver_result;              // unset: pipeline_result requests are refused
};

template <Stage S, CodecTable Codecs>
class StageService {
 public:
  using ReplicaT = Replica<S>;

  StageService(StageServiceOptions options, std::shared_ptr<ReplicaT> replica, StatsBoard* stats,
               StageServiceHooks hooks)
      : options_(options), stats_(stats), hooks_(std::move(hooks)),
        batcher_(options.max_batch, [this] { stats_->update([](PeerStats& s) { ++s.forward_batches; }); }),
        forwards_(options.forwards), hop_workers_(options.max_answered_pipelines) {
    set_replica(std::move(replica));
  }

  void set_replica(std::shared_ptr<ReplicaT> replica) {
    std::lock_guard lock(mu_);
    spec_ = protocol::StageSpec{replica->stage_index(), replica->io_spec(), options_.codec,
                                options_.gradient_codec.value_or(options_.codec)};
    replica_ = std::move(replica);
    std::lock_guard forwards_lock(forwards_mu_);
    forwards_ = ForwardLedger(options_.forwards);  // forwards of another stage bind nothing here
    replays_.clear();
  }
  std::shared_ptr<ReplicaT> replica() const {
    std::lock_guard lock(mu_);
    return replica_;
  }
  protocol::StageSpec spec() const {
    std::lock_guard lock(mu_);
    return spec_;
  }

  // Retries of pipelines this peer had finished, answered with the reply it sent then.
  int64_t pipelines_replayed() const { return replays_.replayed(); }

  // Requests being served or waiting to be; beyond one, this is the queue.
  int64_t in_service() const { return in_service_.load(); }

  wire::Frames handle(const PeerIdentity& from, const wire::DecodedMessage& message) {
    if (message.header.kind == wire::MessageKind::pipeline_result) return take_pipeline_result(from, message);
    InService counted(in_service_);
    const auto started = std::chrono::steady_clock::now();
    std::shared_ptr<ReplicaT> replica;
    protocol::StageSpec spec;
    {
      std::lock_guard lock(mu_);
      replica = replica_;
      spec = spec_;
    }
    const auto error = [&](const Status& status) {
      return wire::make_error_reply(message.header.request_id, message.header.stage, status);
    };
    auto call = protocol::check_request(message, spec);
    if (call.is_ok() && call->batch > options_.max_request_rows) {
      call = resource_exhausted("a request of {} sequences; this peer takes at most {}", call->batch,
                                options_.max_request_rows);
    }
    if (!call.is_ok()) {
      const bool steering = call.status().code() == StatusCode::permission_denied;
      stats_->update([steering](PeerStats& s) { ++(steering ? s.loss_gradient_refused : s.spec_refused); });
      return error(call.status());
    }
    if (hooks_.admit_caller) {
      if (Status admitted = hooks_.admit_caller(from, call->credential); !admitted.is_ok()) {
        stats_->update([](PeerStats& s) { ++s.callers_refused; });
        return error(admitted);
      }
    }
    // A refusal changed the replica's ledger: wake whoever waits on the stats.
    const auto refused = [&](const Status& status) {
      stats_->notify();
      return error(status);
    };
    if (Status timely = admit(*replica, *call); !timely.is_ok()) return refused(timely);
    if (Status ready = hooks_.can_serve(); !ready.is_ok()) return error(ready);
    // The loss stage runs a microbatch's forward and backward as one request: nothing to bind.
    const bool bound = !spec.io.targets.has_value();
    const uint64_t digest = bound ? input_digest(*call->input) : 0;
    if (bound && call->is_backward()) {
      if (Status ok = check_forward(from, *call, digest); !ok.is_ok()) return refused(ok);
    }
    uint64_t pipeline_key = call->microbatch_id;
    if (call->is_pipeline() && hooks_.pipeline_origin) {
      auto origin = hooks_.pipeline_origin(from, *call);
      if (!origin.is_ok()) {
        stats_->update([](PeerStats& s) { ++s.hop_chains_refused; });
        return error(origin.status());
      }
      pipeline_key = keyed_by_origin(*origin, call->microbatch_id);
    }
    if (call->answered_at_once() && hooks_.return_pipeline) {
      return answer_at_once(message, *call, std::move(replica), spec, pipeline_key, started);
    }
    std::optional<InService> held;
    if (call->is_pipeline() && options_.max_trainer_pipelines > 0) {
      held.emplace(trainer_pipelines_);
      if (trainer_pipelines_.load() > static_cast<int64_t>(options_.max_trainer_pipelines)) {
        stats_->update([](PeerStats& s) { ++s.pipelines_busy; });
        return error(resource_exhausted("busy: {} pipelines from trainers in progress here",
                                        options_.max_trainer_pipelines));
      }
    }
    auto reply = call->is_pipeline() ? run_pipeline(*replica, spec, *call, pipeline_key, started)
                                     : serve(*replica, spec, *call, started);
    if (!reply.is_ok()) return refused(reply.status());
    if (!call->is_pipeline()) {
      if (bound) settle_forward(from, *call, digest);
      account(call->is_backward(), call->batch, started);
    }
    auto frames = protocol::encode_reply(call->request_id, spec.stage, *reply);
    return frames.is_ok() ? std::move(frames).value() : error(frames.status());
  }

 private:
  // A served request's samples and time, once: a backward or a pipeline counts its
  // samples toward the step.
  void account(bool accumulated, int64_t batch, std::chrono::steady_clock::time_point started) {
    if (accumulated) hooks_.on_backward(batch);
    // A backward slept out its emulated time before its deadline check.
    const double seconds = accumulated ? elapsed(started) : emulate(started, batch, false);
    record(accumulated, batch, seconds);
  }

  // A pipeline, once: a retry of one finished here gets the same reply, not a
  // second accumulation; a retry of one running here waits for it.
  Result<protocol::StageReply> run_pipeline(ReplicaT& replica, const protocol::StageSpec& spec,
                                            const protocol::StageCall& call, uint64_t key,
                                            std::chrono::steady_clock::time_point started) {
    PipelineReplays::Claimed claimed = replays_.claim(key, deadline_of(call));
    if (claimed.claim == PipelineReplays::Claim::replay) return claimed.reply;
    if (claimed.claim == PipelineReplays::Claim::gave_up) {
      return deadline_exceeded("microbatch {} is still running here", call.microbatch_id);
    }
    ReplayClaim claim(replays_, key);
    auto reply = serve_pipeline(replica, spec, call, key, started);
    if (!reply.is_ok()) return reply;
    claim.finish(&*reply);
    account(true, call.batch, started);
    return reply;
  }

  // A pipeline from a peer of the stage before: accepted (or busy) now, run on a
  // worker of its own, its outcome sent back to reply_to.
  wire::Frames answer_at_once(const wire::DecodedMessage& message, const protocol::StageCall& call,
                              std::shared_ptr<ReplicaT> replica, const protocol::StageSpec& spec, uint64_t key,
                              std::chrono::steady_clock::time_point started) {
    const auto error = [&](const Status& status) {
      return wire::make_error_reply(message.header.request_id, message.header.stage, status);
    };
    if (spec.stage == 0) return error(invalid_argument("stage 0 takes pipelines from trainers, not peers"));
    auto owned = wire::OwnedMessage::copy_of(message);
    const bool taken = hop_workers_.try_run([this, owned, replica = std::move(replica), spec, key, started] {
      // The same checks passed on the same bytes: only the views move to the copy.
      auto again = protocol::check_request(owned->message, spec);
      Result<protocol::StageReply> outcome =
          again.is_ok() ? run_pipeline(*replica, spec, *again, key, started) : Result<protocol::StageReply>(again.status());
      if (!outcome.is_ok()) stats_->notify();
      const wire::MessageHeader& header = owned->message.header;
      Status sent = hooks_.return_pipeline(spec.stage - 1, header.reply_to, header.microbatch_id, header.return_id,
                                           outcome, header.deadline_unix_ms);
      if (!sent.is_ok()) {
        stats_->update([](PeerStats& s) { ++s.pipeline_results_unsent; });
        log_warn("stage {}: the outcome of microbatch {} did not reach peer {}: {}", spec.stage, header.microbatch_id,
                 header.reply_to, sent.to_string());
      }
    });
    if (!taken) {
      stats_->update([](PeerStats& s) { ++s.pipelines_busy; });
      return error(resource_exhausted("busy: {} pipelines in progress here", options_.max_answered_pipelines));
    }
    return protocol::encode_acceptance(call.request_id, spec.stage);
  }

  // The outcome of a pipeline this peer passed on, from the peer that took it.
  wire::Frames take_pipeline_result(const PeerIdentity& from, const wire::DecodedMessage& message) {
    const auto refused = [&](const Status& status) {
      stats_->update([](PeerStats& s) { ++s.pipeline_results_refused; });
      return wire::make_error_reply(message.header.request_id, message.header.stage, status);
    };
    if (!hooks_.deliver_result) return refused(failed_precondition("this peer passes no pipelines on"));
    if (hooks_.admit_caller) {
      if (Status admitted = hooks_.admit_caller(from, message.header.credential); !admitted.is_ok()) {
        stats_->update([](PeerStats& s) { ++s.callers_refused; });
        return wire::make_error_reply(message.header.request_id, message.header.stage, admitted);
      }
    }
    auto result = protocol::parse_pipeline_result(message);
    if (!result.is_ok()) return refused(result.status());
    if (Status delivered = hooks_.deliver_result(std::move(result).value()); !delivered.is_ok()) {
      return refused(delivered);
    }
    return protocol::encode_acceptance(message.header.request_id, static_cast<int>(message.header.stage));
  }

  // Of the input as it crossed the wire: the trainer re-sends a forward's exact bytes.
  static uint64_t input_digest(const wire::DecodedTensor& input) {
    std::array<int64_t, Shape::kMaxRank + 1> head{};  // dtype and codec, then the dims
    head[0] = static_cast<int64_t>(input.dtype) << 8 | static_cast<int64_t>(input.codec);
    const auto dims = input.shape.dims();
    std::copy(dims.begin(), dims.end(), head.begin() + 1);
    const uint64_t seed = XXH3_64bits(head.data(), (dims.size() + 1) * sizeof(int64_t));
    return XXH3_64bits_withSeed(input.payload.data(), input.payload.size(), seed);
  }

  // One trainer's microbatch id under a key of this process's own, so that ids a
  // member picks cannot be made to collide with another trainer's.
  uint64_t keyed_by_origin(std::string_view origin, uint64_t microbatch) const {
    const uint64_t origin_hash = XXH3_64bits_withSeed(origin.data(), origin.size(), origin_seed_);
    const uint64_t both[2] = {origin_hash, microbatch};
    const uint64_t key = XXH3_64bits_withSeed(both, sizeof(both), origin_seed_);
    return key != 0 ? key : 1;
  }

  static uint64_t draw_origin_seed() {
    std::random_device device;
    return (static_cast<uint64_t>(device()) << 32) ^ device();
  }

  static double steady_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }

  Status check_forward(const PeerIdentity& from, const protocol::StageCall& call, uint64_t digest) {
    Status status;
    ForwardLedgerCounts before, after;
    {
      std::lock_guard lock(forwards_mu_);
      before = forwards_.counts();
      status = forwards_.check(from.id, call.microbatch_id, digest, steady_seconds());
      after = forwards_.counts();
    }
    if (!status.is_ok()) {
      stats_->update([&](PeerStats& s) {
        s.backward_unbound += after.unbound - before.unbound;
        s.backward_other_input += after.other_input - before.other_input;
      });
    }
    return status;
  }

  // A served forward binds its backward; a backward that counted spends it.
  void settle_forward(const PeerIdentity& from, const protocol::StageCall& call, uint64_t digest) {
    std::lock_guard lock(forwards_mu_);
    if (call.is_backward()) {
      forwards_.consume(from.id, call.microbatch_id);
    } else {
      forwards_.record(from.id, call.microbatch_id, digest, steady_seconds());
    }
  }

  // Ends a pipeline's claim on every way out: with its reply, or failed.
  struct ReplayClaim {
    PipelineReplays& replays;
    uint64_t microbatch;
    bool finished = false;
    ReplayClaim(PipelineReplays& r, uint64_t id) : replays(r), microbatch(id) {}
    void finish(const protocol::StageReply* reply) {
      replays.finish(microbatch, reply);
      finished = true;
    }
    ~ReplayClaim() {
      if (!finished) replays.finish(microbatch, nullptr);
    }
  };

  static Deadline deadline_of(const protocol::StageCall& call) {
    const int64_t left_ms = call.deadline_unix_ms - protocol::unix_millis_now();
    return Clock::now() + std::chrono::milliseconds(std::clamp<int64_t>(left_ms, 0, protocol::kMaxDeadlineAheadMs));
  }

  struct InService {
    std::atomic<int64_t>& count;
    explicit InService(std::atomic<int64_t>& c) : count(c) { ++count; }
    ~InService() { --count; }
  };

  // Work nobody waits for any more is not started; a deadline beyond what a peer
  // holds work for is a broken or hostile caller.
  static Status admit(ReplicaT& replica, const protocol::StageCall& call) {
    Status status = protocol::check_deadline(call.deadline_unix_ms, protocol::unix_millis_now());
    if (status.code() == StatusCode::deadline_exceeded) replica.count_expired();
    if (status.code() == StatusCode::invalid_argument) replica.count_deadline_refused();
    return status;
  }

  // The loss stage's output: the loss, then the metrics its spec names.
  static Status take_losses(const Tensor& out, const protocol::StageSpec& spec, protocol::StageReply* reply) {
    const size_t metrics = spec.io.metrics.size();
    if (out.dtype() != DType::f32 || out.numel() != static_cast<int64_t>(1 + metrics)) {
      return internal("the loss stage returned {}, not its loss and {} metrics", out.view().describe(), metrics);
    }
    const float* values = out.data<float>();
    reply->loss = values[0];
    reply->metrics.assign(values + 1, values + 1 + metrics);
    return Status::ok();
  }

  Result<protocol::StageReply> serve(ReplicaT& replica, const protocol::StageSpec& spec,
                                     const protocol::StageCall& call, std::chrono::steady_clock::time_point started) {
    Tensor input_storage;
    SWARM_ASSIGN_OR_RETURN(TensorView input, protocol::float_view<Codecs>(*call.input, &input_storage));
    const TensorView* targets = call.targets != nullptr ? &call.targets->view : nullptr;
    protocol::StageReply reply;
    if (!call.is_backward()) {
      SWARM_ASSIGN_OR_RETURN(Tensor out, compute_forward(replica, input, targets));
      if (targets != nullptr) {
        SWARM_RETURN_IF_ERROR(take_losses(out, spec, &reply));
        if (!std::isfinite(*reply.loss)) return invalid_argument("the loss overflowed: targets or input out of range");
      } else {
        SWARM_ASSIGN_OR_RETURN(reply.tensor, encode(out, spec, protocol::TensorRole::output));
      }
      return reply;
    }
    Tensor grad_storage;
    SWARM_ASSIGN_OR_RETURN(TensorView grad_output, protocol::float_view<Codecs>(*call.grad_output, &grad_storage));
    const BackwardTicket ticket{call.microbatch_id, call.deadline_unix_ms, call.batch,
                                [&] { emulate(started, call.batch, true); }};
    Tensor grad_input;
    if (targets != nullptr) {
      SWARM_ASSIGN_OR_RETURN(auto both, replica.forward_and_backward(input, grad_output, *targets, ticket));
      SWARM_RETURN_IF_ERROR(take_losses(both.first, spec, &reply));
      grad_input = std::move(both.second);
    } else {
      SWARM_ASSIGN_OR_RETURN(grad_input, replica.backward(input, grad_output, ticket));
    }
    if (grad_input.defined()) {
      SWARM_ASSIGN_OR_RETURN(reply.tensor, encode(grad_input, spec, protocol::TensorRole::grad_input));
    }
    return reply;
  }

  // Peer to peer: this stage's forward, the rest of the pipeline from a peer of
  // the next stage (the hook's choice), then this stage's backward. The loss
  // stage runs it as the fused backward, its d_loss fixed by the protocol.
  // `key`: the microbatch's id, or its id under its trainer (keyed_by_origin), as
  // the replica remembers it against duplicates.
  Result<protocol::StageReply> serve_pipeline(ReplicaT& replica, const protocol::StageSpec& spec,
                                              const protocol::StageCall& call, uint64_t key,
                                              std::chrono::steady_clock::time_point started) {
    Tensor input_storage;
    SWARM_ASSIGN_OR_RETURN(TensorView input, protocol::float_view<Codecs>(*call.input, &input_storage));
    const BackwardTicket ticket{key, call.deadline_unix_ms, call.batch,
                                [&] { emulate(started, call.batch, true); }};
    protocol::StageReply reply;
    Tensor grad_input;
    if (spec.io.targets) {
      Tensor d_loss = *Tensor::empty(Shape{1}, DType::f32);
      d_loss.data<float>()[0] = protocol::kLossGradient;
      std::unique_lock slot(pipeline_compute_mu_);
      SWARM_ASSIGN_OR_RETURN(auto both, replica.forward_and_backward(input, d_loss.view(), call.targets->view, ticket));
      slot.unlock();
      SWARM_RETURN_IF_ERROR(take_losses(both.first, spec, &reply));
      grad_input = std::move(both.second);
    } else {
      if (!hooks_.pass_on) return failed_precondition("stage {} does not pass pipelines on", spec.stage);
      std::unique_lock slot(pipeline_compute_mu_);
      SWARM_ASSIGN_OR_RETURN(Tensor out, compute_forward(replica, input, nullptr));
      slot.unlock();
      (void)emulate(started, call.batch, false);
      const auto started_backward = std::chrono::steady_clock::now();
      protocol::PipelineHop hop{spec.stage + 1, call.microbatch_id, call.deadline_unix_ms, {}, {},
                                std::string(call.hop_chain)};
      SWARM_ASSIGN_OR_RETURN(hop.output, encode(out, spec, protocol::TensorRole::output));
      const wire::DecodedTensor& targets = *call.targets;
      hop.targets = wire::EncodedTensor{targets.dtype, targets.codec,
                                        std::vector<int64_t>(targets.shape.dims().begin(), targets.shape.dims().end()),
                                        wire::Frame(std::string(targets.payload))};
      SWARM_ASSIGN_OR_RETURN(protocol::StageReply rest, hooks_.pass_on(hop));
      if (!rest.tensor || !rest.loss) return unavailable("stage {}'s reply lacks the gradient or the loss", hop.next_stage);
      // Its shape before any allocation for it: the gradient of exactly this output.
      const auto out_dims = out.shape().dims();
      if (!std::equal(rest.tensor->dims.begin(), rest.tensor->dims.end(), out_dims.begin(), out_dims.end())) {
        return unavailable("stage {} sent a gradient of another shape than the output {}", hop.next_stage,
                           out.shape().to_string());
      }
      SWARM_ASSIGN_OR_RETURN(Tensor grad_output, protocol::decode_encoded<Codecs>(*rest.tensor));
      const BackwardTicket backward_ticket{key, call.deadline_unix_ms, call.batch,
                                           [&] { emulate(started_backward, call.batch, true); }};
      slot.lock();
      SWARM_ASSIGN_OR_RETURN(grad_input, replica.backward(input, grad_output.view(), backward_ticket));
      slot.unlock();
      reply.loss = rest.loss;
      reply.metrics = std::move(rest.metrics);
    }
    if (grad_input.defined()) {
      SWARM_ASSIGN_OR_RETURN(reply.tensor, encode(grad_input, spec, protocol::TensorRole::grad_input));
    }
    return reply;
  }

  static Result<wire::EncodedTensor> encode(const Tensor& tensor, const protocol::StageSpec& spec,
                                            protocol::TensorRole role) {
    return protocol::encode_floats<Codecs>(tensor, protocol::codec_for(spec, role));
  }

  Result<Tensor> compute_forward(ReplicaT& replica, const TensorView& input, const TensorView* targets) {
    if (targets == nullptr && options_.max_batch > 1) return batcher_.forward(replica, input);
    stats_->update([](PeerStats& s) { ++s.forward_batches; });
    return replica.forward(input, targets);
  }

  static double elapsed(std::chrono::steady_clock::time_point started) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  }

  // Sleeps out an emulated machine's extra time; returns the request's total seconds.
  double emulate(std::chrono::steady_clock::time_point started, int64_t batch, bool backward) const {
    const double seconds = elapsed(started);
    const double emulated = options_.emulated_seconds_per_sample * batch * (backward ? 2.5 : 1.0);
    const double extra = emulated * options_.slowdown + seconds * std::max(0.0, options_.slowdown - 1.0);
    if (extra > 0) std::this_thread::sleep_for(std::chrono::duration<double>(extra));
    return seconds + extra;
  }

  void record(bool backward, int64_t batch, double seconds) {
    stats_->update([&](PeerStats& s) {
      (backward ? s.backward : s.forward) += 1;
      if (backward) s.samples += batch;
      if (seconds > 0 && batch > 0) {
        // Backward costs about 2.5 forwards; count it as such for a comparable rate.
        const double rate = batch * (backward ? 2.5 : 1.0) / seconds;
        s.throughput = s.throughput == 0 ? rate : 0.9 * s.throughput + 0.1 * rate;
      }
    });
  }

  const StageServiceOptions options_;
  StatsBoard* stats_;
  StageServiceHooks hooks_;
  ForwardBatcher<ReplicaT> batcher_;
  mutable std::mutex mu_;
  std::shared_ptr<ReplicaT> replica_;
  protocol::StageSpec spec_;
  std::atomic<int64_t> in_service_{0};
  std::atomic<int64_t> trainer_pipelines_{0};
  std::mutex forwards_mu_;
  ForwardLedger forwards_;
  PipelineReplays replays_;
  const uint64_t origin_seed_ = draw_origin_seed();
  // A pipeline computes one at a time here, as a one-worker server serves a hub's
  // requests; it holds no slot while the stages after it run. With the 16 workers
  // computing at once, every backward that waited out a round accumulated the
  // moment it ended, and the next round held up to 8 global batches for one step
  // each time (stage 1 took 101 global steps for 192 batches' samples).
  std::mutex pipeline_compute_mu_;
  // Last: destroyed first, so its jobs end while everything they use is still here.
  HopWorkers hop_workers_;
};

}  // namespace swarm
