// gpt_serving_impl: a GPT peer on backend B; included only by the translation
// units that instantiate it (gpt_serving_cpu.cc, gpt_serving_cuda.cc).
#pragma once

#include <fmt/core.h>

#include "apps/gpt_model.h"
#include "apps/peer_serving_impl.h"
#include "models/gpt/gpt_stage.h"

namespace swarm::apps {

template <Backend B>
int serve_gpt_on(const PeerServing& serving, const gpt::GptConfig& model, ComputeBackend backend) {
  using Stage = gpt::GptStage<B>;
  auto layouts = gpt::partition_layers(model, serving.options.num_stages);
  if (!layouts.is_ok()) {
    fmt::print(stderr, "swarm peer: {}\n", layouts.status().to_string());
    return 1;
  }
  StageFactory<Stage> make_stage = [model, layouts = *layouts, seed = serving.options.seed](int index) {
    return Stage::create(model, layouts[index], seed);
  };
  return serve_peer_with<Stage>(serving, std::move(make_stage), describe(backend));
}

}  // namespace swarm::apps
