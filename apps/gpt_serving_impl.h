// gpt_serving_impl: a GPT peer on backend B; included only by the translation
// units that instantiate it (gpt_serving_cpu.cc, gpt_serving_cuda.cc).
#pragma once

#include <fmt/core.h>

#include "apps/gpt_model.h"
#include "apps/peer_serving_impl.h"
#include "models/gpt/gpt_stage.h"

namespace swarm::apps {

// Serves the stages `make(layout)` builds for each layout of the model's split.
template <typename Stage, typename Make>
int serve_gpt_layouts(const PeerServing& serving, const gpt::GptConfig& model, Make make,
                      const std::string& compute) {
  auto layouts = gpt::partition_layers(model, serving.options.num_stages);
  if (!layouts.is_ok()) {
    fmt::print(stderr, "swarm peer: {}\n", layouts.status().to_string());
    return 1;
  }
  StageFactory<Stage> make_stage = [layouts = *layouts, make = std::move(make)](int index) -> Result<Stage> {
    return make(layouts.at(static_cast<size_t>(index)));
  };
  return serve_peer_with<Stage>(serving, std::move(make_stage), compute);
}

template <Backend B>
int serve_gpt_on(const PeerServing& serving, const gpt::GptConfig& model, ComputeBackend backend) {
  using Stage = gpt::GptStage<B>;
  auto make = [model, seed = serving.options.seed](const gpt::StageLayout& layout) {
    return Stage::create(model, layout, seed);
  };
  return serve_gpt_layouts<Stage>(serving, model, std::move(make), describe(backend));
}

}  // namespace swarm::apps
