// Seeded mutation fuzzing of decode_message: whatever arrives, it either
// succeeds with views consistent with the frames or returns an error.
#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>

#include "swarm/wire/wire.h"

namespace swarm::wire {
namespace {

Frames valid_frames() {
  Tensor activations = Tensor::empty(Shape{2, 3, 4}, DType::f32).value();
  Tensor tokens = Tensor::empty(Shape{2, 3}, DType::i32).value();
  Tensor half = Tensor::empty(Shape{5}, DType::bf16).value();
  for (int64_t i = 0; i < activations.numel(); ++i) activations.data<float>()[i] = 0.25f * i;
  for (int64_t i = 0; i < tokens.numel(); ++i) tokens.data<int32_t>()[i] = static_cast<int32_t>(i);
  for (int64_t i = 0; i < half.numel(); ++i) half.data<bf16>()[i] = bf16::from_float(1.0f + i);
  MessageHeader header;
  header.kind = MessageKind::backward;
  header.stage = 1;
  header.request_id = 99;
  header.error_text = "context";
  TensorView views[] = {activations, tokens, half};
  return encode_message(header, views).value();
}

TEST_CASE("random mutations never crash the decoder") {
  const Frames original = valid_frames();
  REQUIRE(decode_message(original.views(), Limits{}).is_ok());
  std::mt19937 random(20240611);
  ValidationCounters counters;
  int accepted = 0;
  int rejected = 0;
  constexpr int kIterations = 20000;
  for (int iteration = 0; iteration < kIterations; ++iteration) {
    Frames frames = original;
    const int mutations = 1 + static_cast<int>(random() % 4);
    for (int m = 0; m < mutations; ++m) {
      auto pick = [&](std::size_t n) { return static_cast<std::size_t>(random() % n); };
      switch (random() % 6) {
        case 0:
        case 1: {  // flip a byte, mostly in the header where the structure is
          std::string& part = frames.parts[random() % 4 == 0 ? pick(frames.parts.size()) : 0].mutable_string();
          if (!part.empty()) part[pick(part.size())] = static_cast<char>(random());
          break;
        }
        case 2: {  // truncate a frame
          std::string& part = frames.parts[pick(frames.parts.size())].mutable_string();
          part.resize(pick(part.size() + 1));
          break;
        }
        case 3:  // duplicate a frame
          if (frames.parts.size() < 8) frames.parts.push_back(frames.parts[pick(frames.parts.size())]);
          break;
        case 4:  // drop a frame
          if (!frames.parts.empty()) frames.parts.erase(frames.parts.begin() + pick(frames.parts.size()));
          break;
        case 5: {  // append junk
          std::string& part = (frames.parts.empty() ? frames.parts.emplace_back() : frames.parts[0]).mutable_string();
          part.push_back(static_cast<char>(random()));
          break;
        }
      }
    }
    std::vector<std::string_view> views = frames.views();
    auto decoded = decode_message(views, Limits{}, counters);
    if (!decoded.is_ok()) {
      ++rejected;
      CHECK_FALSE(decoded.status().message().empty());
      continue;
    }
    ++accepted;
    REQUIRE(decoded->tensors.size() == views.size() - 1);
    for (std::size_t i = 0; i < decoded->tensors.size(); ++i) {
      const DecodedTensor& tensor = decoded->tensors[i];
      REQUIRE(tensor.payload.data() == views[i + 1].data());
      REQUIRE(tensor.payload.size() == views[i + 1].size());
      if (tensor.codec == Codec::none) {
        REQUIRE(tensor.view.size_bytes() == views[i + 1].size());
        REQUIRE(tensor.view.numel() == tensor.shape.numel());
      }
    }
  }
  CHECK(accepted + rejected == kIterations);
  CHECK(counters.total() == static_cast<uint64_t>(rejected));
  // The mutations must exercise both paths, or the loop proves little.
  CHECK(rejected > kIterations / 2);
  CHECK(accepted > 0);
}

}  // namespace
}  // namespace swarm::wire
