// The typed stage protocol: requests built by one end are what the other end
// accepts, and every request that does not fit the StageSpec is refused before
// compute, naming the mismatch.
#include "swarm/protocol/stage_protocol.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "swarm/compression/codecs.h"
#include "swarm/protocol/tensor_codec.h"

namespace swarm::protocol {
namespace {

using compression::StandardCodecs;

constexpr int kD = 8;

// A middle stage of a GPT-like model: f32 [B, T, d] in and out.
StageSpec middle_stage(CodecId codec) {
  return StageSpec{1, {{DType::f32, {-1, -1, kD}}, std::nullopt, {DType::f32, {-1, -1, kD}}}, codec};
}

// The last stage: f32 [B, T, d] in, i32 [B, T] targets, the f32 [1] loss out.
StageSpec last_stage(CodecId codec) {
  return StageSpec{1, {{DType::f32, {-1, -1, kD}}, TensorSpec{DType::i32, {-1, -1}}, {DType::f32, {1}}}, codec};
}

// A middle stage that sends 4-bit activations and 8-bit gradients.
StageSpec split_codecs_stage() {
  StageSpec spec = middle_stage(CodecId::blockwise4);
  spec.gradient_codec = CodecId::blockwise8;
  return spec;
}

Tensor hidden(int64_t batch, float scale = 1.0f) {
  Tensor t = *Tensor::empty(Shape{batch, 4, kD}, DType::f32);
  float v = 0.1f;
  for (float& x : t.span<float>()) x = (v = std::fmod(v * 1.7f + 0.3f, 2.0f) - 1.0f) * scale;
  return t;
}

Tensor tokens(int64_t batch, int64_t t = 4) {
  Tensor out = *Tensor::zeros(Shape{batch, t}, DType::i32);
  return out;
}

// What the peer sees of a request the trainer built.
struct Received {
  wire::Frames frames;
  wire::DecodedMessage message;
};

// The trainer gives every request an id and a deadline; tests that leave them out get these.
StageRequest with_id_and_deadline(StageRequest request) {
  if (request.microbatch_id == 0) request.microbatch_id = 0x51;
  if (request.deadline_unix_ms == 0) request.deadline_unix_ms = unix_millis_now() + 60'000;
  return request;
}

Received receive(const StageRequest& request, int stage, CodecId reply_codec) {
  Received r;
  r.frames = *encode_request(with_id_and_deadline(request), stage, reply_codec);
  auto decoded = wire::decode_message(r.frames.views(), wire::Limits{});
  REQUIRE_MESSAGE(decoded.is_ok(), decoded.status().to_string());
  r.message = *decoded;
  return r;
}

Status check(const StageRequest& request, const StageSpec& spec, int stage = 1, std::optional<CodecId> reply = {}) {
  Received r = receive(request, stage, reply.value_or(reply_codec_for(spec, request.kind)));
  return check_request(r.message, spec).status();
}

TEST_CASE("a forward in the stage's codec is accepted, and its input decodes within the codec's bound") {
  const StageSpec spec = middle_stage(CodecId::blockwise8);
  Tensor x = hidden(2);
  StageRequest request{wire::MessageKind::forward, 7, *encode_floats<StandardCodecs>(x, spec.codec), {}, {}};
  Received r = receive(request, 1, spec.codec);
  auto call = check_request(r.message, spec);
  REQUIRE_MESSAGE(call.is_ok(), call.status().to_string());
  CHECK(call->batch == 2);
  CHECK(call->request_id == 7);
  CHECK(call->microbatch_id == 0x51);
  CHECK(call->deadline_unix_ms > unix_millis_now());
  CHECK_FALSE(call->is_backward());
  Tensor storage;
  auto view = float_view<StandardCodecs>(*call->input, &storage);
  REQUIRE(view.is_ok());
  float absmax = 0;
  for (float v : x.span<float>()) absmax = std::max(absmax, std::fabs(v));
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float bound = compression::Blockwise8Codec::max_abs_error(absmax, x.data<float>()[i]);
    CHECK(std::fabs(view->data<float>()[i] - x.data<float>()[i]) <= bound);
  }
  // 8-bit: one byte per value plus one scale per 4096 values.
  CHECK(volume_of(request).bytes == x.numel() + 4);
  CHECK(volume_of(request).values == x.numel());
}

TEST_CASE("requests that do not fit the spec are refused before compute, naming what is wrong") {
  const StageSpec spec = middle_stage(CodecId::blockwise8);
  const auto in_8bit = [&](const Tensor& t) { return *encode_floats<StandardCodecs>(t, CodecId::blockwise8); };

  SUBCASE("the wrong stage") {
    Status s = check({wire::MessageKind::forward, 1, in_8bit(hidden(1)), {}, {}}, spec, /*stage=*/0);
    CHECK(s.code() == StatusCode::invalid_argument);
  }
  SUBCASE("a raw f32 input where the stage takes 8bit") {
    Status s = check({wire::MessageKind::forward, 1, raw_tensor(hidden(1)), {}, {}}, spec);
    CHECK(s.code() == StatusCode::invalid_argument);
    CHECK(s.message().find("codec") != std::string::npos);
  }
  SUBCASE("a reply codec the stage does not send") {
    Status s = check({wire::MessageKind::forward, 1, in_8bit(hidden(1)), {}, {}}, spec, 1, CodecId::fp16);
    CHECK(s.code() == StatusCode::invalid_argument);
  }
  SUBCASE("an integer input where the stage takes floats") {
    Status s = check({wire::MessageKind::forward, 1, raw_tensor(tokens(1)), {}, {}}, spec);
    CHECK(s.code() == StatusCode::invalid_argument);
  }
  SUBCASE("the wrong model width") {
    Tensor wide = *Tensor::zeros(Shape{1, 4, kD + 1}, DType::f32);
    Status s = check({wire::MessageKind::forward, 1, in_8bit(wide), {}, {}}, spec);
    CHECK(s.code() == StatusCode::invalid_argument);
  }
  SUBCASE("a backward without its output gradient") {
    Status s = check({wire::MessageKind::backward, 1, in_8bit(hidden(1)), {}, {}}, spec);
    CHECK(s.code() == StatusCode::invalid_argument);
  }
  SUBCASE("an output gradient of another batch") {
    Status s = check({wire::MessageKind::backward, 1, in_8bit(hidden(2)), in_8bit(hidden(3)), {}}, spec);
    CHECK(s.code() == StatusCode::invalid_argument);
    CHECK(s.message().find("does not match") != std::string::npos);
  }
  SUBCASE("a control message kind sent to the stage service") {
    wire::MessageHeader header;
    header.kind = wire::MessageKind::state_chunk;
    header.stage = 1;
    header.reply_codec = static_cast<uint8_t>(CodecId::blockwise8);
    auto frames = *wire::encode_message(header, std::vector<TensorView>{});
    auto decoded = *wire::decode_message(frames.views(), wire::Limits{});
    CHECK(check_request(decoded, spec).status().code() == StatusCode::invalid_argument);
  }
}

TEST_CASE("codec_for: activations in the codec, gradients in the gradient codec, d_loss and targets raw") {
  const StageSpec middle = split_codecs_stage();
  CHECK(codec_for(middle, TensorRole::input) == CodecId::blockwise4);
  CHECK(codec_for(middle, TensorRole::output) == CodecId::blockwise4);
  CHECK(codec_for(middle, TensorRole::grad_output) == CodecId::blockwise8);
  CHECK(codec_for(middle, TensorRole::grad_input) == CodecId::blockwise8);
  CHECK(codec_for(middle, TensorRole::targets) == CodecId::none);
  CHECK(reply_codec_for(middle, wire::MessageKind::forward) == CodecId::blockwise4);
  CHECK(reply_codec_for(middle, wire::MessageKind::backward) == CodecId::blockwise8);

  StageSpec last = last_stage(CodecId::blockwise4);
  last.gradient_codec = CodecId::blockwise8;
  CHECK(codec_for(last, TensorRole::grad_output) == CodecId::none);  // the scalar d_loss
  CHECK(codec_for(last, TensorRole::grad_input) == CodecId::blockwise8);

  // Unset, the gradients travel in the codec.
  CHECK(codec_for(middle_stage(CodecId::fp16), TensorRole::grad_output) == CodecId::fp16);
  CHECK(reply_codec_for(middle_stage(CodecId::fp16), wire::MessageKind::backward) == CodecId::fp16);
}

TEST_CASE("a backward's output gradient must be in the gradient codec; in the activation codec it is refused") {
  const StageSpec spec = split_codecs_stage();
  const auto in = [](CodecId codec, const Tensor& t) { return *encode_floats<StandardCodecs>(t, codec); };
  const StageRequest good{wire::MessageKind::backward, 1, in(CodecId::blockwise4, hidden(2)),
                          in(CodecId::blockwise8, hidden(2)), {}};
  CHECK(check(good, spec).is_ok());

  StageRequest in_activation_codec = good;
  in_activation_codec.grad_output = in(CodecId::blockwise4, hidden(2));
  const Status refused = check(in_activation_codec, spec);
  CHECK(refused.code() == StatusCode::invalid_argument);
  INFO(refused.message());
  CHECK(refused.message().find("output gradient") != std::string::npos);
  CHECK(refused.message().find("8bit") != std::string::npos);  // what the stage takes
  CHECK(refused.message().find("4bit") != std::string::npos);  // what was sent

  // The input a backward re-sends is an activation: in the gradient codec it is refused too.
  StageRequest input_as_gradient = good;
  input_as_gradient.input = in(CodecId::blockwise8, hidden(2));
  CHECK(check(input_as_gradient, spec).code() == StatusCode::invalid_argument);
}

TEST_CASE("a forward asks for its reply in the activation codec, a backward in the gradient codec") {
  const StageSpec spec = split_codecs_stage();
  const auto in = [](CodecId codec, const Tensor& t) { return *encode_floats<StandardCodecs>(t, codec); };
  const StageRequest forward{wire::MessageKind::forward, 1, in(CodecId::blockwise4, hidden(1)), {}, {}};
  const StageRequest backward{wire::MessageKind::backward, 2, in(CodecId::blockwise4, hidden(1)),
                              in(CodecId::blockwise8, hidden(1)), {}};
  CHECK(check(forward, spec, 1, CodecId::blockwise4).is_ok());
  CHECK(check(backward, spec, 1, CodecId::blockwise8).is_ok());

  const Status forward_in_gradient_codec = check(forward, spec, 1, CodecId::blockwise8);
  CHECK(forward_in_gradient_codec.code() == StatusCode::invalid_argument);
  CHECK(forward_in_gradient_codec.message().find("sends its output in codec 4bit") != std::string::npos);
  const Status backward_in_activation_codec = check(backward, spec, 1, CodecId::blockwise4);
  CHECK(backward_in_activation_codec.code() == StatusCode::invalid_argument);
  INFO(backward_in_activation_codec.message());
  CHECK(backward_in_activation_codec.message().find("sends its input gradient in codec 8bit") != std::string::npos);
  CHECK(backward_in_activation_codec.message().find("asks for 4bit") != std::string::npos);
}

TEST_CASE("a stage request without a microbatch id or a deadline is refused") {
  const StageSpec spec = middle_stage(CodecId::none);
  for (const auto& [microbatch, deadline] : {std::pair<uint64_t, int64_t>{0, 1}, {1, 0}}) {
    StageRequest request{wire::MessageKind::backward, 1, raw_tensor(hidden(1)), raw_tensor(hidden(1)), {},
                         microbatch, deadline};
    auto frames = *encode_request(request, 1, spec.codec);  // as sent: no defaults filled in
    auto decoded = wire::decode_message(frames.views(), wire::Limits{});
    REQUIRE(decoded.is_ok());
    Status s = check_request(*decoded, spec).status();
    CHECK(s.code() == StatusCode::invalid_argument);
    CHECK(s.message().find(microbatch == 0 ? "microbatch id" : "deadline") != std::string::npos);
  }
}

TEST_CASE("deadlines: passed is deadline_exceeded, beyond ten minutes is refused, overflow saturates") {
  const int64_t now = 1'700'000'000'000;
  CHECK(check_deadline(now + 1, now).is_ok());
  CHECK(check_deadline(now, now).code() == StatusCode::deadline_exceeded);
  CHECK(check_deadline(1, now).code() == StatusCode::deadline_exceeded);
  CHECK(check_deadline(now + kMaxDeadlineAheadMs, now).is_ok());
  CHECK(check_deadline(now + kMaxDeadlineAheadMs + 1, now).code() == StatusCode::invalid_argument);
  CHECK(check_deadline(INT64_MAX, now).code() == StatusCode::invalid_argument);
  CHECK(unix_millis_after(now, 2.5) == now + 2500);
  CHECK(unix_millis_after(INT64_MAX - 10, 1e300) == INT64_MAX);
  CHECK(unix_millis_after(now, -1e300) == 0);
  CHECK(unix_millis_after(now, std::nan("")) == now);
  // The system clock, not a monotonic one: it crosses processes.
  CHECK(unix_millis_now() > now);
}

TEST_CASE("the last stage: targets must be raw and match the input's batch; the reply carries gradient and loss") {
  const StageSpec spec = last_stage(CodecId::fp16);
  Tensor d_loss = *Tensor::empty(Shape{1}, DType::f32);
  d_loss.data<float>()[0] = 1.0f;
  const auto in_fp16 = [&](const Tensor& t) { return *encode_floats<StandardCodecs>(t, CodecId::fp16); };

  StageRequest good{wire::MessageKind::backward, 3, in_fp16(hidden(2)), raw_tensor(d_loss), raw_tensor(tokens(2))};
  CHECK(check(good, spec).is_ok());

  StageRequest other_batch = good;
  other_batch.targets = raw_tensor(tokens(3));
  CHECK(check(other_batch, spec).code() == StatusCode::invalid_argument);

  StageRequest compressed_loss = good;
  compressed_loss.grad_output = in_fp16(d_loss);  // d_loss travels raw
  CHECK(check(compressed_loss, spec).code() == StatusCode::invalid_argument);

  StageReply reply{in_fp16(hidden(2)), 2.5f};
  auto frames = *encode_reply(3, 1, reply);
  auto parsed = parse_reply(frames, wire::Limits{}, /*has_loss=*/true);
  REQUIRE(parsed.is_ok());
  CHECK(*parsed->loss == 2.5f);
  REQUIRE(parsed->tensor.has_value());
  CHECK(parsed->tensor->codec == CodecId::fp16);
  // The trainer passes these bytes on untouched: they are the peer's encoding.
  CHECK(parsed->tensor->payload.view() == reply.tensor->payload.view());
  CHECK(volume_of(*parsed).values == 2 * 4 * kD + 1);
}

TEST_CASE("a pipeline request: input by the spec, the loss stage's targets passed on loosely before it, by spec at it") {
  const auto in_codec = [](const Tensor& t, CodecId codec) { return *encode_floats<StandardCodecs>(t, codec); };
  const StageSpec middle = middle_stage(CodecId::blockwise8);
  StageRequest good{wire::MessageKind::pipeline, 4, in_codec(hidden(2), CodecId::blockwise8), std::nullopt,
                    raw_tensor(tokens(2))};
  REQUIRE(check(good, middle).is_ok());
  Received r = receive(good, 1, reply_codec_for(middle, wire::MessageKind::pipeline));
  auto call = check_request(r.message, middle);
  REQUIRE(call.is_ok());
  CHECK(call->is_pipeline());
  CHECK_FALSE(call->is_backward());
  CHECK(call->targets != nullptr);
  CHECK(call->batch == 2);
  // Its reply is an input gradient: asked in the gradient codec, as a backward's.
  CHECK(reply_codec_for(split_codecs_stage(), wire::MessageKind::pipeline) == CodecId::blockwise8);

  StageRequest other_batch = good;
  other_batch.targets = raw_tensor(tokens(3));
  CHECK(check(other_batch, middle).code() == StatusCode::invalid_argument);
  StageRequest no_targets = good;
  no_targets.targets.reset();
  CHECK(check(no_targets, middle).code() == StatusCode::invalid_argument);
  StageRequest compressed_targets = good;
  Tensor float_targets = hidden(2);
  compressed_targets.targets = in_codec(float_targets, CodecId::blockwise8);
  CHECK(check(compressed_targets, middle).code() == StatusCode::invalid_argument);
  StageRequest scalar_targets = good;
  scalar_targets.targets = raw_tensor(*Tensor::zeros(Shape{}, DType::i32));
  CHECK(check(scalar_targets, middle).code() == StatusCode::invalid_argument);
  StageRequest with_gradient = good;
  with_gradient.grad_output = in_codec(hidden(2), CodecId::blockwise8);
  CHECK(check(with_gradient, middle).code() == StatusCode::invalid_argument);
  StageRequest wrong_input = good;
  wrong_input.input = in_codec(hidden(2), CodecId::fp16);
  CHECK(check(wrong_input, middle).code() == StatusCode::invalid_argument);
  CHECK(check(good, middle, 1, CodecId::fp16).code() == StatusCode::invalid_argument);  // reply codec

  // A hop chain travels with a pipeline as it was sent, and with nothing else.
  StageRequest chained = good;
  chained.hop_chain = std::string("\x01chain\0bytes", 12);
  Received chained_received = receive(chained, 1, reply_codec_for(middle, wire::MessageKind::pipeline));
  auto chained_call = check_request(chained_received.message, middle);
  REQUIRE(chained_call.is_ok());
  CHECK(chained_call->hop_chain == chained.hop_chain);
  CHECK(call->hop_chain.empty());
  StageRequest chained_forward = chained;
  chained_forward.kind = wire::MessageKind::forward;
  chained_forward.targets.reset();
  CHECK(check(chained_forward, middle).code() == StatusCode::invalid_argument);
  StageRequest oversized = good;
  oversized.hop_chain.assign(wire::kMaxWireHopChain + 1, 'x');
  CHECK(encode_request(oversized, 1, CodecId::blockwise8).status().code() == StatusCode::invalid_argument);

  // At the loss stage the targets are the spec's: no d_loss travels, the protocol fixes it.
  const StageSpec last = last_stage(CodecId::blockwise8);
  CHECK(check(good, last).is_ok());
  StageRequest float_targets_at_last = good;
  float_targets_at_last.targets = raw_tensor(hidden(2));
  CHECK(check(float_targets_at_last, last).code() == StatusCode::invalid_argument);
}

TEST_CASE("the loss stage's d_loss is fixed by the protocol: any other value, shape or dtype is refused") {
  // A member trainer that sent d_loss = -1000 with backwards it never forwarded
  // turned the training loss from 2.9 into 76,650: the one scalar a trainer
  // supplies to the loss stage is not the trainer's to choose.
  const StageSpec spec = last_stage(CodecId::fp16);
  const auto in_fp16 = [&](const Tensor& t) { return *encode_floats<StandardCodecs>(t, CodecId::fp16); };
  const auto backward_with = [&](const Tensor& d_loss) {
    return StageRequest{wire::MessageKind::backward, 3, in_fp16(hidden(2)), raw_tensor(d_loss), raw_tensor(tokens(2))};
  };
  const auto scalar = [](float value) {
    Tensor t = *Tensor::empty(Shape{1}, DType::f32);
    t.data<float>()[0] = value;
    return t;
  };
  CHECK(check(backward_with(scalar(kLossGradient)), spec).is_ok());
  for (float steered : {-1000.0f, -1.0f, 0.5f, -0.0f, 1.0f + 1e-6f, 2.0f}) {  // NaN and Inf: the wire refuses those
    CAPTURE(steered);
    Status s = check(backward_with(scalar(steered)), spec);
    CHECK(s.code() == StatusCode::permission_denied);
    CHECK(s.message().find("d_loss") != std::string::npos);
  }
  Tensor two = *Tensor::empty(Shape{2}, DType::f32);
  two.data<float>()[0] = two.data<float>()[1] = kLossGradient;
  CHECK_FALSE(check(backward_with(two), spec).is_ok());
}

TEST_CASE("a reply from a hostile peer is an error, not a crash") {
  SUBCASE("a forged NaN scale in an 8-bit output") {
    StageReply reply{*encode_floats<StandardCodecs>(hidden(1), CodecId::blockwise8), std::nullopt};
    std::string bytes = reply.tensor->payload.str();
    const float nan = std::nanf("");
    std::memcpy(bytes.data(), &nan, sizeof nan);  // the scale of block 0
    reply.tensor->payload = wire::Frame(bytes);
    auto frames = *encode_reply(1, 0, reply);
    CHECK(parse_reply(frames, wire::Limits{}, false).status().code() == StatusCode::invalid_argument);
  }
  SUBCASE("a last stage that sends no loss") {
    StageReply reply{*encode_floats<StandardCodecs>(hidden(1), CodecId::bf16), std::nullopt};
    auto frames = *encode_reply(1, 0, reply);
    CHECK_FALSE(parse_reply(frames, wire::Limits{}, true).is_ok());
  }
  SUBCASE("two output tensors") {
    wire::MessageHeader header;
    header.kind = wire::MessageKind::result;
    Tensor a = hidden(1), b = hidden(1);
    auto frames = *wire::encode_message(header, std::vector<TensorView>{a, b});
    CHECK_FALSE(parse_reply(frames, wire::Limits{}, false).is_ok());
  }
}

TEST_CASE("raw tensors share the tensor's storage instead of copying it") {
  Tensor x = hidden(2);
  wire::EncodedTensor raw = raw_tensor(x);
  CHECK(raw.payload.data() == static_cast<const char*>(x.raw_data()));
  CHECK(raw.payload.size() == x.size_bytes());
}

}  // namespace
}  // namespace swarm::protocol

namespace swarm::protocol {
namespace {

TEST_CASE("a peer's info carries its sample ledger; a hostile ledger is refused") {
  const StageSpec spec = middle_stage(CodecId::blockwise8);
  SampleLedger ledger;
  ledger.samples_accumulated_total = 40;
  ledger.samples_pending = 8;
  ledger.samples_stepped = 16;
  ledger.samples_lost_resync = 8;
  ledger.samples_lost_failed_round = 8;
  ledger.backward_duplicates_refused = 1;
  ledger.expired_dropped = 3;
  ledger.deadline_refused = 2;
  CHECK(ledger.unaccounted() == 0);
  auto frames = *encode_info_reply(9, spec, &ledger);
  auto info = parse_peer_info(frames, wire::Limits{});
  REQUIRE_MESSAGE(info.is_ok(), info.status().to_string());
  CHECK(info->spec.stage == spec.stage);
  REQUIRE(info->samples.has_value());
  CHECK(*info->samples == ledger);
  CHECK(parse_info_reply(frames, wire::Limits{}).is_ok());  // a spec reader ignores the ledger
  auto without = parse_peer_info(*encode_info_reply(9, spec), wire::Limits{});
  REQUIRE(without.is_ok());
  CHECK_FALSE(without->samples.has_value());

  ledger.samples_stepped = 24;
  CHECK(ledger.unaccounted() == -8);
  CHECK(ledger_from_json(ledger_to_json(ledger))->samples_stepped == 24);
  CHECK_FALSE(ledger_from_json("[]").is_ok());
  CHECK_FALSE(ledger_from_json(R"({"samples_accumulated_total":1})").is_ok());  // the others missing
  std::string text = ledger_to_json(SampleLedger{});
  auto with = [&](const std::string& value) {
    std::string forged = text;
    forged.replace(forged.find("\"expired_dropped\":0"), 19, "\"expired_dropped\":" + value);
    return ledger_from_json(forged);
  };
  CHECK(with("7")->expired_dropped == 7);
  CHECK_FALSE(with("-1").is_ok());
  CHECK_FALSE(with("1.5").is_ok());
  CHECK_FALSE(with("\"1\"").is_ok());
  CHECK_FALSE(with("18446744073709551615").is_ok());
}

// An info reply whose JSON is `text`, as a hostile peer could send it.
wire::Frames info_reply_with(const std::string& text) {
  wire::MessageHeader header;
  header.kind = wire::MessageKind::result;
  const std::vector<wire::EncodedTensor> tensors{
      {DType::u8, CodecId::none, {static_cast<int64_t>(text.size())}, wire::Frame(std::string(text))}};
  return *wire::encode_message_payloads(header, tensors);
}

TEST_CASE("a peer's refusal counters round-trip; hostile ones are refused") {
  const StageSpec spec = middle_stage(CodecId::blockwise8);
  const RefusalCounts counts{{"parts", 5}, {"validation", 0}};
  auto info = parse_peer_info(*encode_info_reply(3, spec, nullptr, &counts), wire::Limits{});
  REQUIRE_MESSAGE(info.is_ok(), info.status().to_string());
  CHECK(info->refusals == counts);

  RefusalCounts too_many;
  for (size_t i = 0; i <= kMaxRefusalCounters; ++i) too_many[fmt::format("c{}", i)] = 1;
  CHECK(encode_info_reply(3, spec, nullptr, &too_many).status().code() == StatusCode::invalid_argument);

  auto with = [&](const std::string& refusals) {
    nlohmann::json j = nlohmann::json::parse(spec_to_json(spec));
    j["refusals"] = nlohmann::json::parse(refusals);
    return parse_peer_info(info_reply_with(j.dump()), wire::Limits{});
  };
  CHECK(with(R"({"parts": 7})")->refusals.at("parts") == 7);
  CHECK_FALSE(with(R"({"parts": -1})").is_ok());
  CHECK_FALSE(with(R"({"parts": 1.5})").is_ok());
  CHECK_FALSE(with(R"({"parts": "7"})").is_ok());
  CHECK_FALSE(with(R"({"parts": 18446744073709551615})").is_ok());
  CHECK_FALSE(with(R"([1, 2])").is_ok());
  nlohmann::json many = nlohmann::json::object();
  for (size_t i = 0; i <= kMaxRefusalCounters; ++i) many[fmt::format("c{}", i)] = 1;
  CHECK_FALSE(with(many.dump()).is_ok());
}

TEST_CASE("stage info round-trips, and a hostile info reply is refused field by field") {
  const StageSpec spec = last_stage(CodecId::bf16);
  auto frames = *encode_info_reply(4, spec);
  auto parsed = parse_info_reply(frames, wire::Limits{});
  REQUIRE_MESSAGE(parsed.is_ok(), parsed.status().to_string());
  CHECK(parsed->stage == spec.stage);
  CHECK(parsed->codec == CodecId::bf16);
  CHECK(parsed->io.input == spec.io.input);
  CHECK(parsed->io.output == spec.io.output);
  REQUIRE(parsed->io.targets.has_value());
  CHECK(*parsed->io.targets == *spec.io.targets);

  CHECK_FALSE(spec_from_json("[]").is_ok());
  CHECK_FALSE(spec_from_json(R"({"stage":1})").is_ok());
  CHECK_FALSE(spec_from_json(R"({"stage":"1","input":{"dtype":"f32","dims":[]},"output":{"dtype":"f32","dims":[]},"codec":"8bit"})").is_ok());
  CHECK_FALSE(spec_from_json(R"({"stage":1,"input":{"dtype":"f99","dims":[]},"output":{"dtype":"f32","dims":[]},"codec":"8bit"})").is_ok());
  CHECK_FALSE(spec_from_json(R"({"stage":1,"input":{"dtype":"f32","dims":[-5]},"output":{"dtype":"f32","dims":[]},"codec":"8bit"})").is_ok());
  CHECK_FALSE(spec_from_json(R"({"stage":1,"input":{"dtype":"f32","dims":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]},"output":{"dtype":"f32","dims":[]},"codec":"8bit"})").is_ok());
  CHECK_FALSE(spec_from_json(R"({"stage":1,"input":{"dtype":"f32","dims":[]},"output":{"dtype":"f32","dims":[]},"codec":"int4"})").is_ok());
  CHECK_FALSE(spec_from_json(R"({"stage":-1,"input":{"dtype":"f32","dims":[]},"output":{"dtype":"f32","dims":[]},"codec":"none"})").is_ok());
}

TEST_CASE("a loss stage's metrics: named in its info, carried after the loss in its reply; hostile ones refused") {
  StageSpec spec = last_stage(CodecId::bf16);
  spec.io.metrics = {"accuracy", "top_5"};
  spec.io.output = TensorSpec{DType::f32, {3}};
  auto parsed = parse_info_reply(*encode_info_reply(4, spec), wire::Limits{});
  REQUIRE_MESSAGE(parsed.is_ok(), parsed.status().to_string());
  CHECK(parsed->io.metrics == spec.io.metrics);
  // An older peer's info, and a stage without metrics, name none.
  CHECK(parse_info_reply(*encode_info_reply(4, last_stage(CodecId::bf16)), wire::Limits{})->io.metrics.empty());

  const auto info_with = [&](const std::string& metrics, const std::string& output_dims) {
    return spec_from_json(R"({"stage":1,"input":{"dtype":"f32","dims":[-1,4]},"targets":{"dtype":"i32","dims":[-1]},)"
                          R"("output":{"dtype":"f32","dims":[)" + output_dims + R"(]},"codec":"none","metrics":)" +
                          metrics + "}");
  };
  CHECK(info_with(R"(["accuracy"])", "2").is_ok());
  CHECK_FALSE(info_with(R"("accuracy")", "2").is_ok());                      // not a list
  CHECK_FALSE(info_with(R"(["Accuracy"])", "2").is_ok());                    // not [a-z0-9_]
  CHECK_FALSE(info_with(R"(["<b>"])", "2").is_ok());
  CHECK_FALSE(info_with(R"([""])", "2").is_ok());
  CHECK_FALSE(info_with(R"([7])", "2").is_ok());
  CHECK_FALSE(info_with(R"(["a","a"])", "3").is_ok());                       // twice
  CHECK_FALSE(info_with(R"(["a","b","c","d","e","f","g","h","i"])", "10").is_ok());  // more than kMaxStageMetrics
  CHECK_FALSE(info_with(R"(["accuracy"])", "1").is_ok());                    // the output holds no value for it
  CHECK_FALSE(info_with(R"(["accuracy"])", "-1,4").is_ok());
  CHECK_FALSE(info_with("[\"" + std::string(33, 'a') + "\"]", "2").is_ok());

  // Its backward still takes d_loss, f32 [1]: the metrics have no gradient.
  Tensor d_loss = *Tensor::empty(Shape{1}, DType::f32);
  d_loss.data<float>()[0] = kLossGradient;
  const auto in_bf16 = [&](const Tensor& t) { return *encode_floats<StandardCodecs>(t, CodecId::bf16); };
  StageRequest backward{wire::MessageKind::backward, 3, in_bf16(hidden(2)), raw_tensor(d_loss), raw_tensor(tokens(2))};
  const Status accepted = check(backward, spec);
  CHECK_MESSAGE(accepted.is_ok(), accepted.to_string());

  StageReply reply{std::nullopt, 0.75f, {0.5f, 0.875f}};
  auto frames = *encode_reply(3, 1, reply);
  auto back = parse_reply(frames, wire::Limits{}, /*has_loss=*/true);
  REQUIRE(back.is_ok());
  CHECK(*back->loss == 0.75f);
  CHECK(back->metrics == std::vector<float>{0.5f, 0.875f});
  CHECK(volume_of(*back).values == 3);
  // A loss tensor of more values than a stage may report, or of another rank, is no reply.
  wire::MessageHeader header;
  header.kind = wire::MessageKind::result;
  for (const Shape& shape : {Shape{static_cast<int64_t>(2 + kMaxStageMetrics)}, Shape{1, 2}, Shape{0}}) {
    CAPTURE(shape.to_string());
    Tensor losses = *Tensor::zeros(shape, DType::f32);
    auto hostile = *wire::encode_message(header, std::vector<TensorView>{losses});
    CHECK_FALSE(parse_reply(hostile, wire::Limits{}, true).is_ok());
  }
}

TEST_CASE("stage info carries the gradient codec; an older peer's info without it means its codec") {
  StageSpec spec = last_stage(CodecId::blockwise4);
  spec.gradient_codec = CodecId::blockwise8;
  auto parsed = parse_info_reply(*encode_info_reply(4, spec), wire::Limits{});
  REQUIRE_MESSAGE(parsed.is_ok(), parsed.status().to_string());
  CHECK(parsed->codec == CodecId::blockwise4);
  CHECK(codec_for(*parsed, TensorRole::grad_input) == CodecId::blockwise8);
  nlohmann::json j = nlohmann::json::parse(spec_to_json(spec));
  CHECK(j.at("gradient_codec") == "8bit");
  // Unset, it is written out resolved: a reader need not know the default.
  CHECK(nlohmann::json::parse(spec_to_json(middle_stage(CodecId::fp16))).at("gradient_codec") == "fp16");

  auto with = [&](const nlohmann::json& gradient_codec) {
    nlohmann::json forged = j;
    if (gradient_codec.is_null()) {
      forged.erase("gradient_codec");
    } else {
      forged["gradient_codec"] = gradient_codec;
    }
    return parse_info_reply(info_reply_with(forged.dump()), wire::Limits{});
  };
  auto older = with(nullptr);
  REQUIRE_MESSAGE(older.is_ok(), older.status().to_string());
  CHECK_FALSE(older->gradient_codec.has_value());
  CHECK(codec_for(*older, TensorRole::grad_input) == CodecId::blockwise4);
  CHECK(codec_for(*with("fp16"), TensorRole::grad_input) == CodecId::fp16);
  const auto unknown = with("int4");
  CHECK(unknown.status().code() == StatusCode::invalid_argument);
  CHECK(unknown.status().message().find("gradient codec") != std::string::npos);
  CHECK_FALSE(with("8BIT").is_ok());  // names are exact
  CHECK_FALSE(with(8).is_ok());
  CHECK_FALSE(with(nlohmann::json::array({"8bit"})).is_ok());
}

}  // namespace
}  // namespace swarm::protocol
