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
#include <optional>
#include <string>
#include <vector>

#include "swarm/core/status.h"
#include "swarm/core/tensor.h"

namespace swarm {

struct stage_t {};

// A tensor a stage takes or returns: its dtype and dims, where -1 matches any size
// (batch, sequence). The wire checks requests against it before any compute.
struct TensorSpec {
  DType dtype = DType::f32;
  std::vector<int64_t> dims;
  friend bool operator==(const TensorSpec&, const TensorSpec&) = default;
};

// Whether a tensor of this dtype and shape is one `spec` admits.
inline bool admits(const TensorSpec& spec, DType dtype, const Shape& shape) {
  if (dtype != spec.dtype || shape.rank() != static_cast<int>(spec.dims.size())) return false;
  for (int i = 0; i < shape.rank(); ++i) {
    if (spec.dims[i] != -1 && spec.dims[i] != shape[i]) return false;
  }
  return true;
}

// Whether what one stage returns can be what the next one takes: the same dtype and
// rank, and every size both fix agrees (the batch and sequence are -1 on both).
inline bool fits(const TensorSpec& output, const TensorSpec& input) {
  if (output.dtype != input.dtype || output.dims.size() != input.dims.size()) return false;
  for (size_t i = 0; i < output.dims.size(); ++i) {
    if (output.dims[i] != -1 && input.dims[i] != -1 && output.dims[i] != input.dims[i]) return false;
  }
  return true;
}

// "f32 [-1, 32]", for errors.
inline std::string describe(const TensorSpec& spec) {
  std::string text = std::string(dtype_name(spec.dtype)) + " [";
  for (size_t i = 0; i < spec.dims.size(); ++i) text += (i ? ", " : "") + std::to_string(spec.dims[i]);
  return text + "]";
}

// What goes in and comes out: the input, the targets of a stage that computes the
// loss, and the output (the loss, f32 [1], for such a stage). A loss stage may also
// report metrics of the same rows (accuracy, say): their names, and its output is
// then f32 [1 + metrics], the loss first. Each is a mean over rows, as the loss is,
// so the trainers average them as they average losses.
struct StageIoSpec {
  TensorSpec input;
  std::optional<TensorSpec> targets;
  TensorSpec output;
  std::vector<std::string> metrics;
};

// A loss stage reports at most this many metrics; each name is 1 to 32 of
// [a-z0-9_] (it names a column of metrics.jsonl and a line of the report).
inline constexpr size_t kMaxStageMetrics = 8;
inline bool valid_metric_name(const std::string& name) {
  if (name.empty() || name.size() > 32) return false;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

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
      // Output, or for a stage that takes targets, the mean loss as f32 [1] (then
      // its metrics' means: f32 [1 + io_spec().metrics.size()]).
      { stage.forward(input, targets) } -> std::same_as<Result<Tensor>>;
      // Input gradient (an undefined Tensor when the input is not differentiable,
      // like tokens); adds the parameter gradients into the stage's accumulators.
      { stage.backward(input, grad_output, targets) } -> std::same_as<Result<Tensor>>;
      { stage.parameter_views() } -> std::same_as<std::vector<StageParameterView>>;
      { stage.zero_grad() } -> std::same_as<Status>;
      { const_stage.takes_targets() } -> std::same_as<bool>;
      { const_stage.io_spec() } -> std::same_as<StageIoSpec>;
    };

// Refinements. Each opts in with its own tag besides the member, so the runtime
// never picks up a same-named member by accident.

// Keeps the activations of its last forward; must forget them whenever its
// weights change (an optimizer step, a loaded state), or a later backward would
// use activations of other weights.
struct caching_stage_t {};
template <typename S>
concept CachingStage = Stage<S> && std::same_as<typename S::caching_stage_concept, caching_stage_t> &&
                       requires(S stage) {
                         { stage.drop_cached_activations() } -> std::same_as<void>;
                       };

// Runs its backward on the forward it just computed, without recomputing it: the
// last stage serves forward and backward as one request.
struct backward_after_forward_stage_t {};
template <typename S>
concept BackwardAfterForwardStage =
    Stage<S> && std::same_as<typename S::backward_after_forward_concept, backward_after_forward_stage_t> &&
    requires(S stage, const TensorView& grad_output) {
      { stage.backward_after_forward(grad_output) } -> std::same_as<Result<Tensor>>;
    };

// Forgets cached activations where the stage keeps any.
template <Stage S>
void drop_cached_activations(S& stage) {
  if constexpr (CachingStage<S>) stage.drop_cached_activations();
}

}  // namespace swarm
