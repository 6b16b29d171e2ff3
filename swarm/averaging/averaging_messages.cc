#include "swarm/averaging/averaging_messages.h"

#include <vector>

namespace swarm {

Result<wire::Frames> encode_control_message(wire::MessageKind kind, uint32_t stage, uint64_t request_id,
                                            const nlohmann::json& meta, const TensorView* payload,
                                            std::string credential) {
  const std::string text = meta.dump();
  TensorView meta_view(const_cast<char*>(text.data()), DType::u8,
                       Shape{static_cast<int64_t>(text.size())}, Device::cpu);
  wire::MessageHeader header;
  header.kind = kind;
  header.stage = stage;
  header.request_id = request_id;
  header.credential = std::move(credential);
  std::vector<TensorView> views{meta_view};
  if (payload != nullptr) views.push_back(*payload);
  return wire::encode_message(header, views);
}

Result<nlohmann::json> control_json(const wire::DecodedMessage& message) {
  if (message.tensors.empty() || message.tensors[0].dtype != DType::u8 || message.tensors[0].shape.rank() != 1) {
    return invalid_argument("control message: tensor 0 must be u8 JSON");
  }
  auto j = nlohmann::json::parse(message.tensors[0].payload, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument("control message: tensor 0 is not a JSON object");
  return j;
}

Result<ReceivedMessage> decode_result_reply(Result<wire::Frames> reply) {
  if (!reply.is_ok()) return reply.status();
  ReceivedMessage out{std::move(reply).value(), {}};
  // Frames share their buffers: moving them above left the bytes where they were.
  SWARM_ASSIGN_OR_RETURN(out.message, wire::decode_message(out.frames.views(), wire::Limits{}));
  if (out.message.header.kind == wire::MessageKind::error) return wire::status_from_error_reply(out.message.header);
  if (out.message.header.kind != wire::MessageKind::result) return internal("unexpected reply kind");
  return out;
}

std::string hex64(uint64_t value) { return fmt::format("{:016x}", value); }

Result<uint64_t> parse_hex64(const std::string& text) {
  if (text.empty() || text.size() > 16) return invalid_argument("bad hex64 '{}'", text);
  uint64_t value = 0;
  for (char c : text) {
    const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (digit < 0) return invalid_argument("bad hex64 '{}'", text);
    value = value << 4 | static_cast<uint64_t>(digit);
  }
  return value;
}

}  // namespace swarm
