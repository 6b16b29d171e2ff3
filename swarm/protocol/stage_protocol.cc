#include "swarm/protocol/stage_protocol.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace swarm::protocol {
namespace {

bool is_leading_match(const Shape& a, const Shape& b) {
  return a.rank() > 0 && b.rank() > 0 && a[0] == b[0];
}

wire::TensorListSpec expected_tensors(const StageSpec& spec, wire::MessageKind kind) {
  wire::TensorListSpec list{static_cast<uint32_t>(spec.stage), {}};
  list.inputs.emplace_back(spec.io.input.dtype, spec.io.input.dims);
  // A pipeline request carries the loss stage's targets through stages that do not
  // know their shape: pipeline_targets checks them there, the loss stage by its spec.
  if (kind == wire::MessageKind::pipeline && !spec.io.targets) return list;
  if (kind == wire::MessageKind::backward) {
    // The loss stage's output gradient is d_loss, f32 [1], whatever metrics follow its loss.
    if (spec.io.targets) {
      list.inputs.emplace_back(DType::f32, std::vector<int64_t>{1});
    } else {
      list.inputs.emplace_back(spec.io.output.dtype, spec.io.output.dims);
    }
  }
  if (spec.io.targets) list.inputs.emplace_back(spec.io.targets->dtype, spec.io.targets->dims);
  return list;
}

const char* role_name(TensorRole role) {
  switch (role) {
    case TensorRole::input: return "input";
    case TensorRole::output: return "output";
    case TensorRole::grad_output: return "output gradient";
    case TensorRole::grad_input: return "input gradient";
    case TensorRole::targets: return "targets";
  }
  return "tensor";
}

TensorRole reply_role(wire::MessageKind kind) {
  return kind == wire::MessageKind::forward ? TensorRole::output : TensorRole::grad_input;
}

// Targets a stage before the loss stage passes on: raw integers or floats, one row per input row.
Status check_pipeline_targets(const wire::DecodedTensor& targets, const wire::DecodedTensor& input, int stage) {
  const bool raw = targets.codec == CodecId::none && (targets.dtype == DType::i32 || targets.dtype == DType::f32);
  if (!raw || targets.shape.rank() < 1 || targets.shape.rank() > 4) {
    return invalid_argument("stage {}: a pipeline's targets must be raw i32 or f32 of rank 1 to 4", stage);
  }
  if (!is_leading_match(targets.shape, input.shape)) {
    return invalid_argument("stage {}: targets {} do not match input {}", stage, targets.shape.to_string(),
                            input.shape.to_string());
  }
  return Status::ok();
}

// A code off the wire by name; the wire refused codes beyond the known ones, but a
// message names what it was sent, not what it assumes.
std::string codec_text(uint8_t code) {
  const std::optional<CodecId> codec = codec_from_code(code);
  return codec ? std::string(codec_name(*codec)) : fmt::format("code {}", static_cast<unsigned>(code));
}

// Float tensors in codec_for's codec; integers raw.
Status check_codec(const wire::DecodedTensor& tensor, const StageSpec& spec, TensorRole role) {
  const CodecId want = tensor.dtype == DType::f32 ? codec_for(spec, role) : CodecId::none;
  if (tensor.codec != want) {
    return invalid_argument("stage {} takes its {} in codec {}, the request sent {}", spec.stage, role_name(role),
                            codec_name(want), codec_name(tensor.codec));
  }
  return Status::ok();
}

Status check_reply_codec(const wire::MessageHeader& header, const StageSpec& spec) {
  const CodecId sends = reply_codec_for(spec, header.kind);
  if (header.reply_codec != static_cast<uint8_t>(sends)) {
    return invalid_argument("stage {} sends its {} in codec {}, the request asks for {}", spec.stage,
                            role_name(reply_role(header.kind)), codec_name(sends), codec_text(header.reply_codec));
  }
  return Status::ok();
}

// Compares the value, not the bits: -0 or a NaN payload are refused like any
// other steering value, and exactly kLossGradient passes.
Status check_loss_gradient(const wire::DecodedTensor& d_loss, const StageSpec& spec) {
  float value = 0;
  const bool scalar = d_loss.dtype == DType::f32 && d_loss.codec == CodecId::none && d_loss.shape.numel() == 1 &&
                      d_loss.payload.size() == sizeof(value);
  if (scalar) std::memcpy(&value, d_loss.payload.data(), sizeof(value));
  if (!scalar || value != kLossGradient) {
    return permission_denied("stage {}: d_loss is fixed at {} by the protocol; this backward sends {}", spec.stage,
                             kLossGradient, scalar ? fmt::format("{}", value) : std::string("another tensor"));
  }
  return Status::ok();
}

}  // namespace

CodecId codec_for(const StageSpec& spec, TensorRole role) {
  switch (role) {
    case TensorRole::input:
    case TensorRole::output: return spec.codec;
    case TensorRole::grad_output:
      if (spec.io.targets) return CodecId::none;  // the scalar d_loss
      [[fallthrough]];
    case TensorRole::grad_input: return spec.gradient_codec.value_or(spec.codec);
    case TensorRole::targets: return CodecId::none;
  }
  return CodecId::none;
}

CodecId reply_codec_for(const StageSpec& spec, wire::MessageKind kind) { return codec_for(spec, reply_role(kind)); }

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
  if (reply.loss) {
    const auto values = static_cast<int64_t>(1 + reply.metrics.size());
    total += {values, values * 4};
  }
  return total;
}

wire::EncodedTensor raw_tensor(const Tensor& tensor) {
  auto keeper = std::make_shared<Tensor>(tensor);
  const auto& dims = tensor.shape().dims();
  return wire::EncodedTensor{
      tensor.dtype(), CodecId::none, std::vector<int64_t>(dims.begin(), dims.end()),
      wire::Frame::adopt(static_cast<const char*>(tensor.raw_data()), tensor.size_bytes(), std::move(keeper))};
}

int64_t unix_millis_now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t unix_millis_after(int64_t now_ms, double seconds) {
  constexpr double kMax = static_cast<double>(std::numeric_limits<int64_t>::max() / 2);
  const double ms = std::clamp(std::isnan(seconds) ? 0.0 : seconds * 1000.0, -kMax, kMax);
  int64_t out = 0;
  if (__builtin_add_overflow(now_ms, static_cast<int64_t>(ms), &out)) return ms > 0 ? INT64_MAX : 0;
  return std::max<int64_t>(out, 0);
}

Status check_deadline(int64_t deadline_ms, int64_t now_ms) {
  if (deadline_ms <= now_ms) {
    return deadline_exceeded("the request's deadline passed {} ms ago", now_ms - deadline_ms);
  }
  // Both are >= 0, so the difference cannot overflow.
  if (deadline_ms - now_ms > kMaxDeadlineAheadMs) {
    return invalid_argument("a deadline {} s ahead exceeds the {} s a peer holds work", (deadline_ms - now_ms) / 1000,
                            kMaxDeadlineAheadMs / 1000);
  }
  return Status::ok();
}

int64_t SampleLedger::unaccounted() const {
  // Wrapping arithmetic: counters are far below 2^63, and a wrap would show as a mismatch anyway.
  const uint64_t held = static_cast<uint64_t>(samples_pending) + static_cast<uint64_t>(samples_in_round) +
                        static_cast<uint64_t>(samples_stepped) + static_cast<uint64_t>(samples_lost_resync) +
                        static_cast<uint64_t>(samples_lost_nonfinite) + static_cast<uint64_t>(samples_lost_failed_round) +
                        static_cast<uint64_t>(samples_lost_moved);
  return static_cast<int64_t>(static_cast<uint64_t>(samples_accumulated_total) - held);
}

Result<wire::Frames> encode_request(const StageRequest& request, int stage, CodecId reply_codec) {
  wire::MessageHeader header;
  header.kind = request.kind;
  header.stage = static_cast<uint32_t>(stage);
  header.request_id = request.request_id;
  header.reply_codec = static_cast<uint8_t>(reply_codec);
  header.microbatch_id = request.microbatch_id;
  header.deadline_unix_ms = request.deadline_unix_ms;
  header.credential = request.credential;
  header.hop_chain = request.hop_chain;
  header.reply_to = request.reply_to;
  header.return_id = request.return_id;
  std::vector<wire::EncodedTensor> tensors{request.input};
  if (request.grad_output) tensors.push_back(*request.grad_output);
  if (request.targets) tensors.push_back(*request.targets);
  return wire::encode_message_payloads(header, tensors);
}

Result<StageCall> check_request(const wire::DecodedMessage& message, const StageSpec& spec) {
  const auto& header = message.header;
  if (header.kind != wire::MessageKind::forward && header.kind != wire::MessageKind::backward &&
      header.kind != wire::MessageKind::pipeline) {
    return invalid_argument("stage requests are forward, backward or pipeline, not kind {}",
                            static_cast<int>(header.kind));
  }
  const bool passes_targets_on = header.kind == wire::MessageKind::pipeline && !spec.io.targets;
  if (passes_targets_on) {
    // The input by the spec, the targets by check_pipeline_targets below.
    if (header.tensors.size() != 2) {
      return invalid_argument("a pipeline request carries 2 tensors (input, targets), not {}", header.tensors.size());
    }
    wire::MessageHeader input_only = header;
    input_only.tensors.resize(1);
    SWARM_RETURN_IF_ERROR(wire::validate_against_spec(input_only, expected_tensors(spec, header.kind)));
  } else {
    SWARM_RETURN_IF_ERROR(wire::validate_against_spec(header, expected_tensors(spec, header.kind)));
  }
  SWARM_RETURN_IF_ERROR(check_reply_codec(header, spec));
  // Without an id a backward could not be told from its retry; without a deadline a
  // peer could not tell that its caller has given up.
  if (header.microbatch_id == 0) return invalid_argument("a stage request without a microbatch id");
  if (header.deadline_unix_ms == 0) return invalid_argument("a stage request without a deadline");
  if (!header.hop_chain.empty() && header.kind != wire::MessageKind::pipeline) {
    return invalid_argument("a hop chain on a request that is not a pipeline");
  }
  if ((!header.reply_to.empty() || header.return_id != 0) && header.kind != wire::MessageKind::pipeline) {
    return invalid_argument("a reply_to on a request that is not a pipeline");
  }
  if (header.reply_to.empty() != (header.return_id == 0)) {
    return invalid_argument("a pipeline's reply_to and return_id come together");
  }
  StageCall call;
  call.kind = header.kind;
  call.request_id = header.request_id;
  call.microbatch_id = header.microbatch_id;
  call.deadline_unix_ms = header.deadline_unix_ms;
  call.credential = header.credential;
  call.hop_chain = header.hop_chain;
  call.reply_to = header.reply_to;
  call.return_id = header.return_id;
  call.input = &message.tensors[0];
  SWARM_RETURN_IF_ERROR(check_codec(*call.input, spec, TensorRole::input));
  size_t next = 1;
  if (call.is_backward()) {
    call.grad_output = &message.tensors[next++];
    SWARM_RETURN_IF_ERROR(check_codec(*call.grad_output, spec, TensorRole::grad_output));
    if (spec.io.targets) SWARM_RETURN_IF_ERROR(check_loss_gradient(*call.grad_output, spec));
    if (!spec.io.targets && !is_leading_match(call.grad_output->shape, call.input->shape)) {
      return invalid_argument("stage {}: output gradient {} does not match input {}", spec.stage,
                              call.grad_output->shape.to_string(), call.input->shape.to_string());
    }
  }
  if (passes_targets_on) {
    call.targets = &message.tensors[next++];
    SWARM_RETURN_IF_ERROR(check_pipeline_targets(*call.targets, *call.input, spec.stage));
  } else if (spec.io.targets) {
    call.targets = &message.tensors[next++];
    SWARM_RETURN_IF_ERROR(check_codec(*call.targets, spec, TensorRole::targets));
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
    SWARM_ASSIGN_OR_RETURN(wire::EncodedTensor losses, loss_tensor(*reply.loss, reply.metrics));
    tensors.push_back(std::move(losses));
  }
  return wire::encode_message_payloads(header, tensors);
}

Result<wire::EncodedTensor> loss_tensor(float loss, std::span<const float> metrics) {
  SWARM_ASSIGN_OR_RETURN(Tensor values, Tensor::empty(Shape{1 + static_cast<int64_t>(metrics.size())}, DType::f32));
  values.data<float>()[0] = loss;
  std::copy(metrics.begin(), metrics.end(), values.data<float>() + 1);
  return raw_tensor(values);
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
    const int64_t values = t.shape.numel();
    if (t.dtype != DType::f32 || t.codec != CodecId::none || t.shape.rank() != 1 || values < 1 ||
        values > static_cast<int64_t>(1 + kMaxStageMetrics) || t.payload.size() != values * sizeof(float)) {
      return internal("the last stage's reply lacks the loss");
    }
    std::vector<float> losses(static_cast<size_t>(values));
    std::memcpy(losses.data(), t.payload.data(), losses.size() * sizeof(float));
    reply.loss = losses[0];
    reply.metrics.assign(losses.begin() + 1, losses.end());
  }
  return reply;
}

namespace {

nlohmann::json tensor_spec_json(const TensorSpec& spec) {
  return {{"dtype", dtype_name(spec.dtype)}, {"dims", spec.dims}};
}

// nlohmann's get<> converts quietly (1.5 and true to 1, 2^64 - 1 to -1): every
// number from a peer is checked to be an integer of the range it stands for.
bool integer_in(const nlohmann::json& j, int64_t low, int64_t high) {
  if (j.is_number_unsigned()) return j.get<uint64_t>() <= static_cast<uint64_t>(high);
  return j.is_number_integer() && j.get<int64_t>() >= low && j.get<int64_t>() <= high;
}

Result<TensorSpec> tensor_spec_from(const nlohmann::json& j) {
  const auto dtype = dtype_from_name(j.at("dtype").get<std::string>());
  if (!dtype) return invalid_argument("stage info: unknown dtype");
  const auto& dims = j.at("dims");
  if (!dims.is_array() || dims.size() > Shape::kMaxRank) return invalid_argument("stage info: dims of bad rank");
  TensorSpec spec{*dtype, {}};
  for (const auto& d : dims) {
    if (!integer_in(d, -1, std::numeric_limits<int64_t>::max())) {
      return invalid_argument("stage info: a dim is not an integer >= -1");
    }
    spec.dims.push_back(d.get<int64_t>());
  }
  return spec;
}

Result<CodecId> codec_from(const nlohmann::json& j, const char* what) {
  const auto codec = codec_from_name(j.get<std::string>());
  if (!codec) return invalid_argument("stage info: unknown {}", what);
  return *codec;
}

// A loss stage's metric names: at most kMaxStageMetrics valid names, none twice,
// and as many values after the loss as its output holds.
Result<std::vector<std::string>> metric_names_from(const nlohmann::json& j, const StageIoSpec& io) {
  if (!j.is_array() || j.size() > kMaxStageMetrics) {
    return invalid_argument("stage info: metrics is not a list of at most {} names", kMaxStageMetrics);
  }
  std::vector<std::string> names;
  for (const auto& name : j) {
    if (!name.is_string() || !valid_metric_name(name.get<std::string>())) {
      return invalid_argument("stage info: a metric name is not 1 to 32 of [a-z0-9_]");
    }
    if (std::find(names.begin(), names.end(), name.get<std::string>()) != names.end()) {
      return invalid_argument("stage info: metric {} named twice", name.get<std::string>());
    }
    names.push_back(name.get<std::string>());
  }
  const TensorSpec losses{DType::f32, {static_cast<int64_t>(1 + names.size())}};
  if (!names.empty() && (!io.targets || io.output != losses)) {
    return invalid_argument("stage info: metrics on a stage whose output is not its loss and {} values",
                            names.size());
  }
  return names;
}

}  // namespace

std::string spec_to_json(const StageSpec& spec) {
  // The gradient codec always written out, resolved: a reader need not know the default.
  nlohmann::json j{{"stage", spec.stage},
                   {"input", tensor_spec_json(spec.io.input)},
                   {"output", tensor_spec_json(spec.io.output)},
                   {"codec", codec_name(spec.codec)},
                   {"gradient_codec", codec_name(codec_for(spec, TensorRole::grad_input))}};
  if (spec.io.targets) j["targets"] = tensor_spec_json(*spec.io.targets);
  if (!spec.io.metrics.empty()) j["metrics"] = spec.io.metrics;
  return j.dump();
}

Result<StageSpec> spec_from_json(std::string_view text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument("stage info is not a JSON object");
  try {
    StageSpec spec;
    if (!integer_in(j.at("stage"), 0, std::numeric_limits<int32_t>::max())) {
      return invalid_argument("stage info: the stage is not an integer in [0, 2^31)");
    }
    spec.stage = j.at("stage").get<int>();
    SWARM_ASSIGN_OR_RETURN(spec.io.input, tensor_spec_from(j.at("input")));
    SWARM_ASSIGN_OR_RETURN(spec.io.output, tensor_spec_from(j.at("output")));
    if (j.contains("targets")) {
      SWARM_ASSIGN_OR_RETURN(spec.io.targets, tensor_spec_from(j.at("targets")));
    }
    if (j.contains("metrics")) {
      SWARM_ASSIGN_OR_RETURN(spec.io.metrics, metric_names_from(j.at("metrics"), spec.io));
    }
    SWARM_ASSIGN_OR_RETURN(spec.codec, codec_from(j.at("codec"), "codec"));
    // Absent from an older peer's info: its gradients travel in its codec.
    if (j.contains("gradient_codec")) {
      SWARM_ASSIGN_OR_RETURN(spec.gradient_codec, codec_from(j.at("gradient_codec"), "gradient codec"));
    }
    return spec;
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument("malformed stage info: {}", e.what());
  }
}

Result<wire::Frames> encode_info_request(int stage, std::string_view credential) {
  wire::MessageHeader header;
  header.kind = wire::MessageKind::info;
  header.stage = static_cast<uint32_t>(stage);
  header.credential = std::string(credential);
  return wire::encode_message(header, std::vector<TensorView>{});
}

std::string ledger_to_json(const SampleLedger& ledger) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, field] : kSampleLedgerFields) j[std::string(name)] = ledger.*field;
  return j.dump();
}

namespace {

Result<SampleLedger> ledger_from(const nlohmann::json& j) {
  if (!j.is_object()) return invalid_argument("a sample ledger is a JSON object");
  SampleLedger ledger;
  for (const auto& [name, field] : kSampleLedgerFields) {
    const auto it = j.find(std::string(name));
    if (it == j.end()) return invalid_argument("sample ledger: {} missing", name);
    if (!it->is_number_integer() || (it->is_number_unsigned() && it->get<uint64_t>() > INT64_MAX)) {
      return invalid_argument("sample ledger: {} is not a 64-bit integer", name);
    }
    const int64_t value = it->get<int64_t>();
    if (value < 0) return invalid_argument("sample ledger: {} is negative", name);
    ledger.*field = value;
  }
  return ledger;
}

}  // namespace

Result<SampleLedger> ledger_from_json(std::string_view text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return invalid_argument("a sample ledger is not JSON");
  return ledger_from(j);
}

Result<wire::Frames> encode_info_reply(uint64_t request_id, const StageSpec& spec, const SampleLedger* samples,
                                       const RefusalCounts* refusals) {
  std::string text = spec_to_json(spec);
  if (samples != nullptr || refusals != nullptr) {
    nlohmann::json j = nlohmann::json::parse(text);
    if (samples != nullptr) j["samples"] = nlohmann::json::parse(ledger_to_json(*samples));
    if (refusals != nullptr) {
      if (refusals->size() > kMaxRefusalCounters) return invalid_argument("{} refusal counters", refusals->size());
      j["refusals"] = *refusals;
    }
    text = j.dump();
  }
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

Result<PeerInfo> parse_peer_info(const wire::Frames& frames, const wire::Limits& limits) {
  SWARM_ASSIGN_OR_RETURN(StageSpec spec, parse_info_reply(frames, limits));
  PeerInfo info{std::move(spec), std::nullopt};
  // parse_info_reply checked the frame is one u8 tensor of a JSON object.
  const auto j = nlohmann::json::parse(frames.parts[1].view(), nullptr, false);
  if (j.contains("samples")) {
    SWARM_ASSIGN_OR_RETURN(info.samples, ledger_from(j.at("samples")));
  }
  if (j.contains("refusals")) {
    const auto& refusals = j.at("refusals");
    if (!refusals.is_object() || refusals.size() > kMaxRefusalCounters) {
      return invalid_argument("an info reply's refusals must be an object of at most {} counters", kMaxRefusalCounters);
    }
    for (const auto& [name, count] : refusals.items()) {
      if (!count.is_number_integer() || count.get<int64_t>() < 0) {
        return invalid_argument("refusal counter '{}' is not a non-negative integer", name);
      }
      info.refusals[name] = count.get<int64_t>();
    }
  }
  return info;
}

}  // namespace swarm::protocol
