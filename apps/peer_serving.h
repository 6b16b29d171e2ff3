// peer_serving: `swarm peer`'s serving loop over the backend --device chose. The
// role (swarm_roles.cc) checks the options, joins the registry and builds the
// PeerConfig; this part makes the stages on the backend, serves and reports
// until a stop signal. The CPU instantiation and the CUDA ones compile in
// their own translation units (peer_serving_cpu.cc, peer_serving_cuda.cc).
//
//   return serve_peer(backend, PeerServing{options, layouts, config, &registry, secured});
#pragma once

#include <vector>

#include "apps/compute_options.h"
#include "apps/swarm_roles.h"
#include "models/gpt/config.h"
#include "swarm/peer/peer.h"
#include "swarm/registry/dht_registry.h"

namespace swarm::apps {

struct PeerServing {
  const PeerRoleOptions& options;
  std::vector<gpt::StageLayout> layouts;
  PeerConfig config;
  DhtRegistry* registry = nullptr;
  bool secured = false;  // CURVE on the peer's sockets
};

// Returns the process's exit status.
int serve_peer(ComputeBackend backend, const PeerServing& serving);
int serve_peer_cpu(const PeerServing& serving);
int serve_peer_cuda(ComputeBackend backend, const PeerServing& serving);

}  // namespace swarm::apps
