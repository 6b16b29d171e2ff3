#include "swarm/wire/wire.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace swarm::wire {
namespace {

using Counter = std::atomic<uint64_t> ValidationCounters::*;

// Owns the tensors that a forward message's frames were built from.
struct Fixture {
  Tensor activations = Tensor::empty(Shape{2, 3, 4}, DType::f32).value();
  Tensor tokens = Tensor::empty(Shape{2, 3}, DType::i32).value();
  MessageHeader header;
  Frames frames;

  Fixture() {
    for (int64_t i = 0; i < activations.numel(); ++i) activations.data<float>()[i] = 0.5f * i - 3.0f;
    for (int64_t i = 0; i < tokens.numel(); ++i) tokens.data<int32_t>()[i] = static_cast<int32_t>(100 + i);
    header.kind = MessageKind::forward;
    header.stage = 2;
    header.request_id = 42;
    TensorView views[] = {activations, tokens};
    frames = encode_message(header, views).value();
  }

  // The encoded header, for tests that forge one field.
  MessageHeader parsed_header() const { return decode_message(frames.views(), Limits{}).value().header; }
  void replace_header(const MessageHeader& forged) { frames.parts[0] = serialize_header(forged); }
};

// Decodes, checks that exactly `counter` moved and the code is `code`; returns the message.
std::string expect_rejected(const std::vector<std::string_view>& frames, const Limits& limits, StatusCode code,
                       Counter counter) {
  ValidationCounters counters;
  auto decoded = decode_message(frames, limits, counters);
  REQUIRE_FALSE(decoded.is_ok());
  CHECK(decoded.status().code() == code);
  CHECK((counters.*counter).load() == 1);
  CHECK(counters.total() == 1);
  return decoded.status().message();
}

TEST_CASE("a forward message round-trips with views into the frames") {
  Fixture fixture;
  REQUIRE(fixture.frames.parts.size() == 3);
  std::vector<std::string_view> views = fixture.frames.views();
  ValidationCounters counters;
  auto decoded = decode_message(views, Limits{}, counters);
  REQUIRE(decoded.is_ok());
  CHECK(counters.total() == 0);
  CHECK(decoded->header.kind == MessageKind::forward);
  CHECK(decoded->header.stage == 2);
  CHECK(decoded->header.request_id == 42);
  REQUIRE(decoded->tensors.size() == 2);

  const TensorView& a = decoded->tensors[0].view;
  CHECK(a.dtype() == DType::f32);
  CHECK(a.shape() == Shape{2, 3, 4});
  CHECK(a.raw_data() == static_cast<const void*>(views[1].data()));  // zero-copy
  CHECK(bitwise_equal(a, fixture.activations));
  CHECK(a.span<const float>()[5] == -0.5f);

  const TensorView& b = decoded->tensors[1].view;
  CHECK(b.dtype() == DType::i32);
  CHECK(b.shape() == Shape{2, 3});
  CHECK(b.raw_data() == static_cast<const void*>(views[2].data()));
  CHECK(bitwise_equal(b, fixture.tokens));
  CHECK(decoded->header.tensors[1].payload_bytes == 24);
}

TEST_CASE("a request's microbatch id and deadline round-trip; a negative deadline is refused") {
  Fixture fixture;
  MessageHeader header = fixture.parsed_header();
  header.microbatch_id = 0xfedcba9876543210ull;
  header.deadline_unix_ms = 1'700'000'000'123;
  fixture.replace_header(header);
  auto decoded = decode_message(fixture.frames.views(), Limits{});
  REQUIRE_MESSAGE(decoded.is_ok(), decoded.status().to_string());
  CHECK(decoded->header.microbatch_id == 0xfedcba9876543210ull);
  CHECK(decoded->header.deadline_unix_ms == 1'700'000'000'123);

  header.deadline_unix_ms = -1;
  fixture.replace_header(header);
  std::string message = expect_rejected(fixture.frames.views(), Limits{}, StatusCode::invalid_argument,
                                        &ValidationCounters::bad_header);
  CHECK(message.find("deadline") != std::string::npos);
}

TEST_CASE("every prefix of a valid header is rejected as a bad header") {
  Fixture fixture;
  const std::string full = fixture.frames.parts[0].str();
  ValidationCounters counters;
  for (std::size_t length = 0; length < full.size(); ++length) {
    std::vector<std::string_view> frames = fixture.frames.views();
    frames[0] = std::string_view(full).substr(0, length);
    auto decoded = decode_message(frames, Limits{}, counters);
    REQUIRE_FALSE(decoded.is_ok());
    CHECK(decoded.status().code() == StatusCode::invalid_argument);
  }
  CHECK(counters.bad_header.load() == full.size());
  CHECK(counters.total() == full.size());
}

TEST_CASE("garbage and trailing bytes in the header frame are rejected") {
  Fixture fixture;
  SUBCASE("a huge text length after a valid version") {
    const std::string version{static_cast<char>(kWireVersion & 0xff), static_cast<char>(kWireVersion >> 8)};
    fixture.frames.parts[0] = version + std::string(60, '\xff');
    expect_rejected(fixture.frames.views(), Limits{}, StatusCode::invalid_argument,
                    &ValidationCounters::bad_header);
  }
  SUBCASE("one extra byte after the header") {
    fixture.frames.parts[0].mutable_string() += 'x';
    expect_rejected(fixture.frames.views(), Limits{}, StatusCode::invalid_argument,
                    &ValidationCounters::bad_header);
  }
  SUBCASE("text that is not a header at all reads as another version") {
    fixture.frames.parts[0] = "hello, this is not a header";
    expect_rejected(fixture.frames.views(), Limits{}, StatusCode::unimplemented,
                    &ValidationCounters::bad_version);
  }
}

TEST_CASE("header fields out of range are rejected with their counter") {
  Fixture fixture;
  MessageHeader forged = fixture.parsed_header();
  SUBCASE("wrong version") {
    forged.version = 1;  // before reply_codec: laid out differently
    fixture.replace_header(forged);
    std::string message = expect_rejected(fixture.frames.views(), Limits{}, StatusCode::unimplemented,
                                    &ValidationCounters::bad_version);
    CHECK(message.find("version 1") != std::string::npos);
  }
  SUBCASE("unknown reply codec 9") {
    forged.reply_codec = 9;
    fixture.replace_header(forged);
    expect_rejected(fixture.frames.views(), Limits{}, StatusCode::invalid_argument, &ValidationCounters::bad_dtype);
  }
  SUBCASE("unknown kind 200") {
    forged.kind = static_cast<MessageKind>(200);
    fixture.replace_header(forged);
    expect_rejected(fixture.frames.views(), Limits{}, StatusCode::invalid_argument,
                    &ValidationCounters::bad_kind);
  }
  SUBCASE("unknown dtype 9") {
    forged.tensors[1].dtype_code = 9;
    fixture.replace_header(forged);
    std::string message = expect_rejected(fixture.frames.views(), Limits{}, StatusCode::invalid_argument,
                                    &ValidationCounters::bad_dtype);
    CHECK(message.find("tensor 1") != std::string::npos);
  }
  SUBCASE("unknown codec") {
    forged.tensors[0].codec = kMaxCodecCode + 1;
    fixture.replace_header(forged);
    expect_rejected(fixture.frames.views(), Limits{}, StatusCode::invalid_argument,
                    &ValidationCounters::bad_dtype);
  }
  SUBCASE("a lossy codec on an integer tensor") {
    forged.tensors[1].codec = static_cast<uint8_t>(Codec::fp16);
    fixture.replace_header(forged);
    expect_rejected(fixture.frames.views(), Limits{}, StatusCode::invalid_argument,
                    &ValidationCounters::bad_dtype);
  }
  SUBCASE("2^60 elements exceed max_tensor_elements") {
    forged.tensors[0].dims = {int64_t{1} << 60};
    forged.tensors[0].payload_bytes = uint64_t{1} << 62;
    fixture.replace_header(forged);
    expect_rejected(fixture.frames.views(), Limits{}, StatusCode::resource_exhausted,
                    &ValidationCounters::too_large);
  }
  SUBCASE("2^60 x 2^60 overflows int64") {
    forged.tensors[0].dims = {int64_t{1} << 60, int64_t{1} << 60};
    fixture.replace_header(forged);
    expect_rejected(fixture.frames.views(), Limits{}, StatusCode::invalid_argument,
                    &ValidationCounters::bad_shape);
  }
  SUBCASE("negative dim") {
    forged.tensors[0].dims = {2, -3, 4};
    fixture.replace_header(forged);
    expect_rejected(fixture.frames.views(), Limits{}, StatusCode::invalid_argument,
                    &ValidationCounters::bad_shape);
  }
  SUBCASE("rank 9") {
    forged.tensors[0].dims = std::vector<int64_t>(9, 1);
    fixture.replace_header(forged);
    expect_rejected(fixture.frames.views(), Limits{}, StatusCode::invalid_argument,
                    &ValidationCounters::bad_shape);
  }
  SUBCASE("a rank within Shape's bound but above Limits::max_rank") {
    Limits limits;
    limits.max_rank = 2;
    expect_rejected(fixture.frames.views(), limits, StatusCode::invalid_argument,
                    &ValidationCounters::bad_shape);
  }
  SUBCASE("header payload_bytes disagrees with the shape") {
    forged.tensors[0].payload_bytes += 4;
    fixture.replace_header(forged);
    expect_rejected(fixture.frames.views(), Limits{}, StatusCode::invalid_argument,
                    &ValidationCounters::frame_mismatch);
  }
  SUBCASE("error text too long") {
    forged.error_text = std::string(Limits{}.max_error_text + 1, 'e');
    fixture.replace_header(forged);
    expect_rejected(fixture.frames.views(), Limits{}, StatusCode::resource_exhausted,
                    &ValidationCounters::too_large);
  }
  SUBCASE("error text at the limit is accepted") {
    forged.error_text = std::string(Limits{}.max_error_text, 'e');
    fixture.replace_header(forged);
    CHECK(decode_message(fixture.frames.views(), Limits{}).is_ok());
  }
}

TEST_CASE("too many tensors are rejected") {
  std::vector<Tensor> tensors;
  std::vector<TensorView> views;
  for (int i = 0; i < 17; ++i) {
    tensors.push_back(Tensor::zeros(Shape{2}, DType::i32).value());
    views.push_back(tensors.back());
  }
  Frames frames = encode_message(MessageHeader{}, views).value();
  REQUIRE(frames.parts.size() == 18);
  expect_rejected(frames.views(), Limits{}, StatusCode::resource_exhausted, &ValidationCounters::too_large);
  Limits roomier;
  roomier.max_tensors = 17;
  CHECK(decode_message(frames.views(), roomier).is_ok());
}

TEST_CASE("frame count and frame sizes must match the header") {
  Fixture fixture;
  std::vector<std::string_view> frames = fixture.frames.views();
  SUBCASE("no frames at all") {
    expect_rejected({}, Limits{}, StatusCode::invalid_argument, &ValidationCounters::frame_mismatch);
  }
  SUBCASE("one frame fewer") {
    frames.pop_back();
    expect_rejected(frames, Limits{}, StatusCode::invalid_argument, &ValidationCounters::frame_mismatch);
  }
  SUBCASE("one frame more") {
    frames.push_back(frames.back());
    expect_rejected(frames, Limits{}, StatusCode::invalid_argument, &ValidationCounters::frame_mismatch);
  }
  SUBCASE("payload one byte short") {
    frames[1].remove_suffix(1);
    expect_rejected(frames, Limits{}, StatusCode::invalid_argument, &ValidationCounters::frame_mismatch);
  }
  SUBCASE("payload one byte long") {
    std::string longer = fixture.frames.parts[2] + 'x';
    frames[2] = longer;
    std::string message =
        expect_rejected(frames, Limits{}, StatusCode::invalid_argument, &ValidationCounters::frame_mismatch);
    CHECK(message.find("tensor 1") != std::string::npos);
  }
}

TEST_CASE("global byte limits bound the message") {
  Fixture fixture;
  uint64_t total = 0;
  for (const Frame& part : fixture.frames.parts) total += part.size();
  Limits limits;
  limits.max_message_bytes = total;
  CHECK(decode_message(fixture.frames.views(), limits).is_ok());
  limits.max_message_bytes = total - 1;
  expect_rejected(fixture.frames.views(), limits, StatusCode::resource_exhausted, &ValidationCounters::too_large);

  Limits small_header;
  small_header.max_header_bytes = static_cast<uint32_t>(fixture.frames.parts[0].size() - 1);
  expect_rejected(fixture.frames.views(), small_header, StatusCode::resource_exhausted,
                  &ValidationCounters::too_large);
}

TEST_CASE("NaN and Inf in floating payloads are rejected, naming the tensor") {
  Fixture fixture;
  SUBCASE("NaN in an f32 payload") {
    fixture.activations.data<float>()[7] = std::numeric_limits<float>::quiet_NaN();
    TensorView views[] = {fixture.activations, fixture.tokens};
    Frames frames = encode_message(fixture.header, views).value();
    std::string message = expect_rejected(frames.views(), Limits{}, StatusCode::invalid_argument,
                                    &ValidationCounters::non_finite);
    CHECK(message.find("tensor 0") != std::string::npos);
    CHECK(message.find("element 7") != std::string::npos);
  }
  SUBCASE("Inf in a bf16 payload") {
    Tensor half = Tensor::zeros(Shape{4}, DType::bf16).value();
    half.data<bf16>()[3] = bf16::from_float(-std::numeric_limits<float>::infinity());
    TensorView views[] = {fixture.tokens, half};
    Frames frames = encode_message(fixture.header, views).value();
    std::string message = expect_rejected(frames.views(), Limits{}, StatusCode::invalid_argument,
                                    &ValidationCounters::non_finite);
    CHECK(message.find("tensor 1") != std::string::npos);
  }
  SUBCASE("Inf in an f16 payload") {
    Tensor half = Tensor::zeros(Shape{4}, DType::f16).value();
    half.data<f16>()[0] = f16::from_float(1e6f);  // overflows f16 to Inf
    TensorView views[] = {half};
    Frames frames = encode_message(fixture.header, views).value();
    expect_rejected(frames.views(), Limits{}, StatusCode::invalid_argument, &ValidationCounters::non_finite);
  }
  SUBCASE("finite bf16 and f16 extremes pass") {
    Tensor a = Tensor::zeros(Shape{2}, DType::bf16).value();
    Tensor b = Tensor::zeros(Shape{2}, DType::f16).value();
    a.data<bf16>()[0] = bf16::from_float(3e38f);
    b.data<f16>()[0] = f16::from_float(65504.0f);
    TensorView views[] = {a, b};
    CHECK(decode_message(encode_message(fixture.header, views).value().views(), Limits{}).is_ok());
  }
}

TEST_CASE("a misaligned f32 frame is refused, not read") {
  Fixture fixture;
  std::string shifted = std::string(1, '\0') + fixture.frames.parts[1];
  std::vector<std::string_view> frames = fixture.frames.views();
  const char* base = shifted.data() + 1;
  // Only meaningful when the shifted start really is misaligned.
  REQUIRE(reinterpret_cast<std::uintptr_t>(base) % 4 != 0);
  frames[1] = std::string_view(base, fixture.frames.parts[1].size());
  expect_rejected(frames, Limits{}, StatusCode::failed_precondition, &ValidationCounters::misaligned);
}

TEST_CASE("expected_payload_bytes follows each codec's rule") {
  CHECK(expected_payload_bytes(DType::f32, 10, Codec::none).value() == 40);
  CHECK(expected_payload_bytes(DType::i64, 3, Codec::none).value() == 24);
  CHECK(expected_payload_bytes(DType::f32, 10, Codec::fp16).value() == 20);
  CHECK(expected_payload_bytes(DType::f32, 10, Codec::bf16).value() == 20);
  CHECK(expected_payload_bytes(DType::f32, 4096, Codec::blockwise8).value() == 4096 + 4);
  CHECK(expected_payload_bytes(DType::f32, 4097, Codec::blockwise8).value() == 4097 + 8);
  CHECK(expected_payload_bytes(DType::f32, 0, Codec::blockwise8).value() == 0);
  CHECK(expected_payload_bytes(DType::i32, 10, Codec::fp16).status().code() == StatusCode::invalid_argument);
  CHECK(expected_payload_bytes(DType::bf16, 10, Codec::blockwise8).status().code() ==
        StatusCode::invalid_argument);
  CHECK(expected_payload_bytes(DType::f32, uint64_t{1} << 63, Codec::none).status().code() ==
        StatusCode::out_of_range);
}

TEST_CASE("expected_payload_bytes for blockwise4: 4·ceil(n/64) scale bytes + ceil(n/2) code bytes, never wrapped") {
  CHECK(expected_payload_bytes(DType::f32, 0, Codec::blockwise4).value() == 0);
  CHECK(expected_payload_bytes(DType::f32, 1, Codec::blockwise4).value() == 4 + 1);
  CHECK(expected_payload_bytes(DType::f32, 2, Codec::blockwise4).value() == 4 + 1);
  CHECK(expected_payload_bytes(DType::f32, 63, Codec::blockwise4).value() == 4 + 32);
  CHECK(expected_payload_bytes(DType::f32, 64, Codec::blockwise4).value() == 4 + 32);
  CHECK(expected_payload_bytes(DType::f32, 65, Codec::blockwise4).value() == 8 + 33);
  CHECK(expected_payload_bytes(DType::f32, 5000, Codec::blockwise4).value() == 4 * 79 + 2500);
  // The largest counts fit in 64 bits (about 0.5625 bytes a value): exact, not wrapped.
  const uint64_t max = ~uint64_t{0};
  CHECK(expected_payload_bytes(DType::f32, max, Codec::blockwise4).value() == (uint64_t{1} << 63) + (uint64_t{1} << 60));
  CHECK(expected_payload_bytes(DType::f32, max - 64, Codec::blockwise4).value() ==
        (uint64_t{1} << 63) - 32 + (uint64_t{1} << 60) - 4);
  CHECK(expected_payload_bytes(DType::bf16, 10, Codec::blockwise4).status().code() == StatusCode::invalid_argument);
  CHECK(expected_payload_bytes(DType::i32, 10, Codec::blockwise4).status().code() == StatusCode::invalid_argument);
}

// One f32 tensor of `numel` values whose payload claims `codec`: `scales` block
// scales of 1.0 and then `code_bytes` bytes of 0x5a.
Frames blockwise_message(Codec codec, int64_t numel, std::size_t scales, std::size_t code_bytes) {
  MessageHeader header;
  header.kind = MessageKind::allreduce_part;
  TensorHeader tensor;
  tensor.dtype_code = static_cast<uint8_t>(DType::f32);
  tensor.codec = static_cast<uint8_t>(codec);
  tensor.dims = {numel};
  tensor.payload_bytes = 4 * scales + code_bytes;
  header.tensors.push_back(tensor);
  std::string payload(4 * scales + code_bytes, '\x5a');
  const float one = 1.0f;
  for (std::size_t b = 0; b < scales; ++b) std::memcpy(payload.data() + 4 * b, &one, 4);
  Frames frames;
  frames.parts = {serialize_header(header), payload};
  return frames;
}

TEST_CASE("a forged NaN/Inf block scale is rejected at the wire and counted, for both blockwise codecs") {
  // 129 values: 8bit has 1 scale and 129 code bytes; 4bit has 3 scales and 65.
  for (const auto& [codec, scales, code_bytes] : {std::tuple{Codec::blockwise8, std::size_t{1}, std::size_t{129}},
                                                   std::tuple{Codec::blockwise4, std::size_t{3}, std::size_t{65}}}) {
    INFO("codec " << codec_name(codec));
    Frames good = blockwise_message(codec, 129, scales, code_bytes);
    CHECK(decode_message(good.views(), Limits{}).is_ok());
    for (uint32_t forged : {0x7fc00000u, 0xff800000u, 0x7f800000u, 0x7f800001u}) {
      Frames frames = good;
      const std::size_t block = scales - 1;  // the last scale
      std::memcpy(frames.parts[1].mutable_string().data() + 4 * block, &forged, 4);
      std::string message = expect_rejected(frames.views(), Limits{}, StatusCode::invalid_argument,
                                            &ValidationCounters::non_finite);
      CHECK(message.find("tensor 0") != std::string::npos);
      CHECK(message.find("block scale element " + std::to_string(block)) != std::string::npos);
    }
    // Bytes that would read as NaN in the codes are not scales: not scanned.
    Frames codes = good;
    std::string& payload = codes.parts[1].mutable_string();
    std::fill(payload.begin() + static_cast<std::ptrdiff_t>(4 * scales), payload.end(), '\xff');
    CHECK(decode_message(codes.views(), Limits{}).is_ok());
  }
  // A 4bit frame one byte short (as if counted one code a byte, or no padding) is a size mismatch.
  Frames short_frame = blockwise_message(Codec::blockwise4, 129, 3, 64);
  expect_rejected(short_frame.views(), Limits{}, StatusCode::invalid_argument, &ValidationCounters::frame_mismatch);
}

TEST_CASE("an encoded payload decodes as bytes with no typed view") {
  MessageHeader header;
  header.kind = MessageKind::allreduce_part;
  TensorHeader tensor;
  tensor.dtype_code = static_cast<uint8_t>(DType::f32);
  tensor.codec = static_cast<uint8_t>(Codec::blockwise8);
  tensor.dims = {5000};
  tensor.payload_bytes = 5008;
  header.tensors.push_back(tensor);
  Frames frames;
  frames.parts = {serialize_header(header), std::string(5008, '\x7f')};  // would be NaN as f32: not scanned
  auto decoded = decode_message(frames.views(), Limits{});
  REQUIRE(decoded.is_ok());
  CHECK(decoded->tensors[0].codec == Codec::blockwise8);
  CHECK(decoded->tensors[0].payload.size() == 5008);
  CHECK(decoded->tensors[0].view.raw_data() == nullptr);
  frames.parts[1].mutable_string().pop_back();
  CHECK(decode_message(frames.views(), Limits{}).status().code() == StatusCode::invalid_argument);
}

TEST_CASE("encode_message refuses device tensors") {
  int dummy = 0;
  TensorView on_gpu(&dummy, DType::i32, Shape{1}, Device::cuda);
  TensorView views[] = {on_gpu};
  CHECK(encode_message(MessageHeader{}, views).status().code() == StatusCode::invalid_argument);
}

TEST_CASE("error replies round-trip their code and message") {
  Status original = data_loss("chunk {} hash mismatch", 3);
  Frames reply = make_error_reply(7, 4, original);
  REQUIRE(reply.parts.size() == 1);
  auto decoded = decode_message(reply.views(), Limits{});
  REQUIRE(decoded.is_ok());
  CHECK(decoded->header.kind == MessageKind::error);
  CHECK(decoded->header.request_id == 7);
  CHECK(decoded->header.stage == 4);
  CHECK(status_from_error_reply(decoded->header) == original);

  SUBCASE("long text is truncated to fit the default limit, at a character boundary") {
    std::string text(Limits{}.max_error_text - 1, 'a');
    text += "\xc3\xa9 and more";  // a two-byte character straddles the cut
    Frames long_reply = make_error_reply(1, 0, unavailable("{}", text));
    auto long_decoded = decode_message(long_reply.views(), Limits{});
    REQUIRE(long_decoded.is_ok());
    CHECK(long_decoded->header.error_text.size() == Limits{}.max_error_text - 1);
    CHECK(status_from_error_reply(long_decoded->header).code() == StatusCode::unavailable);
  }
  SUBCASE("a non-error message or a bogus code is not taken at its word") {
    MessageHeader ping;
    CHECK(status_from_error_reply(ping).code() == StatusCode::internal);
    MessageHeader bogus = decoded->header;
    bogus.error_code = 999;
    CHECK(status_from_error_reply(bogus).code() == StatusCode::internal);
    bogus.error_code = 0;
    CHECK(status_from_error_reply(bogus).code() == StatusCode::internal);
  }
}

TEST_CASE("validate_against_spec checks stage, count, dtype, rank and fixed dims") {
  Fixture fixture;
  MessageHeader header = fixture.parsed_header();
  TensorListSpec spec{2, {{DType::f32, {-1, -1, 4}}, {DType::i32, {-1, 3}}}};
  CHECK(validate_against_spec(header, spec).is_ok());

  TensorListSpec wrong_stage = spec;
  wrong_stage.stage = 3;
  CHECK(validate_against_spec(header, wrong_stage).code() == StatusCode::invalid_argument);

  TensorListSpec wrong_count = spec;
  wrong_count.inputs.pop_back();
  CHECK_FALSE(validate_against_spec(header, wrong_count).is_ok());

  TensorListSpec wrong_dtype = spec;
  wrong_dtype.inputs[0].first = DType::bf16;
  CHECK_FALSE(validate_against_spec(header, wrong_dtype).is_ok());

  TensorListSpec wrong_rank = spec;
  wrong_rank.inputs[1].second = {-1, -1, 3};
  CHECK_FALSE(validate_against_spec(header, wrong_rank).is_ok());

  TensorListSpec wrong_dim = spec;
  wrong_dim.inputs[0].second = {-1, -1, 8};
  Status status = validate_against_spec(header, wrong_dim);
  CHECK(status.code() == StatusCode::invalid_argument);
  CHECK(status.message().find("dim 2") != std::string::npos);
}

}  // namespace
}  // namespace swarm::wire
