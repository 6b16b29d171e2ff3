// peer_serving_impl: the serving loop of `swarm peer` as a template over the
// stage's backend; included only by the translation units that instantiate it.
#pragma once

#include <unistd.h>

#include <fmt/core.h>

#include "apps/peer_serving.h"
#include "models/gpt/gpt_stage.h"
#include "swarm/compression/codecs.h"
#include "swarm/peer/peer.h"
#include "transports/zmq/zmq_transport.h"

namespace swarm::apps {

template <Backend B>
int serve_peer_on(const PeerServing& serving) {
  using Stage = gpt::GptStage<B>;
  using GptPeer = Peer<Stage, ZmqTransport, DhtRegistry, compression::StandardCodecs>;
  const PeerRoleOptions& options = serving.options;
  const PeerConfig& config = serving.config;
  StageFactory<Stage> make_stage = [&options, layouts = serving.layouts](int index) {
    return Stage::create(options.model, layouts[index], options.seed);
  };
  GptPeer peer(config, make_stage, serving.registry);
  Status started = peer.start();
  if (!started.is_ok()) {
    fmt::print(stderr, "swarm peer: {}\n", started.to_string());
    return 1;
  }
  fmt::print("peer {} serving stage {} of {} at {} on {}{}{}\n", config.peer_id, config.stage_index,
             options.num_stages, peer.address(), describe(*parse_compute(options.compute)),
             serving.secured ? " (CURVE)" : "",
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
