#include "swarm/averaging/round_messages.h"

#include <bit>
#include <cmath>
#include <cstring>

#include <nlohmann/json.hpp>

#include "swarm/averaging/averaging_messages.h"

namespace swarm {

namespace {

constexpr std::string_view kOpNames[] = {"join", "begin", "part", "done", "commit", "abort", "refuse"};

Result<RoundOp> op_from_name(const std::string& name) {
  for (size_t i = 0; i < std::size(kOpNames); ++i) {
    if (kOpNames[i] == name) return static_cast<RoundOp>(i);
  }
  return invalid_argument("round message: unknown op '{}'", name.substr(0, 32));
}

Result<uint64_t> raw_bytes(CodecId codec, uint64_t n) {
  if (codec != CodecId::none) return invalid_argument("codec {} needs a codec table", codec_name(codec));
  if (n > UINT64_MAX / sizeof(float)) return invalid_argument("{} f32 values overflow", n);
  return n * sizeof(float);
}
Status raw_encode(CodecId codec, std::span<const float> values, std::span<std::byte> out) {
  SWARM_ASSIGN_OR_RETURN(uint64_t bytes, raw_bytes(codec, values.size()));
  if (out.size() != bytes) return invalid_argument("{} bytes for {} f32 values", out.size(), values.size());
  if (!values.empty()) std::memcpy(out.data(), values.data(), bytes);
  return Status::ok();
}
Status raw_decode(CodecId codec, std::span<const std::byte> in, std::span<float> values) {
  SWARM_ASSIGN_OR_RETURN(uint64_t bytes, raw_bytes(codec, values.size()));
  if (in.size() != bytes) return invalid_argument("{} bytes for {} f32 values", in.size(), values.size());
  if (!values.empty()) std::memcpy(values.data(), in.data(), bytes);
  return Status::ok();
}

// JSON fields by type: nlohmann would turn 1.5 into 1, or 2^64-1 into -1, silently.
Result<int64_t> integer(const nlohmann::json& j, const char* key, int64_t lo, int64_t hi) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer() ||
      (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))) {
    return invalid_argument("round message: '{}' must be a 64-bit integer", key);
  }
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi) return invalid_argument("round message: '{}' {} is outside [{}, {}]", key, v, lo, hi);
  return v;
}

Result<double> number(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return invalid_argument("round message: '{}' must be a number", key);
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < 0) return invalid_argument("round message: '{}' must be finite and >= 0", key);
  return v;
}

Result<std::string> text(const nlohmann::json& j, const char* key, size_t max, bool non_empty) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return invalid_argument("round message: '{}' must be text", key);
  std::string s = it->get<std::string>();
  if (s.size() > max) return invalid_argument("round message: '{}' is longer than {} bytes", key, max);
  if (non_empty && s.empty()) return invalid_argument("round message: '{}' is empty", key);
  return s;
}

Result<uint64_t> hash_field(const nlohmann::json& j, const char* key) {
  SWARM_ASSIGN_OR_RETURN(std::string s, text(j, key, 16, true));
  return parse_hex64(s);
}

nlohmann::json control_fields(const RoundMessage& m) {
  nlohmann::json j = {{"op", kOpNames[static_cast<size_t>(m.op)]}, {"step", m.step}, {"sender", m.sender}};
  switch (m.op) {
    case RoundOp::join:
      j["address"] = m.address;
      j["samples"] = m.samples;
      j["rate"] = m.samples_per_second;
      j["hash"] = hex64(m.params_hash);
      return j;
    case RoundOp::begin: {
      nlohmann::json members = nlohmann::json::array();
      for (const auto& member : m.members) members.push_back({member.peer_id, member.address});
      j["members"] = std::move(members);
      break;
    }
    case RoundOp::part:
      j["phase"] = m.phase;
      j["part"] = m.part;
      j["chunk"] = m.chunk;
      j["from"] = m.from;
      j["hash"] = hex64(m.params_hash);
      j["samples"] = m.samples;
      break;
    case RoundOp::done:
      j["hash"] = hex64(m.params_hash);
      j["samples"] = m.samples;
      break;
    case RoundOp::commit:
      j["samples"] = m.samples;
      j["steps"] = m.steps;
      break;
    case RoundOp::abort:
      j["reason"] = m.reason;
      break;
    case RoundOp::refuse:
      j["reason"] = m.reason;
      j["refused"] = kOpNames[static_cast<size_t>(m.refused_op)];
      break;
  }
  j["leader"] = m.leader;
  j["group"] = hex64(m.group);
  return j;
}

Status read_members(const nlohmann::json& j, const RoundMessageLimits& limits, RoundMessage* m) {
  const auto it = j.find("members");
  if (it == j.end() || !it->is_array() || it->empty() || it->size() > static_cast<size_t>(limits.max_members)) {
    return invalid_argument("round message: 'members' must be 1 to {} entries", limits.max_members);
  }
  for (const auto& entry : *it) {
    if (!entry.is_array() || entry.size() != 2 || !entry[0].is_string() || !entry[1].is_string()) {
      return invalid_argument("round message: each member must be [id, address]");
    }
    RoundMember member{entry[0].get<std::string>(), entry[1].get<std::string>()};
    if (member.peer_id.empty() || member.peer_id.size() > limits.max_text || member.address.size() > limits.max_text) {
      return invalid_argument("round message: a member with a bad id or address");
    }
    if (!m->members.empty() && !(m->members.back().peer_id < member.peer_id)) {
      return invalid_argument("round message: members must be ordered by id, each once");
    }
    m->members.push_back(std::move(member));
  }
  return Status::ok();
}

Status read_op_fields(const nlohmann::json& j, const RoundMessageLimits& limits, RoundMessage* m) {
  switch (m->op) {
    case RoundOp::join: {
      SWARM_ASSIGN_OR_RETURN(m->address, text(j, "address", limits.max_text, true));
      SWARM_ASSIGN_OR_RETURN(m->samples, integer(j, "samples", 0, INT64_MAX));
      SWARM_ASSIGN_OR_RETURN(m->samples_per_second, number(j, "rate"));
      SWARM_ASSIGN_OR_RETURN(m->params_hash, hash_field(j, "hash"));
      return Status::ok();
    }
    case RoundOp::begin:
      return read_members(j, limits, m);
    case RoundOp::part: {
      SWARM_ASSIGN_OR_RETURN(int64_t phase, integer(j, "phase", 0, 1));
      SWARM_ASSIGN_OR_RETURN(int64_t part, integer(j, "part", 0, limits.max_members - 1));
      SWARM_ASSIGN_OR_RETURN(int64_t chunk, integer(j, "chunk", 0, limits.max_chunks - 1));
      SWARM_ASSIGN_OR_RETURN(int64_t from, integer(j, "from", 0, limits.max_members - 1));
      // Phase 0 goes to the part's owner from someone else; phase 1 comes from the owner.
      if ((phase == 0) == (part == from)) {
        return invalid_argument("round message: phase {} part {} cannot come from member {}", phase, part, from);
      }
      m->phase = static_cast<int>(phase);
      m->part = static_cast<int>(part);
      m->chunk = static_cast<int>(chunk);
      m->from = static_cast<int>(from);
      SWARM_ASSIGN_OR_RETURN(m->params_hash, hash_field(j, "hash"));
      SWARM_ASSIGN_OR_RETURN(m->samples, integer(j, "samples", 0, INT64_MAX));
      return Status::ok();
    }
    case RoundOp::done: {
      SWARM_ASSIGN_OR_RETURN(m->params_hash, hash_field(j, "hash"));
      SWARM_ASSIGN_OR_RETURN(m->samples, integer(j, "samples", 0, INT64_MAX));
      return Status::ok();
    }
    case RoundOp::commit: {
      SWARM_ASSIGN_OR_RETURN(m->samples, integer(j, "samples", 0, INT64_MAX));
      SWARM_ASSIGN_OR_RETURN(m->steps, integer(j, "steps", 1, limits.max_steps_per_round));
      return Status::ok();
    }
    case RoundOp::abort: {
      SWARM_ASSIGN_OR_RETURN(m->reason, text(j, "reason", limits.max_text, false));
      return Status::ok();
    }
    case RoundOp::refuse: {
      SWARM_ASSIGN_OR_RETURN(m->reason, text(j, "reason", limits.max_text, false));
      SWARM_ASSIGN_OR_RETURN(std::string refused, text(j, "refused", 16, true));
      SWARM_ASSIGN_OR_RETURN(m->refused_op, op_from_name(refused));
      return Status::ok();
    }
  }
  return invalid_argument("round message: unknown op");
}

Status read_values(const wire::DecodedMessage& message, const RoundCodec& codec, const RoundMessageLimits& limits,
                   RoundMessage* m) {
  if (message.tensors.size() != 2 || message.tensors[1].dtype != DType::f32 || message.tensors[1].shape.rank() != 1) {
    return invalid_argument("round part: tensor 1 must be f32 values");
  }
  const wire::DecodedTensor& values = message.tensors[1];
  if (values.codec != codec.codec) {
    return invalid_argument("round part in codec {}; the parts of this stage travel in {}", codec_name(values.codec),
                            codec_name(codec.codec));
  }
  const int64_t count = values.shape[0];
  if (count < 0 || count > limits.max_chunk_elements) {
    return invalid_argument("round part of {} values; a chunk holds at most {}", count, limits.max_chunk_elements);
  }
  SWARM_ASSIGN_OR_RETURN(uint64_t expected, codec.encoded_bytes(values.codec, static_cast<uint64_t>(count)));
  if (values.payload.size() != expected) {
    return invalid_argument("round part: {} payload bytes; {} values in codec {} take {}", values.payload.size(), count,
                            codec_name(values.codec), expected);
  }
  m->values.resize(static_cast<size_t>(count));
  SWARM_RETURN_IF_ERROR(codec.decode_values(std::as_bytes(std::span<const char>(values.payload.data(),
                                                                                 values.payload.size())),
                                            m->values));
  // The codecs promise finite values; a table that breaks the promise must not
  // put a NaN into every replica.
  for (float v : m->values) {
    if ((std::bit_cast<uint32_t>(v) & 0x7f800000u) == 0x7f800000u) {
      return invalid_argument("round part: codec {} decoded a value that is not finite", codec_name(values.codec));
    }
  }
  return Status::ok();
}

}  // namespace

std::string_view round_op_name(RoundOp op) {
  const auto i = static_cast<size_t>(op);
  return i < std::size(kOpNames) ? kOpNames[i] : "unknown";
}

RoundCodec RoundCodec::raw() { return {CodecId::none, &raw_bytes, &raw_encode, &raw_decode}; }

Result<wire::Frame> RoundCodec::encode_values(std::span<const float> values) const {
  SWARM_ASSIGN_OR_RETURN(uint64_t bytes, encoded_bytes(codec, values.size()));
  std::string buffer(static_cast<size_t>(bytes), '\0');
  SWARM_RETURN_IF_ERROR(encode(codec, values, std::as_writable_bytes(std::span<char>(buffer))));
  return wire::Frame(std::move(buffer));
}

Status RoundCodec::decode_values(std::span<const std::byte> encoded, std::span<float> values) const {
  return decode(codec, encoded, values);
}

Result<wire::Frames> encode_round_part(const RoundMessage& message, CodecId codec, int64_t count,
                                       wire::Frame payload) {
  std::string meta = control_fields(message).dump();
  const int64_t meta_size = static_cast<int64_t>(meta.size());
  wire::MessageHeader header;
  header.kind = wire::MessageKind::allreduce_part;
  header.stage = static_cast<uint32_t>(message.stage);
  const wire::EncodedTensor tensors[] = {
      {DType::u8, wire::Codec::none, {meta_size}, wire::Frame(std::move(meta))},
      {DType::f32, codec, {count}, std::move(payload)},
  };
  return wire::encode_message_payloads(header, tensors);
}

Result<wire::Frames> encode_round_message(const RoundMessage& message, const RoundCodec& codec) {
  if (message.op == RoundOp::part) {
    SWARM_ASSIGN_OR_RETURN(wire::Frame payload, codec.encode_values(message.values));
    return encode_round_part(message, codec.codec, static_cast<int64_t>(message.values.size()), std::move(payload));
  }
  return encode_control_message(wire::MessageKind::allreduce_part, static_cast<uint32_t>(message.stage), 0,
                                control_fields(message), nullptr);
}

Result<RoundMessage> parse_round_message(const wire::DecodedMessage& message, const RoundCodec& codec,
                                         const RoundMessageLimits& limits) {
  if (message.header.kind != wire::MessageKind::allreduce_part) {
    return invalid_argument("round message: wire kind {} is not a round message",
                            static_cast<unsigned>(message.header.kind));
  }
  SWARM_ASSIGN_OR_RETURN(nlohmann::json j, control_json(message));
  try {
    RoundMessage m;
    m.stage = static_cast<int>(message.header.stage);
    SWARM_ASSIGN_OR_RETURN(std::string op, text(j, "op", 16, true));
    SWARM_ASSIGN_OR_RETURN(m.op, op_from_name(op));
    SWARM_ASSIGN_OR_RETURN(m.step, integer(j, "step", 0, INT64_MAX));
    SWARM_ASSIGN_OR_RETURN(m.sender, text(j, "sender", limits.max_text, true));
    if (m.op != RoundOp::join) {
      SWARM_ASSIGN_OR_RETURN(m.leader, text(j, "leader", limits.max_text, true));
      SWARM_ASSIGN_OR_RETURN(m.group, hash_field(j, "group"));
    }
    SWARM_RETURN_IF_ERROR(read_op_fields(j, limits, &m));
    if (m.op == RoundOp::part) {
      SWARM_RETURN_IF_ERROR(read_values(message, codec, limits, &m));
    } else if (message.tensors.size() != 1) {
      return invalid_argument("round message {}: carries {} tensors, expected 1", op, message.tensors.size());
    }
    return m;
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument("malformed round message: {}", e.what());
  }
}

}  // namespace swarm
