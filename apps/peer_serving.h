// peer_serving: what `swarm peer` hands its model once it has joined the swarm:
// the role's options and the PeerConfig built from them (swarm_roles.cc checks
// the options, joins the registry and builds it). The model makes its stages
// and serves them with serve_peer_with (peer_serving_impl.h) until a stop signal.
//
//   return model.serve(PeerServing{options, config, &registry, secured});
#pragma once

#include "apps/swarm_roles.h"
#include "swarm/peer/peer.h"
#include "swarm/registry/dht_registry.h"

namespace swarm::apps {

struct PeerServing {
  const PeerRoleOptions& options;
  PeerConfig config;
  DhtRegistry* registry = nullptr;
  bool secured = false;  // CURVE on the peer's sockets
};

}  // namespace swarm::apps
