#include "swarm/protocol/pipeline_result.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "swarm/protocol/tensor_codec.h"

namespace swarm::protocol {

Result<wire::Frames> encode_pipeline_result(int stage, uint64_t request_id, uint64_t microbatch_id,
                                            std::string_view from_peer, uint64_t return_id,
                                            const Result<StageReply>& outcome, std::string_view credential) {
  wire::MessageHeader header;
  header.credential = std::string(credential);
  header.kind = wire::MessageKind::pipeline_result;
  header.stage = static_cast<uint32_t>(stage);
  header.request_id = request_id;
  header.microbatch_id = microbatch_id;
  header.reply_to = std::string(from_peer);
  header.return_id = return_id;
  std::vector<wire::EncodedTensor> tensors;
  if (!outcome.is_ok()) {
    header.error_code = static_cast<uint16_t>(outcome.status().code());
    header.error_text = outcome.status().message();
    header.error_text.resize(std::min<size_t>(header.error_text.size(), wire::Limits{}.max_error_text));
    return wire::encode_message_payloads(header, tensors);
  }
  const StageReply& reply = *outcome;
  if (!reply.tensor || !reply.loss) return internal("a pipeline's result needs its gradient and its loss");
  tensors.push_back(*reply.tensor);
  SWARM_ASSIGN_OR_RETURN(wire::EncodedTensor losses, loss_tensor(*reply.loss, reply.metrics));
  tensors.push_back(std::move(losses));
  return wire::encode_message_payloads(header, tensors);
}

Result<PipelineResult> parse_pipeline_result(const wire::DecodedMessage& message) {
  const wire::MessageHeader& header = message.header;
  if (header.kind != wire::MessageKind::pipeline_result) {
    return invalid_argument("not a pipeline result (kind {})", static_cast<int>(header.kind));
  }
  if (header.microbatch_id == 0 || header.return_id == 0 || header.reply_to.empty()) {
    return invalid_argument("a pipeline result names its microbatch, its return id and its sender");
  }
  PipelineResult result;
  result.microbatch_id = header.microbatch_id;
  result.return_id = header.return_id;
  result.from_peer = header.reply_to;
  if (header.error_code != 0) {
    if (header.error_code > static_cast<uint16_t>(StatusCode::internal) || !message.tensors.empty()) {
      return invalid_argument("a pipeline result with error code {} and {} tensors", header.error_code,
                              message.tensors.size());
    }
    result.outcome = Status(static_cast<StatusCode>(header.error_code), header.error_text);
    return result;
  }
  if (message.tensors.size() != 2) {
    return invalid_argument("a pipeline result carries 2 tensors (gradient, loss), not {}", message.tensors.size());
  }
  const wire::DecodedTensor& gradient = message.tensors[0];
  const wire::DecodedTensor& losses = message.tensors[1];
  if (gradient.dtype != DType::f32) return invalid_argument("a pipeline result's gradient is not f32");
  const int64_t values = losses.shape.numel();
  if (losses.dtype != DType::f32 || losses.codec != CodecId::none || losses.shape.rank() != 1 || values < 1 ||
      values > static_cast<int64_t>(1 + kMaxStageMetrics) ||
      losses.payload.size() != static_cast<size_t>(values) * sizeof(float)) {
    return invalid_argument("a pipeline result's loss is not 1 to {} raw f32 values", 1 + kMaxStageMetrics);
  }
  StageReply reply;
  // Copied out of the received frame: the waiting sender outlives the request.
  reply.tensor = wire::EncodedTensor{gradient.dtype, gradient.codec,
                                     std::vector<int64_t>(gradient.shape.dims().begin(), gradient.shape.dims().end()),
                                     wire::Frame(std::string(gradient.payload))};
  std::vector<float> loss(static_cast<size_t>(values));
  std::memcpy(loss.data(), losses.payload.data(), loss.size() * sizeof(float));
  reply.loss = loss[0];
  reply.metrics.assign(loss.begin() + 1, loss.end());
  result.outcome = std::move(reply);
  return result;
}

wire::Frames encode_acceptance(uint64_t request_id, int stage) {
  wire::MessageHeader header;
  header.kind = wire::MessageKind::result;
  header.stage = static_cast<uint32_t>(stage);
  header.request_id = request_id;
  return wire::Frames{{wire::serialize_header(header)}};
}

bool is_acceptance(const wire::Frames& answer) {
  if (answer.parts.size() != 1) return false;  // tensors follow the header: a reply, not decoded twice
  auto decoded = wire::decode_message(answer.views(), wire::Limits{});
  return decoded.is_ok() && decoded->header.kind == wire::MessageKind::result && decoded->tensors.empty();
}

}  // namespace swarm::protocol
