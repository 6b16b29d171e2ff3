#include "swarm/averaging/state_transfer.h"

namespace swarm {

Result<wire::Frames> encode_state_request(int stage, const nlohmann::json& meta, std::string credential) {
  return encode_control_message(wire::MessageKind::state_chunk, static_cast<uint32_t>(stage), 0, meta, nullptr,
                                std::move(credential));
}

wire::Frames StateDonor::handle(const wire::DecodedMessage& request, int stage, int64_t current_step,
                                const Snapshot& snapshot) {
  auto frames = answer(request, stage, current_step, snapshot);
  if (!frames.is_ok()) {
    refused_.fetch_add(1, std::memory_order_relaxed);
    return wire::make_error_reply(request.header.request_id, stage, frames.status());
  }
  return std::move(frames).value();
}

namespace {

// A chunk request's fields; any wrong type or range is invalid_argument, never an exception.
struct ChunkRequest {
  uint64_t hash = 0;
  int64_t offset = 0;
  int64_t length = 0;
};

// An integer field: nlohmann would silently truncate 0.5 or throw on "0".
Result<int64_t> integer_field(const nlohmann::json& meta, const char* key) {
  const auto it = meta.find(key);
  if (it == meta.end() || !it->is_number_integer()) return invalid_argument("field '{}' must be an integer", key);
  return it->get<int64_t>();
}

Result<uint64_t> hash_field(const nlohmann::json& meta) {
  const auto it = meta.find("hash");
  if (it == meta.end() || !it->is_string()) return invalid_argument("field 'hash' must be hex text");
  return parse_hex64(it->get<std::string>());
}

Result<ChunkRequest> parse_chunk_request(const nlohmann::json& meta) {
  ChunkRequest r;
  SWARM_ASSIGN_OR_RETURN(r.hash, hash_field(meta));
  SWARM_ASSIGN_OR_RETURN(r.offset, integer_field(meta, "offset"));
  SWARM_ASSIGN_OR_RETURN(r.length, integer_field(meta, "length"));
  return r;
}

// Subtraction, never offset + length: a forged offset near INT64_MAX must not wrap.
Status check_chunk_range(const ChunkRequest& r, int64_t state_bytes) {
  if (r.offset < 0 || r.length < 1 || r.offset > state_bytes || r.length > state_bytes - r.offset) {
    return invalid_argument("chunk [{}, +{}) is outside the state's {} bytes", r.offset, r.length, state_bytes);
  }
  return Status::ok();
}

std::string op_of(const nlohmann::json& meta) {
  const auto it = meta.find("op");
  return it != meta.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

Result<StateInfo> parse_state_info(const nlohmann::json& meta, int64_t max_bytes) {
  StateInfo info;
  SWARM_ASSIGN_OR_RETURN(info.step, integer_field(meta, "step"));
  SWARM_ASSIGN_OR_RETURN(info.bytes, integer_field(meta, "bytes"));
  SWARM_ASSIGN_OR_RETURN(info.hash, hash_field(meta));
  if (info.step < 0 || info.bytes < 0) return invalid_argument("state info: negative step or size");
  if (info.bytes > max_bytes) {
    return resource_exhausted("state info claims {} bytes, more than the {} this stage's state can be", info.bytes,
                              max_bytes);
  }
  return info;
}

Result<wire::Frames> StateDonor::answer(const wire::DecodedMessage& request, int stage, int64_t current_step,
                                        const Snapshot& snapshot) {
  SWARM_ASSIGN_OR_RETURN(nlohmann::json meta, control_json(request));
  const std::string op = op_of(meta);
  std::lock_guard lock(mu_);
  auto reply = [&](const nlohmann::json& out, const TensorView* payload) {
    return encode_control_message(wire::MessageKind::result, static_cast<uint32_t>(stage), request.header.request_id,
                                  out, payload);
  };
  if (op == "info") {
    if (step_ != current_step || bytes_.empty()) {
      SWARM_ASSIGN_OR_RETURN(Checkpoint state, snapshot());
      SWARM_ASSIGN_OR_RETURN(bytes_, encode_checkpoint(state));
      step_ = state.step;
      hash_ = XXH3_64bits(bytes_.data(), bytes_.size());
    }
    return reply({{"step", step_}, {"bytes", static_cast<int64_t>(bytes_.size())}, {"hash", hex64(hash_)}}, nullptr);
  }
  if (op == "chunk") {
    SWARM_ASSIGN_OR_RETURN(ChunkRequest chunk, parse_chunk_request(meta));
    if (chunk.hash != hash_ || bytes_.empty()) {
      return failed_precondition("this donor no longer holds that state (it moved on to step {})", current_step);
    }
    SWARM_RETURN_IF_ERROR(check_chunk_range(chunk, static_cast<int64_t>(bytes_.size())));
    TensorView payload(bytes_.data() + chunk.offset, DType::u8, Shape{chunk.length}, Device::cpu);
    SWARM_ASSIGN_OR_RETURN(wire::Frames frames, reply({{"offset", chunk.offset}}, &payload));
    ++chunks_served_;
    if (after_chunk) SWARM_RETURN_IF_ERROR(after_chunk(chunks_served_));
    return frames;
  }
  return invalid_argument("state request: unknown op '{}'", op);
}

Status check_finite(const Checkpoint& state) {
  for (const NamedTensor& named : state.tensors) {
    const Tensor& t = named.tensor;
    if (!t.defined()) return invalid_argument("state tensor {} is undefined", named.name);
    const DType dtype = t.dtype();
    if (dtype != DType::f32 && dtype != DType::f16 && dtype != DType::bf16) continue;
    // By the exponent bits: all ones is an infinity or a NaN, in all three formats.
    bool bad = false;
    if (dtype == DType::f32) {
      const auto* bits = static_cast<const uint32_t*>(t.raw_data());
      for (int64_t i = 0; i < t.numel(); ++i) bad |= (bits[i] & 0x7f800000u) == 0x7f800000u;
    } else {
      const uint16_t mask = dtype == DType::f16 ? 0x7c00 : 0x7f80;
      const auto* bits = static_cast<const uint16_t*>(t.raw_data());
      for (int64_t i = 0; i < t.numel(); ++i) bad |= (bits[i] & mask) == mask;
    }
    if (bad) return invalid_argument("state tensor {} holds a value that is not finite", named.name);
  }
  return Status::ok();
}

namespace state_transfer_detail {

void adopt_offer(Partial* partial, const StateInfo& offer, StateDownloadReport* report) {
  const bool resumable = !partial->bytes.empty();
  if (offer.hash != partial->hash || offer.bytes != partial->total) {
    // Another snapshot: what we have is of no use with it.
    if (resumable && report != nullptr) report->resumed_at = -1;
    partial->clear();
    partial->hash = offer.hash;
    partial->total = offer.bytes;
  } else if (resumable && report != nullptr) {
    report->resumed_at = static_cast<int64_t>(partial->bytes.size());
  }
}

Result<Checkpoint> accept_state(const Partial& partial, const StateInfo& info, const StateCheck& check,
                                const std::string& what) {
  if (XXH3_64bits(partial.bytes.data(), partial.bytes.size()) != partial.hash) {
    return data_loss("the bytes do not match the hash their donor announced");
  }
  SWARM_ASSIGN_OR_RETURN(Checkpoint state, decode_checkpoint(partial.bytes, what));
  if (state.step != info.step) {
    return data_loss("the state is of step {}; its donor announced step {}", state.step, info.step);
  }
  if (check.state) SWARM_RETURN_IF_ERROR(check.state(state));
  return state;
}

}  // namespace state_transfer_detail
}  // namespace swarm
