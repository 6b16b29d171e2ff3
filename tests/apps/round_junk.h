// round_junk: the junk round messages a member of a stage can send its stage-mates
// (hostile_messages_test streams them at stage 0): PARTs for groups and steps that
// do not exist, in the wrong codec or of the wrong size, in a real peer's name;
// JOINs with absurd samples and wrong hashes; BEGINs naming the attacker leader;
// COMMIT, ABORT and DONE for random groups; malformed JSON. 22 kinds, in turn:
//
//   JunkMaker maker(attacker.id, {peer_a, peer_b}, /*seed=*/20240611);
//   Junk junk = maker.next(target.id, now);  // junk.kind names it; no frames: unencodable
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "swarm/averaging/round_messages.h"
#include "swarm/compression/codecs.h"
#include "tests/apps/hostile_rounds_fixture.h"

namespace swarm::hostile_rounds {

// The number of kinds JunkMaker::next takes in turn.
inline constexpr int kJunkKinds = 22;

// One junk message: its kind and its frames (none: it could not be encoded).
struct Junk {
  std::string kind;
  wire::Frames frames;
};

// The junk a peer answers with ok, as round_protocol.cc means it to; each is harmless:
//  - StageRounds::on_abort: an ABORT of a group the peer is not in is "over already";
//  - StageRounds::on_part: a PART in its leader's name at its step, while it waits for
//    that leader's BEGIN, is held (bounded by max_early_values) until a part of another
//    group or the BEGIN arrives. The attacker's view of the step lags by up to a
//    publication period, so its "next step" is at times the step the peer is at.
// Every other kind must be refused with an error reply, every time.
inline constexpr const char* kAbortRandom = "abort, random group";
inline constexpr const char* kLeadersPartNow = "part in the leader's name, current step";
inline constexpr const char* kLeadersPartNext = "part in the leader's name, next step";
inline bool answered_ok_by_design(const std::string& kind) {
  return kind == kAbortRandom || kind == kLeadersPartNow || kind == kLeadersPartNext;
}

class JunkMaker {
 public:
  JunkMaker(const std::string& attacker, std::vector<std::string> honest, uint64_t seed)
      : attacker_(attacker), honest_(std::move(honest)), rng_(seed),
        codec_(RoundCodec::of<compression::StandardCodecs>(CodecId::blockwise8)) {}

  // Kinds in turn, each aimed at `target`.
  Junk next(const std::string& target, const StageNow& now) {
    const int kind = static_cast<int>(count_++ % kJunkKinds);
    const std::string other = honest_[0] == target ? honest_[1] : honest_[0];
    switch (kind) {
      case 0: return part("part, attacker leads, current step", attacker_, attacker_, now.step);
      case 1: return part("part, attacker leads, next step", attacker_, attacker_, now.step + 1);
      case 2: return part("part, attacker leads, step 2^40", attacker_, attacker_, kFarStep);
      case 3: return part("part, step 2^40 in the leader's name", attacker_, now.leader, kFarStep);
      case 4: return part("part as a real peer (impostor)", other, now.leader, now.step);
      case 5: return part("part as the target itself", target, now.leader, now.step);
      case 6: return part(kLeadersPartNow, attacker_, now.leader, now.step);
      case 7: return part(kLeadersPartNext, attacker_, now.leader, now.step + 1);
      case 8: return raw_codec_part(now);
      case 9: return short_part(now);
      case 10: return nan_part(now);
      case 11: return join("join, huge samples, wrong hash", now.step, INT64_MAX / 2, now.hash ^ 0x9e3779b97f4a7c15);
      case 12: return join("join, step 2^40", kFarStep, 1'000'000'000'000, now.hash + 1);
      case 13: return begin(target, now.step, "begin, the attacker leads");
      case 14: return simple("commit, attacker leads", RoundOp::commit, attacker_, now.step);
      case 15: return simple("commit in the leader's name", RoundOp::commit, now.leader, now.step);
      case 16: return simple(kAbortRandom, RoundOp::abort, now.leader, now.step);
      case 17: return simple("done, random group", RoundOp::done, now.leader, now.step);
      case 18: return malformed("malformed JSON", R"({"op": "part", "step": 3, "sender": )");
      case 19: return join("join, next step, huge samples, wrong hash", now.step + 1, INT64_MAX / 2, rng_());
      case 20: return begin(target, now.step + 1, "begin, the attacker leads, next step");
      default:
        return malformed("wrong JSON types",
                         fmt::format(R"({{"op": "join", "step": "ten", "sender": ["{}"], "samples": -1.5}})",
                                     attacker_));
    }
  }

 private:
  uint64_t group() { return rng_() | 1; }

  // No REQUIRE here: the stream runs on its own thread. A message that cannot be
  // encoded goes out as no frames, which the tally counts apart.
  static wire::Frames encoded(Result<wire::Frames> frames) {
    return frames.is_ok() ? std::move(frames).value() : wire::Frames{};
  }

  RoundMessage base(RoundOp op, const std::string& sender, const std::string& leader, int64_t step) {
    RoundMessage m;
    m.op = op;
    m.stage = 0;
    m.step = step;
    m.sender = sender;
    m.leader = leader;
    m.group = group();
    m.params_hash = rng_();
    return m;
  }

  std::vector<float> values(size_t n) {
    std::uniform_real_distribution<float> u(-1, 1);
    std::vector<float> v(n);
    for (auto& x : v) x = u(rng_);
    return v;
  }

  Junk part(const std::string& kind, const std::string& sender, const std::string& leader, int64_t step) {
    RoundMessage m = base(RoundOp::part, sender, leader, step);
    m.phase = 0;
    m.part = 1;
    m.from = 0;
    m.chunk = 0;
    m.values = values(256);
    return {kind, encoded(encode_round_message(m, codec_))};
  }

  Junk raw_codec_part(const StageNow& now) {
    RoundMessage m = base(RoundOp::part, attacker_, now.leader, now.step);
    m.part = 1;
    m.values = values(256);
    return {"part in the wrong codec (raw f32)", encoded(encode_round_message(m, RoundCodec::raw()))};
  }

  Junk short_part(const StageNow& now) {
    // The wire library will not encode it: a valid part, its payload cut by hand.
    Junk junk = part("part of junk bytes, wrong size", attacker_, now.leader, now.step);
    if (!junk.frames.parts.empty()) junk.frames.parts.back() = wire::Frame(std::string(100, '\x7f'));
    return junk;
  }

  Junk nan_part(const StageNow& now) {
    RoundMessage m = base(RoundOp::part, attacker_, now.leader, now.step);
    m.part = 1;
    std::string junk(260, '\xff');  // the size of 256 values, a NaN for their scale
    return {"part of junk bytes, NaN scale",
            encoded(encode_round_part(m, CodecId::blockwise8, 256, wire::Frame(std::move(junk))))};
  }

  Junk join(const std::string& kind, int64_t step, int64_t samples, uint64_t hash) {
    RoundMessage m = base(RoundOp::join, attacker_, "", step);
    m.address = "tcp://127.0.0.1:9";
    m.samples = samples;
    m.samples_per_second = 1e9;
    m.params_hash = hash;
    return {kind, encoded(encode_round_message(m, codec_))};
  }

  Junk begin(const std::string& target, int64_t step, const std::string& kind) {
    RoundMessage m = base(RoundOp::begin, attacker_, attacker_, step);
    m.members = {{attacker_, "tcp://127.0.0.1:9"}, {target, "tcp://127.0.0.1:9"}};
    std::sort(m.members.begin(), m.members.end(),
              [](const RoundMember& a, const RoundMember& b) { return a.peer_id < b.peer_id; });
    return {kind, encoded(encode_round_message(m, codec_))};
  }

  Junk simple(const std::string& kind, RoundOp op, const std::string& leader, int64_t step) {
    RoundMessage m = base(op, attacker_, leader, step);
    m.reason = "mallory says so";
    return {kind, encoded(encode_round_message(m, codec_))};
  }

  Junk malformed(const std::string& kind, std::string json) {
    wire::MessageHeader header;
    header.kind = wire::MessageKind::allreduce_part;
    header.stage = 0;
    const int64_t size = static_cast<int64_t>(json.size());
    const wire::EncodedTensor tensors[] = {{DType::u8, wire::Codec::none, {size}, wire::Frame(std::move(json))}};
    return {kind, encoded(wire::encode_message_payloads(header, tensors))};
  }

  std::string attacker_;
  std::vector<std::string> honest_;
  std::mt19937_64 rng_;
  RoundCodec codec_;
  uint64_t count_ = 0;
};

}  // namespace swarm::hostile_rounds
