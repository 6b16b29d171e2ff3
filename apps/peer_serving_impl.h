// peer_serving_impl: the serving loop of `swarm peer` as a template over the
// stage type; included by the translation units that instantiate it (a model's
// plug-in: apps/cli/model.h, and the GPT's per-backend units).
#pragma once

#include <cstdio>
#include <string>

#include <fmt/core.h>

#include "apps/compute_options.h"
#include "apps/peer_serving.h"
#include "swarm/compression/codecs.h"
#include "swarm/peer/peer.h"
#include "transports/netem/netem_transport.h"
#include "transports/zmq/zmq_transport.h"

namespace swarm::apps {

// Serves stages `make_stage` builds (any stage index: a rebalancing peer moves)
// until a stop signal, with a line of progress every 5 s; the exit status.
template <Stage S>
int serve_peer_with(const PeerServing& serving, StageFactory<S> make_stage, const std::string& compute) {
  // Over ZeroMQ, behind the process's emulated access link where --link names one.
  using ServingPeer = Peer<S, NetemTransport<ZmqTransport>, DhtRegistry, compression::StandardCodecs>;
  const PeerRoleOptions& options = serving.options;
  const PeerConfig& config = serving.config;
  ServingPeer peer(config, std::move(make_stage), serving.registry);
  Status started = peer.start();
  if (!started.is_ok()) {
    fmt::print(stderr, "swarm peer: {}\n", started.to_string());
    return 1;
  }
  fmt::print("peer {} serving stage {} of {} at {} on {}{}{}\n", config.peer_id, config.stage_index,
             options.num_stages, peer.address(), compute, serving.secured ? " (CURVE)" : "",
             config.rebalance_period_seconds > 0
                 ? fmt::format(", rebalancing every {:g} s", config.rebalance_period_seconds)
                 : std::string());
  std::fflush(stdout);
  while (!wait_for_stop(5)) {
    PeerStats stats = peer.stats();
    fmt::print("peer {}: stage {}, {} forward, {} backward, {} steps, {:.1f} samples/s, global step {}, params "
               "{:016x}{}\n",
               config.peer_id, stats.stage, stats.forward, stats.backward, stats.optimizer_steps, stats.throughput,
               stats.global_step, stats.params_hash, stats.serving ? "" : " (re-syncing)");
    std::fflush(stdout);
  }
  peer.stop();
  return 0;
}

}  // namespace swarm::apps
