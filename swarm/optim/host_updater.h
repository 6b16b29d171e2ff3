// host_updater: the CPU model of ParameterUpdater, AdamW or LAMB over fp32
// parameters in host memory.
//
// The CUDA model (kernels/cuda/device_updater.h) runs the same arithmetic on the
// device; both export their state in swarm/optim's names, so a checkpoint moves
// between them.
//
//   swarm::optim::HostUpdater lamb(config, swarm::optim::Rule::lamb);
//   SWARM_RETURN_IF_ERROR(lamb.step_with_gradients(stage.parameter_views(), averaged, lr));
#pragma once

#include <span>
#include <variant>
#include <vector>

#include "swarm/api/updater.h"
#include "swarm/optim/optimizer.h"

namespace swarm::optim {

class HostUpdater {
 public:
  using updater_concept = updater_t;
  static constexpr Device device = Device::cpu;

  HostUpdater(const OptimizerConfig& config, Rule rule) {
    if (rule == Rule::adamw) {
      optimizer_.emplace<AdamW>(config);
    } else {
      optimizer_.emplace<Lamb>(config);
    }
  }

  Status step(std::span<const StageParameterView> params, float lr) {
    std::vector<ParamRef> refs;
    for (const auto& view : params) refs.push_back({view.name, view.value, view.grad, view.apply_weight_decay});
    return std::visit([&](auto& optimizer) { return optimizer.step(refs, lr); }, optimizer_);
  }

  Status step_with_gradients(std::span<const StageParameterView> params, std::span<const float> gradients, float lr) {
    std::vector<ParamRef> refs;
    size_t offset = 0;
    for (const auto& view : params) {
      const auto n = static_cast<size_t>(view.value.numel());
      if (n > gradients.size() - offset) {
        return invalid_argument("a gradient of {} values is too short for the stage", gradients.size());
      }
      TensorView grad(const_cast<float*>(gradients.data()) + offset, DType::f32, view.value.shape(), Device::cpu);
      refs.push_back({view.name, view.value, grad, view.apply_weight_decay});
      offset += n;
    }
    if (offset != gradients.size()) {
      return invalid_argument("a gradient of {} values for a stage of {}", gradients.size(), offset);
    }
    return std::visit([&](auto& optimizer) { return optimizer.step(refs, lr); }, optimizer_);
  }

  int64_t steps_taken() const {
    return std::visit([](const auto& optimizer) { return optimizer.steps_taken(); }, optimizer_);
  }
  Result<OptimizerState> export_state() const {
    return std::visit([](const auto& optimizer) { return optimizer.export_state(); }, optimizer_);
  }
  Status import_state(const OptimizerState& state) {
    return std::visit([&](auto& optimizer) { return optimizer.import_state(state); }, optimizer_);
  }

 private:
  std::variant<AdamW, Lamb> optimizer_{std::in_place_type<Lamb>, OptimizerConfig{}};
};

static_assert(ParameterUpdater<HostUpdater>);

}  // namespace swarm::optim
