// updater: the ParameterUpdater concept, one optimizer (AdamW or LAMB, with its
// moments) stepping a stage's parameters on the device that holds them.
//
// A replica's parameters, gradient accumulators and optimizer moments live where
// its stage computes. The runtime (swarm/peer's Replica, swarm train) never
// touches them directly: it hands the stage's parameter views to an updater,
// which steps the fp32 master weights in place, either
//   - step: from the accumulated gradients themselves (view.grad), or
//   - step_with_gradients: from one gradient given on the host, concatenated in
//     parameter order (the averaged gradient of an all-reduce round).
// Both clip by the global gradient norm. A step the updater refuses (a
// non-finite norm, bad shapes) changes no weight and no moment.
// The state crosses checkpoints and state downloads as host tensors named as
// swarm/optim exports them, so a state saved on one device loads on another.
//
// An updater opts in with `using updater_concept = swarm::updater_t;`, names its
// device as `static constexpr Device device`, and is built from an
// optim::OptimizerConfig and an optim::Rule.
//
//   static_assert(swarm::ParameterUpdater<swarm::optim::HostUpdater>);
//   SWARM_RETURN_IF_ERROR(lamb.step_with_gradients(stage.parameter_views(), averaged, lr));
#pragma once

#include <concepts>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "swarm/api/stage.h"
#include "swarm/core/status.h"
#include "swarm/core/tensor.h"

namespace swarm {

struct updater_t {};

using OptimizerState = std::vector<std::pair<std::string, Tensor>>;

template <typename U>
concept ParameterUpdater =
    std::same_as<typename U::updater_concept, updater_t> &&
    requires(U& updater, const U& const_updater, std::span<const StageParameterView> params,
             std::span<const float> gradients, float lr, const OptimizerState& state) {
      { U::device } -> std::convertible_to<Device>;
      { updater.step(params, lr) } -> std::same_as<Status>;
      { updater.step_with_gradients(params, gradients, lr) } -> std::same_as<Status>;
      { const_updater.steps_taken() } -> std::same_as<int64_t>;
      { const_updater.export_state() } -> std::same_as<Result<OptimizerState>>;
      { updater.import_state(state) } -> std::same_as<Status>;
    };

// A mixin for stages over a backend B: the stage names B's updater when B has
// one (the CUDA backends do), so a runtime steps it on B's device.
template <typename B>
struct names_backend_updater {};
template <typename B>
  requires requires { typename B::updater_type; }
struct names_backend_updater<B> {
  using updater_type = typename B::updater_type;
};

}  // namespace swarm
