// round_messages: what the peers of a stage say to each other to agree on a round.
//
// One leader per (stage, step) assembles the round (hivemind's matchmaking is the
// model): members JOIN it, it sends BEGIN with the group id and the ordered
// members and their weights, the members exchange PARTs (reduce-scatter, then
// all-gather), report DONE, and the leader sends COMMIT once every member holds
// every part, or ABORT. REFUSE answers a message the receiver will not take, so
// a sender learns of a mismatch in one round trip.
//
// Every message travels as wire kind `allreduce_part`: tensor 0 a JSON object of
// control fields, tensor 1 (PART only) the values in the round's codec. parse()
// checks every field, bound and size before it allocates anything for the values.
//
//   SWARM_ASSIGN_OR_RETURN(wire::Frames frames, encode_round_message(message));
//   SWARM_ASSIGN_OR_RETURN(RoundMessage got, parse_round_message(decoded, codec, limits));
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "swarm/api/codec.h"
#include "swarm/core/frame.h"
#include "swarm/core/status.h"
#include "swarm/wire/wire.h"

namespace swarm {

enum class RoundOp : uint8_t { join, begin, part, done, commit, abort, refuse };
std::string_view round_op_name(RoundOp op);

struct RoundMember {
  std::string peer_id;
  std::string address;
  friend bool operator==(const RoundMember&, const RoundMember&) = default;
};

// A CodecTable's members, type-erased, so the protocol itself is no template.
struct RoundCodec {
  CodecId codec = CodecId::none;
  Result<uint64_t> (*encoded_bytes)(CodecId, uint64_t) = nullptr;
  Status (*encode)(CodecId, std::span<const float>, std::span<std::byte>) = nullptr;
  Status (*decode)(CodecId, std::span<const std::byte>, std::span<float>) = nullptr;

  template <typename Codecs>
  static RoundCodec of(CodecId codec) {
    return {codec, [](CodecId id, uint64_t n) { return Codecs::encoded_bytes(id, n); },
            [](CodecId id, std::span<const float> v, std::span<std::byte> out) { return Codecs::encode(id, v, out); },
            [](CodecId id, std::span<const std::byte> in, std::span<float> v) { return Codecs::decode(id, in, v); }};
  }
  // Raw f32, without a codec table.
  static RoundCodec raw();

  Result<wire::Frame> encode_values(std::span<const float> values) const;
  Status decode_values(std::span<const std::byte> encoded, std::span<float> values) const;
};

struct RoundMessage {
  RoundOp op = RoundOp::join;
  int stage = 0;
  int64_t step = 0;
  std::string sender;
  std::string leader;   // the leader of the round it belongs to (every op but join names it)
  uint64_t group = 0;   // every op but join
  // join
  std::string address;  // the sender's control server
  // join: samples accumulated toward the step; done, and a PART's contribution
  // (phase 0): the samples the sender's contribution holds; commit: the group's total
  int64_t samples = 0;
  int64_t steps = 1;  // commit: the global steps the round counts for
  double samples_per_second = 0;
  uint64_t params_hash = 0;  // join, part, done: the sender's parameters at `step`
  // begin
  std::vector<RoundMember> members;
  // part: phase 0 a contribution to `part` from member `from`; phase 1 the averaged part from its owner
  int phase = 0;
  int part = 0;
  int chunk = 0;
  int from = 0;
  std::vector<float> values;  // decoded, finite
  // refuse, abort
  std::string reason;
  // refuse: the op and group refused
  RoundOp refused_op = RoundOp::join;
};

struct RoundMessageLimits {
  int max_members = 256;
  int64_t max_chunk_elements = 1 << 18;
  int64_t max_chunks = 1 << 16;
  size_t max_text = 4096;  // ids, addresses, reasons
  int64_t max_steps_per_round = 8;  // kMaxStepsPerRound
};

// The frames of `message`, its values (PART) encoded with `codec`.
Result<wire::Frames> encode_round_message(const RoundMessage& message, const RoundCodec& codec);
// A PART whose values are encoded already (the owner sends the same bytes to all).
Result<wire::Frames> encode_round_part(const RoundMessage& message, CodecId codec, int64_t count,
                                       wire::Frame payload);

// Checked: every field's type and range, ids and addresses bounded, a PART's
// values in the round's codec, of the size that codec gives its count, finite.
Result<RoundMessage> parse_round_message(const wire::DecodedMessage& message, const RoundCodec& codec,
                                         const RoundMessageLimits& limits);

}  // namespace swarm
