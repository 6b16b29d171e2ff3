// ids: the names the runtime gives peers and calls.
//
// PeerId is what a peer calls itself in registry records and routing; PeerIdentity
// is who a transport authenticated (never what a payload claims).
#pragma once

#include <cstdint>
#include <string>

namespace swarm {

using PeerId = std::string;
using CallId = uint64_t;

struct PeerIdentity {
  std::string id;
  friend bool operator==(const PeerIdentity&, const PeerIdentity&) = default;
};

}  // namespace swarm
