// A GPT peer whose stage computes at an emulated device's pace (--emulated-device):
// the CPU stage's parameters and shapes, no arithmetic (models/emulated).
#include "apps/gpt_serving_impl.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/emulated/emulated_device_stage.h"

namespace swarm::apps {

int serve_gpt_emulated(const PeerServing& serving, const gpt::GptConfig& model, double flops_per_second) {
  using Stage = emulated::EmulatedDeviceStage<gpt::GptStage<CpuBackend>>;
  auto make = [model, seed = serving.options.seed, flops_per_second](const gpt::StageLayout& layout) -> Result<Stage> {
    SWARM_ASSIGN_OR_RETURN(auto inner, gpt::GptStage<CpuBackend>::create(model, layout, seed));
    const double forward = gpt::stage_forward_flops_per_token(model, layout);
    return Stage::create(std::move(inner), {.forward_flops_per_token = forward,
                                            .backward_flops_per_token = 2 * forward,
                                            .flops_per_second = flops_per_second});
  };
  return serve_gpt_layouts<Stage>(serving, model, std::move(make),
                                  fmt::format("an emulated device of {:g} FLOP/s", flops_per_second));
}

}  // namespace swarm::apps
