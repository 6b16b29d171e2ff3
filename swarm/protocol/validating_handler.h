// validating_handler: the front door of every server. Decodes and checks each
// request (swarm/wire) before the application sees it, answers bad ones with
// an error reply, and counts them; the server keeps serving everyone else.
//
//   auto counters = std::make_shared<swarm::wire::ValidationCounters>();
//   server.serve(swarm::validating_handler(swarm::wire::Limits{}, counters,
//       [](const swarm::PeerIdentity& from, const swarm::wire::DecodedMessage& m) { return reply(m); }));
#pragma once

#include <functional>
#include <memory>

#include "swarm/wire/wire.h"
#include "swarm/api/transport.h"

namespace swarm {

using DecodedHandler = std::function<wire::Frames(const PeerIdentity& from, const wire::DecodedMessage& message)>;

inline RequestHandler validating_handler(wire::Limits limits,
                                         std::shared_ptr<wire::ValidationCounters> counters,
                                         DecodedHandler handler) {
  return [limits, counters = std::move(counters), handler = std::move(handler)](
             const PeerIdentity& from, wire::Frames request) -> wire::Frames {
    // The views point into `request`, which lives until the handler returns.
    auto decoded = wire::decode_message(request.views(), limits, *counters);
    if (!decoded.is_ok()) return wire::make_error_reply(0, 0, decoded.status());
    return handler(from, *decoded);
  };
}

}  // namespace swarm
