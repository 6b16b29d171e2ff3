// stage_protocol: the typed messages between trainers and the peers of a stage, in
// one place for both ends.
//
// Which tensor sits where:
//   forward  = [input]                    reply [output]
//   forward  = [input, targets]           reply [loss]               (the last stage)
//   backward = [input, grad_output]       reply [grad_input] or []   (the first stage: tokens have no gradient)
//   backward = [input, d_loss, targets]   reply [grad_input, loss]   (the last stage runs forward and backward
//                                                                     as one request)
// Float tensors travel in the codec the stage declares (StageSpec::codec): the
// caller names it for the reply (MessageHeader::reply_codec) and encodes its own
// float inputs in it, except the scalar d_loss, which is sent raw. Targets and
// integer tensors (tokens) always travel raw. A peer checks every request against its
// StageSpec before any compute.
//
// Payloads are wire::EncodedTensor frames: a trainer keeps the exact bytes a stage
// returned and passes them on (to the next stage, and again with the backward), so a
// recomputed forward on any peer sees bit-identical input and nothing is re-encoded.
//
//   StageRequest request = StageRequest::forward(id, input_frame);
//   SWARM_ASSIGN_OR_RETURN(wire::Frames frames, encode_request(request, stage, spec.codec));
//   SWARM_ASSIGN_OR_RETURN(StageCall call, check_request(decoded, spec));   // at the peer
#pragma once

#include <cstdint>
#include <optional>
#include <string>
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
  // Float tensors in and out travel in this codec; integer tensors raw.
  CodecId codec = CodecId::none;
};

template <Stage S>
StageSpec stage_spec(const S& stage, int index, CodecId codec) {
  return StageSpec{index, stage.io_spec(), codec};
}

struct StageRequest {
  wire::MessageKind kind = wire::MessageKind::forward;
  uint64_t request_id = 0;
  wire::EncodedTensor input;
  std::optional<wire::EncodedTensor> grad_output;  // backward only
  std::optional<wire::EncodedTensor> targets;      // the last stage only
};

// A request as the peer serves it: views into the received frames, checked against
// the spec. Float tensors may still be encoded (see decode_float).
struct StageCall {
  wire::MessageKind kind = wire::MessageKind::forward;
  uint64_t request_id = 0;
  int64_t batch = 0;
  const wire::DecodedTensor* input = nullptr;
  const wire::DecodedTensor* grad_output = nullptr;
  const wire::DecodedTensor* targets = nullptr;
  bool is_backward() const { return kind == wire::MessageKind::backward; }
};

struct StageReply {
  std::optional<wire::EncodedTensor> tensor;  // output or input gradient
  std::optional<float> loss;
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

// Checks kind, tensor count, dtypes, ranks, fixed dims, codecs and that targets and
// grad_output match the input's batch, before the peer computes anything.
// invalid_argument names the first mismatch.
Result<StageCall> check_request(const wire::DecodedMessage& message, const StageSpec& spec);

Result<wire::Frames> encode_reply(uint64_t request_id, int stage, const StageReply& reply);

// The `info` exchange: a peer answers with its StageSpec (as a JSON u8 tensor), so a
// trainer or tool can check what a stage takes and sends before routing to it.
Result<wire::Frames> encode_info_request(int stage);
Result<wire::Frames> encode_info_reply(uint64_t request_id, const StageSpec& spec);
// From an untrusted peer: every field type- and range-checked.
Result<StageSpec> parse_info_reply(const wire::Frames& frames, const wire::Limits& limits);
std::string spec_to_json(const StageSpec& spec);
Result<StageSpec> spec_from_json(std::string_view text);

// The trainer's side: the reply's tensors, sharing the received frames.
// has_loss: the request went to the stage that takes targets.
Result<StageReply> parse_reply(const wire::Frames& frames, const wire::Limits& limits, bool has_loss);

}  // namespace swarm::protocol
