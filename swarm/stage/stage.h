// stage: the Stage concept, one model partition that a swarm of peers serves.
//
// A stage turns an input tensor into an output tensor, and on backward turns
// (input, output gradient) into the input gradient, recomputing its forward as
// needed so that any peer can serve any backward. The last stage takes the
// targets and outputs the loss. Users bring their own model by writing a type
// that opts in with `using stage_concept = swarm::stage_t;` (see models/mlp).
//
//   template <swarm::Stage S>
//   swarm::Result<swarm::Tensor> run(S& stage, const swarm::TensorView& x) {
//     return stage.forward(x, nullptr);
//   }
#pragma once

#include <concepts>
#include <string>
#include <vector>

#include "swarm/core/status.h"
#include "swarm/core/tensor.h"

namespace swarm {

struct stage_t {};

// What an optimizer needs of one parameter; the stage owns the memory.
struct StageParameterView {
  std::string name;
  TensorView value;
  TensorView grad;
  bool apply_weight_decay = true;
};

template <typename S>
concept Stage =
    std::same_as<typename S::stage_concept, stage_t> &&
    requires(S stage, const S& const_stage, const TensorView& input, const TensorView* targets,
             const TensorView& grad_output) {
      // Output, or for a stage that takes targets, the mean loss as f32 [1].
      { stage.forward(input, targets) } -> std::same_as<Result<Tensor>>;
      // Input gradient (an undefined Tensor when the input is not differentiable,
      // like tokens); adds the parameter gradients into the stage's accumulators.
      { stage.backward(input, grad_output, targets) } -> std::same_as<Result<Tensor>>;
      { stage.parameter_views() } -> std::same_as<std::vector<StageParameterView>>;
      { stage.zero_grad() } -> std::same_as<Status>;
      { const_stage.takes_targets() } -> std::same_as<bool>;
    };

}  // namespace swarm
