#include "swarm/averaging/state_transfer.h"

namespace swarm {

Result<wire::Frames> encode_state_request(int stage, const nlohmann::json& meta) {
  return encode_control_message(wire::MessageKind::state_chunk, static_cast<uint32_t>(stage), 0, meta, nullptr);
}

wire::Frames StateDonor::handle(const wire::DecodedMessage& request, int stage, int64_t current_step,
                                const Snapshot& snapshot) {
  auto frames = answer(request, stage, current_step, snapshot);
  if (!frames.is_ok()) return wire::make_error_reply(request.header.request_id, stage, frames.status());
  return std::move(frames).value();
}

Result<wire::Frames> StateDonor::answer(const wire::DecodedMessage& request, int stage, int64_t current_step,
                                        const Snapshot& snapshot) {
  SWARM_ASSIGN_OR_RETURN(nlohmann::json meta, control_json(request));
  const std::string op = meta.value("op", "");
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
    auto hash = parse_hex64(meta.value("hash", ""));
    const int64_t offset = meta.value("offset", int64_t{-1});
    const int64_t length = meta.value("length", int64_t{-1});
    if (!hash.is_ok() || *hash != hash_ || bytes_.empty()) {
      return failed_precondition("this donor no longer holds that state (it moved on to step {})", current_step);
    }
    if (offset < 0 || length < 1 || offset + length > static_cast<int64_t>(bytes_.size())) {
      return invalid_argument("chunk [{}, +{}) is outside the state's {} bytes", offset, length, bytes_.size());
    }
    TensorView payload(bytes_.data() + offset, DType::u8, Shape{length}, Device::cpu);
    SWARM_ASSIGN_OR_RETURN(wire::Frames frames, reply({{"offset", offset}}, &payload));
    ++chunks_served_;
    if (after_chunk) SWARM_RETURN_IF_ERROR(after_chunk(chunks_served_));
    return frames;
  }
  return invalid_argument("state request: unknown op '{}'", op);
}

}  // namespace swarm
