// Puts a process of the program behind its own emulated access link (--link):
// every message it sends or receives over NetemTransport shares it.
#pragma once

#include <string>
#include <string_view>

#include "swarm/core/status.h"

namespace swarm::apps {

// `link` is RATE,LATENCY (netem::parse_link); `board` the file the processes of
// one run share (swarm local's links.board), or empty for a link of this
// process alone. `name` is what the board shows for it. Does nothing for an
// empty `link`.
Status join_access_link(std::string_view link, const std::string& board, std::string_view name);

}  // namespace swarm::apps
