#include "swarm/protocol/stage_protocol.h"

#include <cstring>
#include <memory>

#include <nlohmann/json.hpp>

namespace swarm::protocol {
namespace {

bool is_leading_match(const Shape& a, const Shape& b) {
  return a.rank() > 0 && b.rank() > 0 && a[0] == b[0];
}

wire::TensorListSpec expected_tensors(const StageSpec& spec, wire::MessageKind kind) {
  wire::TensorListSpec list{static_cast<uint32_t>(spec.stage), {}};
  list.inputs.emplace_back(spec.io.input.dtype, spec.io.input.dims);
  if (kind == wire::MessageKind::backward) list.inputs.emplace_back(spec.io.output.dtype, spec.io.output.dims);
  if (spec.io.targets) list.inputs.emplace_back(spec.io.targets->dtype, spec.io.targets->dims);
  return list;
}

// Float tensors in the stage's codec, except the raw scalar d_loss; integers raw.
Status check_codec(const wire::DecodedTensor& tensor, CodecId float_codec, const char* what, int stage) {
  const CodecId want = tensor.dtype == DType::f32 ? float_codec : CodecId::none;
  if (tensor.codec != want) {
    return invalid_argument("stage {} takes its {} in codec {}, the request sent {}", stage, what, codec_name(want),
                            codec_name(tensor.codec));
  }
  return Status::ok();
}

}  // namespace

PayloadVolume volume_of(const wire::EncodedTensor& tensor) {
  int64_t values = 1;
  for (int64_t d : tensor.dims) values *= d;
  return {values, static_cast<int64_t>(tensor.payload.size())};
}

PayloadVolume volume_of(const StageRequest& request) {
  PayloadVolume total = volume_of(request.input);
  if (request.grad_output) total += volume_of(*request.grad_output);
  if (request.targets) total += volume_of(*request.targets);
  return total;
}

PayloadVolume volume_of(const StageReply& reply) {
  PayloadVolume total;
  if (reply.tensor) total += volume_of(*reply.tensor);
  if (reply.loss) total += {1, 4};
  return total;
}

wire::EncodedTensor raw_tensor(const Tensor& tensor) {
  auto keeper = std::make_shared<Tensor>(tensor);
  const auto& dims = tensor.shape().dims();
  return wire::EncodedTensor{
      tensor.dtype(), CodecId::none, std::vector<int64_t>(dims.begin(), dims.end()),
      wire::Frame::adopt(static_cast<const char*>(tensor.raw_data()), tensor.size_bytes(), std::move(keeper))};
}

Result<wire::Frames> encode_request(const StageRequest& request, int stage, CodecId reply_codec) {
  wire::MessageHeader header;
  header.kind = request.kind;
  header.stage = static_cast<uint32_t>(stage);
  header.request_id = request.request_id;
  header.reply_codec = static_cast<uint8_t>(reply_codec);
  std::vector<wire::EncodedTensor> tensors{request.input};
  if (request.grad_output) tensors.push_back(*request.grad_output);
  if (request.targets) tensors.push_back(*request.targets);
  return wire::encode_message_payloads(header, tensors);
}

Result<StageCall> check_request(const wire::DecodedMessage& message, const StageSpec& spec) {
  const auto& header = message.header;
  if (header.kind != wire::MessageKind::forward && header.kind != wire::MessageKind::backward) {
    return invalid_argument("stage requests are forward or backward, not kind {}", static_cast<int>(header.kind));
  }
  SWARM_RETURN_IF_ERROR(wire::validate_against_spec(header, expected_tensors(spec, header.kind)));
  if (header.reply_codec != static_cast<uint8_t>(spec.codec)) {
    return invalid_argument("stage {} sends codec {}, the request asks for code {}", spec.stage,
                            codec_name(spec.codec), static_cast<unsigned>(header.reply_codec));
  }
  StageCall call;
  call.kind = header.kind;
  call.request_id = header.request_id;
  call.input = &message.tensors[0];
  SWARM_RETURN_IF_ERROR(check_codec(*call.input, spec.codec, "input", spec.stage));
  size_t next = 1;
  if (call.is_backward()) {
    call.grad_output = &message.tensors[next++];
    const CodecId grad_codec = spec.io.targets ? CodecId::none : spec.codec;  // d_loss is a raw scalar
    SWARM_RETURN_IF_ERROR(check_codec(*call.grad_output, grad_codec, "output gradient", spec.stage));
    if (!spec.io.targets && !is_leading_match(call.grad_output->shape, call.input->shape)) {
      return invalid_argument("stage {}: output gradient {} does not match input {}", spec.stage,
                              call.grad_output->shape.to_string(), call.input->shape.to_string());
    }
  }
  if (spec.io.targets) {
    call.targets = &message.tensors[next++];
    SWARM_RETURN_IF_ERROR(check_codec(*call.targets, CodecId::none, "targets", spec.stage));  // labels stay exact
    if (!is_leading_match(call.targets->shape, call.input->shape)) {
      return invalid_argument("stage {}: targets {} do not match input {}", spec.stage,
                              call.targets->shape.to_string(), call.input->shape.to_string());
    }
  }
  call.batch = call.input->shape.rank() > 0 ? call.input->shape[0] : 0;
  return call;
}

Result<wire::Frames> encode_reply(uint64_t request_id, int stage, const StageReply& reply) {
  wire::MessageHeader header;
  header.kind = wire::MessageKind::result;
  header.stage = static_cast<uint32_t>(stage);
  header.request_id = request_id;
  std::vector<wire::EncodedTensor> tensors;
  if (reply.tensor) tensors.push_back(*reply.tensor);
  if (reply.loss) {
    SWARM_ASSIGN_OR_RETURN(Tensor loss, Tensor::empty(Shape{1}, DType::f32));
    loss.data<float>()[0] = *reply.loss;
    tensors.push_back(raw_tensor(loss));
  }
  return wire::encode_message_payloads(header, tensors);
}

Result<StageReply> parse_reply(const wire::Frames& frames, const wire::Limits& limits, bool has_loss) {
  SWARM_ASSIGN_OR_RETURN(wire::DecodedMessage message, wire::decode_message(frames.views(), limits));
  if (message.header.kind == wire::MessageKind::error) return wire::status_from_error_reply(message.header);
  if (message.header.kind != wire::MessageKind::result) {
    return internal("unexpected reply kind {}", static_cast<int>(message.header.kind));
  }
  const size_t count = message.tensors.size();
  const size_t tensors = has_loss ? count - 1 : count;
  if ((has_loss && count == 0) || tensors > 1) return internal("a stage reply with {} tensors", count);
  StageReply reply;
  if (tensors == 1) {
    const wire::DecodedTensor& t = message.tensors[0];
    reply.tensor = wire::EncodedTensor{t.dtype, t.codec, std::vector<int64_t>(t.shape.dims().begin(), t.shape.dims().end()),
                                       frames.parts[1]};
  }
  if (has_loss) {
    const wire::DecodedTensor& t = message.tensors[count - 1];
    if (t.dtype != DType::f32 || t.codec != CodecId::none || t.shape.numel() != 1) {
      return internal("the last stage's reply lacks the loss");
    }
    float loss = 0;
    std::memcpy(&loss, t.payload.data(), sizeof(loss));
    reply.loss = loss;
  }
  return reply;
}

namespace {

nlohmann::json tensor_spec_json(const TensorSpec& spec) {
  return {{"dtype", dtype_name(spec.dtype)}, {"dims", spec.dims}};
}

Result<TensorSpec> tensor_spec_from(const nlohmann::json& j) {
  const auto dtype = dtype_from_name(j.at("dtype").get<std::string>());
  if (!dtype) return invalid_argument("stage info: unknown dtype");
  TensorSpec spec{*dtype, j.at("dims").get<std::vector<int64_t>>()};
  if (spec.dims.size() > Shape::kMaxRank) return invalid_argument("stage info: rank {} too large", spec.dims.size());
  for (int64_t d : spec.dims) {
    if (d < -1) return invalid_argument("stage info: dim {} below -1", d);
  }
  return spec;
}

}  // namespace

std::string spec_to_json(const StageSpec& spec) {
  nlohmann::json j{{"stage", spec.stage},
                   {"input", tensor_spec_json(spec.io.input)},
                   {"output", tensor_spec_json(spec.io.output)},
                   {"codec", codec_name(spec.codec)}};
  if (spec.io.targets) j["targets"] = tensor_spec_json(*spec.io.targets);
  return j.dump();
}

Result<StageSpec> spec_from_json(std::string_view text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument("stage info is not a JSON object");
  try {
    StageSpec spec;
    spec.stage = j.at("stage").get<int>();
    if (spec.stage < 0) return invalid_argument("stage info: negative stage");
    SWARM_ASSIGN_OR_RETURN(spec.io.input, tensor_spec_from(j.at("input")));
    SWARM_ASSIGN_OR_RETURN(spec.io.output, tensor_spec_from(j.at("output")));
    if (j.contains("targets")) {
      SWARM_ASSIGN_OR_RETURN(spec.io.targets, tensor_spec_from(j.at("targets")));
    }
    const auto codec = codec_from_name(j.at("codec").get<std::string>());
    if (!codec) return invalid_argument("stage info: unknown codec");
    spec.codec = *codec;
    return spec;
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument("malformed stage info: {}", e.what());
  }
}

Result<wire::Frames> encode_info_request(int stage) {
  wire::MessageHeader header;
  header.kind = wire::MessageKind::info;
  header.stage = static_cast<uint32_t>(stage);
  return wire::encode_message(header, std::vector<TensorView>{});
}

Result<wire::Frames> encode_info_reply(uint64_t request_id, const StageSpec& spec) {
  std::string text = spec_to_json(spec);
  wire::MessageHeader header;
  header.kind = wire::MessageKind::result;
  header.stage = static_cast<uint32_t>(spec.stage);
  header.request_id = request_id;
  const std::vector<wire::EncodedTensor> tensors{
      {DType::u8, CodecId::none, {static_cast<int64_t>(text.size())}, wire::Frame(std::move(text))}};
  return wire::encode_message_payloads(header, tensors);
}

Result<StageSpec> parse_info_reply(const wire::Frames& frames, const wire::Limits& limits) {
  SWARM_ASSIGN_OR_RETURN(wire::DecodedMessage message, wire::decode_message(frames.views(), limits));
  if (message.header.kind == wire::MessageKind::error) return wire::status_from_error_reply(message.header);
  if (message.header.kind != wire::MessageKind::result || message.tensors.size() != 1 ||
      message.tensors[0].dtype != DType::u8) {
    return invalid_argument("a stage info reply is one u8 tensor of JSON");
  }
  return spec_from_json(message.tensors[0].payload);
}

}  // namespace swarm::protocol
