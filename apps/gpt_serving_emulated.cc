// A GPT peer whose stage computes at an emulated device's pace (--emulated-device):
// the CPU stage's parameters and shapes, no arithmetic (models/emulated).
#include "apps/gpt_serving_impl.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/emulated/emulated_device_stage.h"

namespace swarm::apps {

int serve_gpt_emulated(const PeerServing& serving, const gpt::GptConfig& model, double flops_per_second) {
  using Stage = emulated::EmulatedDeviceStage<gpt::GptStage<CpuBackend>>;
  auto layouts = gpt::partition_layers(model, serving.options.num_stages);
  if (!layouts.is_ok()) {
    fmt::print(stderr, "swarm peer: {}\n", layouts.status().to_string());
    return 1;
  }
  StageFactory<Stage> make_stage = [model, layouts = *layouts, seed = serving.options.seed,
                                    flops_per_second](int index) -> Result<Stage> {
    const gpt::StageLayout& layout = layouts.at(static_cast<size_t>(index));
    SWARM_ASSIGN_OR_RETURN(auto inner, gpt::GptStage<CpuBackend>::create(model, layout, seed));
    const double forward = gpt::stage_forward_flops_per_token(model, layout);
    return Stage::create(std::move(inner), {.forward_flops_per_token = forward,
                                            .backward_flops_per_token = 2 * forward,
                                            .flops_per_second = flops_per_second});
  };
  return serve_peer_with<Stage>(serving, std::move(make_stage),
                                fmt::format("an emulated device of {:g} FLOP/s", flops_per_second));
}

}  // namespace swarm::apps
