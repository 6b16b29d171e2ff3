// averaging_messages: the control part of averaging and state-transfer messages.
//
// Both travel as wire messages whose tensor 0 is a small JSON object (u8) and
// tensor 1, when present, the payload: f32 gradient values, or u8 state bytes.
// JSON keeps the control fields readable in a packet dump and extensible
// without a wire-version bump; the payload never goes through it.
//
//   SWARM_ASSIGN_OR_RETURN(auto frames, swarm::encode_control_message(kind, stage, id, meta, payload));
//   SWARM_ASSIGN_OR_RETURN(auto meta, swarm::control_json(decoded));
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "swarm/core/status.h"
#include "swarm/core/tensor.h"
#include "swarm/wire/wire.h"

namespace swarm {

// payload may be an empty view (no tensor 1). credential: the sender's certificate
// (wire::MessageHeader::credential), where the receiver asks for one.
Result<wire::Frames> encode_control_message(wire::MessageKind kind, uint32_t stage, uint64_t request_id,
                                            const nlohmann::json& meta, const TensorView* payload,
                                            std::string credential = {});

// Tensor 0 parsed as a JSON object; invalid_argument otherwise.
Result<nlohmann::json> control_json(const wire::DecodedMessage& message);

// A decoded message with the frames its views point into, kept alive together.
struct ReceivedMessage {
  wire::Frames frames;
  wire::DecodedMessage message;
};

// The reply of a call, decoded: the error it carries as a Status, a result as its message.
Result<ReceivedMessage> decode_result_reply(Result<wire::Frames> reply);

std::string hex64(uint64_t value);
Result<uint64_t> parse_hex64(const std::string& text);

}  // namespace swarm
