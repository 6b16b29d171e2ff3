// stage_protocol: the typed messages between trainers and the peers of a stage, in
// one place for both ends.
//
// Which tensor sits where:
//   forward  = [input]                    reply [output]
//   forward  = [input, targets]           reply [loss]               (the last stage; f32 [1 + metrics])
//   backward = [input, grad_output]       reply [grad_input] or []   (the first stage: tokens have no gradient)
//   backward = [input, d_loss, targets]   reply [grad_input, loss]   (the last stage runs forward and backward
//                                                                     as one request)
//   pipeline = [input, targets]           reply [grad_input, loss]   (peer to peer: the stage runs its forward,
//                                         or [loss] at stage 0       sends the rest of the pipeline on to a peer
//                                                                     of the next stage itself, then its backward;
//                                                                     the last stage as a fused backward)
// Float tensors travel in the codecs the stage declares (codec_for has the rule):
// activations (input and output) in StageSpec::codec, the backward's gradients
// (grad_output and grad_input) in its gradient codec, except the scalar d_loss,
// which is sent raw. The caller names the reply's codec (MessageHeader::reply_codec,
// see reply_codec_for) and encodes its own float inputs by the same rule. Targets
// and integer tensors (tokens) always travel raw. A peer checks every request
// against its StageSpec before any compute.
//
// Every stage request carries its microbatch id (the same on every retry of that
// microbatch) and an absolute deadline, in Unix milliseconds because it crosses
// processes: the peers and trainers of a swarm are assumed to keep their wall clocks
// within a fraction of the timeouts of each other. A peer drops work whose deadline
// has passed and accumulates a microbatch's backward at most once.
//
// Payloads are wire::EncodedTensor frames: a trainer keeps the exact bytes a stage
// returned and passes them on (to the next stage, and again with the backward), so a
// recomputed forward on any peer sees bit-identical input and nothing is re-encoded.
//
//   StageRequest request = StageRequest::forward(id, input_frame);
//   SWARM_ASSIGN_OR_RETURN(wire::Frames frames, encode_request(request, stage, reply_codec_for(spec, request.kind)));
//   SWARM_ASSIGN_OR_RETURN(StageCall call, check_request(decoded, spec));   // at the peer
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "swarm/api/codec.h"
#include "swarm/api/stage.h"
#include "swarm/core/status.h"
#include "swarm/core/tensor.h"
#include "swarm/wire/wire.h"

namespace swarm::protocol {

// What a stage takes and sends, as its peers declare it.
struct StageSpec {
  int stage = 0;
  StageIoSpec io;
  // Activations (the input, also as a backward re-sends it, and the output)
  // travel in this codec; integer tensors raw.
  CodecId codec = CodecId::none;
  // The backward's output and input gradients; unset: `codec`. Gradients have
  // their own because they tolerate other errors than activations do (a swarm
  // may send 4-bit activations but want 8-bit gradients).
  std::optional<CodecId> gradient_codec;
};

template <Stage S>
StageSpec stage_spec(const S& stage, int index, CodecId codec, std::optional<CodecId> gradient_codec = std::nullopt) {
  return StageSpec{index, stage.io_spec(), codec, gradient_codec};
}

// What a tensor of a stage message carries (the table above), which picks its codec.
enum class TensorRole { input, output, grad_output, grad_input, targets };

// The one rule for the codec of a float tensor of a stage message:
//   input, output            spec.codec (activations)
//   grad_output, grad_input  the gradient codec (gradient_codec, else codec)
//   targets, and the grad_output of the stage that takes targets (the scalar
//   d_loss)                  raw: labels stay exact, and one value costs nothing
// Integer tensors travel raw whatever their role.
CodecId codec_for(const StageSpec& spec, TensorRole role);

// The codec a request of `kind` asks its reply in (MessageHeader::reply_codec): the
// output's for a forward, the input gradient's for a backward. The last stage's
// loss travels raw under either.
CodecId reply_codec_for(const StageSpec& spec, wire::MessageKind kind);

struct StageRequest {
  wire::MessageKind kind = wire::MessageKind::forward;
  uint64_t request_id = 0;
  wire::EncodedTensor input;
  std::optional<wire::EncodedTensor> grad_output;  // backward only
  std::optional<wire::EncodedTensor> targets;      // the last stage, and every pipeline request
  uint64_t microbatch_id = 0;                      // never 0 on the wire
  int64_t deadline_unix_ms = 0;                    // never 0 on the wire
  std::string credential;                          // MessageHeader::credential
  std::string hop_chain;                           // MessageHeader::hop_chain: pipeline requests only
  std::string reply_to;                            // MessageHeader::reply_to: pipelines a peer passes on
  uint64_t return_id = 0;                          // with reply_to, never 0
};

// Peer to peer: what a stage sends on to a peer of the next one, as a pipeline
// request: its output and the targets it was given, under the microbatch's id,
// by the deadline its own caller set.
struct PipelineHop {
  int next_stage = 0;
  uint64_t microbatch_id = 0;
  int64_t deadline_unix_ms = 0;
  wire::EncodedTensor output;   // in the stage's activation codec
  wire::EncodedTensor targets;  // as they arrived
  std::string hop_chain;        // as it arrived: the sender extends it to the peer it picks
};

// The loss stage's output gradient (d_loss): the protocol fixes it, so a trainer
// cannot scale or flip the gradient of every stage below (check_request refuses any
// other value with permission_denied).
inline constexpr float kLossGradient = 1.0f;

// A peer holds no work longer than this: a deadline further ahead is refused.
constexpr int64_t kMaxDeadlineAheadMs = int64_t{10} * 60 * 1000;

// The system clock in milliseconds since the Unix epoch.
int64_t unix_millis_now();
// now + seconds, in Unix milliseconds, saturating (seconds may be anything a config holds).
int64_t unix_millis_after(int64_t now_ms, double seconds);

// deadline_exceeded once `deadline_ms` is not after `now_ms`; invalid_argument when it
// lies more than kMaxDeadlineAheadMs ahead (a hostile or broken caller). Both >= 0.
Status check_deadline(int64_t deadline_ms, int64_t now_ms);

// A request as the peer serves it: views into the received frames, checked against
// the spec. Float tensors may still be encoded (see decode_float).
struct StageCall {
  wire::MessageKind kind = wire::MessageKind::forward;
  uint64_t request_id = 0;
  int64_t batch = 0;
  const wire::DecodedTensor* input = nullptr;
  const wire::DecodedTensor* grad_output = nullptr;
  const wire::DecodedTensor* targets = nullptr;
  uint64_t microbatch_id = 0;
  int64_t deadline_unix_ms = 0;
  std::string_view credential;  // into the message, as check_request's tensors
  std::string_view hop_chain;   // the same; empty unless a pipeline
  std::string_view reply_to;    // the same; a pipeline from a peer, answered at once
  uint64_t return_id = 0;
  bool is_backward() const { return kind == wire::MessageKind::backward; }
  bool is_pipeline() const { return kind == wire::MessageKind::pipeline; }
  bool answered_at_once() const { return is_pipeline() && !reply_to.empty(); }
};

// A peer's account of the backward samples its replica accepted. Every accepted
// sample sits in exactly one of pending, in_round, stepped or a lost bucket, so
//   samples_accumulated_total == samples_pending + samples_in_round + samples_stepped
//                                + samples_lost_resync + samples_lost_nonfinite + samples_lost_failed_round.
// The last three count requests, not samples.
struct SampleLedger {
  int64_t samples_accumulated_total = 0;  // added into the gradients, each microbatch id once
  int64_t samples_pending = 0;            // toward the next step
  int64_t samples_in_round = 0;           // taken by an all-reduce round not yet over
  int64_t samples_stepped = 0;            // in a step the replica applied
  int64_t samples_lost_resync = 0;        // dropped by a loaded state (re-sync or resume)
  int64_t samples_lost_nonfinite = 0;     // in a step the optimizer refused
  int64_t samples_lost_failed_round = 0;  // in a round that failed
  int64_t samples_lost_moved = 0;         // pending when the peer left for another stage without a round
  int64_t backward_duplicates_refused = 0;
  int64_t expired_dropped = 0;            // forward or backward, before or after computing
  int64_t deadline_refused = 0;           // a deadline beyond kMaxDeadlineAheadMs
  int64_t unaccounted() const;            // 0 when the identity above holds
  friend bool operator==(const SampleLedger&, const SampleLedger&) = default;
};

// Every field with its name (the JSON key, in info replies and in metrics).
inline constexpr std::pair<std::string_view, int64_t SampleLedger::*> kSampleLedgerFields[] = {
    {"samples_accumulated_total", &SampleLedger::samples_accumulated_total},
    {"samples_pending", &SampleLedger::samples_pending},
    {"samples_in_round", &SampleLedger::samples_in_round},
    {"samples_stepped", &SampleLedger::samples_stepped},
    {"samples_lost_resync", &SampleLedger::samples_lost_resync},
    {"samples_lost_nonfinite", &SampleLedger::samples_lost_nonfinite},
    {"samples_lost_failed_round", &SampleLedger::samples_lost_failed_round},
    {"samples_lost_moved", &SampleLedger::samples_lost_moved},
    {"backward_duplicates_refused", &SampleLedger::backward_duplicates_refused},
    {"expired_dropped", &SampleLedger::expired_dropped},
    {"deadline_refused", &SampleLedger::deadline_refused},
};

struct StageReply {
  std::optional<wire::EncodedTensor> tensor;  // output or input gradient
  std::optional<float> loss;
  std::vector<float> metrics;  // after the loss, as the stage's io_spec names them (at most kMaxStageMetrics)
};

// Logical values and payload bytes of the tensors of a message, for the wire volume.
struct PayloadVolume {
  int64_t values = 0;
  int64_t bytes = 0;
  PayloadVolume& operator+=(const PayloadVolume& o) {
    values += o.values;
    bytes += o.bytes;
    return *this;
  }
};
PayloadVolume volume_of(const wire::EncodedTensor& tensor);
PayloadVolume volume_of(const StageRequest& request);
PayloadVolume volume_of(const StageReply& reply);

// A raw tensor for the wire, sharing the tensor's storage (no copy).
wire::EncodedTensor raw_tensor(const Tensor& tensor);

Result<wire::Frames> encode_request(const StageRequest& request, int stage, CodecId reply_codec);

// Checks kind, tensor count, dtypes, ranks, fixed dims, codecs (codec_for and
// reply_codec_for), that targets and grad_output match the input's batch, and that
// a microbatch id and a deadline are present, before the peer computes anything
// (the deadline's value is for check_deadline). invalid_argument names the first
// mismatch; permission_denied, a loss-stage backward whose d_loss is not
// kLossGradient (well formed, but steering).
Result<StageCall> check_request(const wire::DecodedMessage& message, const StageSpec& spec);

Result<wire::Frames> encode_reply(uint64_t request_id, int stage, const StageReply& reply);
// The loss stage's loss and metrics as they travel: one raw f32 tensor [loss, metrics...].
Result<wire::EncodedTensor> loss_tensor(float loss, std::span<const float> metrics);

// The `info` exchange: a peer answers with its StageSpec (as a JSON u8 tensor), so a
// trainer or tool can check what a stage takes and sends before routing to it, and
// with its SampleLedger, so a run can account for every sample.
// What a peer refused or dropped, by name: every attack a hostile caller tries
// shows up in one of these (validation, spec checks, all-reduce parts, states,
// registry records, a full server queue).
using RefusalCounts = std::map<std::string, int64_t>;
// An info reply carries at most this many refusal counters.
constexpr size_t kMaxRefusalCounters = 64;

struct PeerInfo {
  StageSpec spec;
  std::optional<SampleLedger> samples;
  RefusalCounts refusals;
};
// `credential`: the caller's certificate where the swarm has an owner (certificate.h).
Result<wire::Frames> encode_info_request(int stage, std::string_view credential = {});
Result<wire::Frames> encode_info_reply(uint64_t request_id, const StageSpec& spec,
                                       const SampleLedger* samples = nullptr,
                                       const RefusalCounts* refusals = nullptr);
// From an untrusted peer: every field type- and range-checked. An info without
// "gradient_codec" (an older peer) means gradients in its "codec".
Result<StageSpec> parse_info_reply(const wire::Frames& frames, const wire::Limits& limits);
Result<PeerInfo> parse_peer_info(const wire::Frames& frames, const wire::Limits& limits);
std::string spec_to_json(const StageSpec& spec);
Result<StageSpec> spec_from_json(std::string_view text);
std::string ledger_to_json(const SampleLedger& ledger);
// Every field a non-negative integer; unknown fields are ignored.
Result<SampleLedger> ledger_from_json(std::string_view text);

// The trainer's side: the reply's tensors, sharing the received frames.
// has_loss: the request went to the stage that takes targets.
Result<StageReply> parse_reply(const wire::Frames& frames, const wire::Limits& limits, bool has_loss);

}  // namespace swarm::protocol
