// The one instantiation of the serving loop, and so of the Peer, over AnyStage.
#include "apps/any_stage_serving.h"

#include <cstdio>

#include <fmt/core.h>

#include "apps/compute_options.h"
#include "apps/peer_serving_impl.h"

namespace swarm::apps {

int serve_cpu_stages(const PeerServing& serving, const std::string& model_name, AnyStageFactory make_stage) {
  auto backend = parse_compute(serving.options.compute);
  if (!backend.is_ok() || *backend != ComputeBackend::cpu_fp32) {
    fmt::print(stderr, "swarm peer: model {} computes on the CPU (fp32) only\n", model_name);
    return 2;
  }
  StageFactory<AnyStage> make = [make_stage = std::move(make_stage), seed = serving.options.seed](int stage) {
    return make_stage(stage, seed);
  };
  return serve_peer_with<AnyStage>(serving, std::move(make), describe(*backend));
}

}  // namespace swarm::apps
