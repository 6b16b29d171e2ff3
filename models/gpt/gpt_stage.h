// gpt_stage: one pipeline stage of a GPT, forward and backward, on any Backend.
//
// A stage owns its parameters, their gradients and its activation buffers.
// forward() keeps the activations of the call; backward_after_forward() uses
// them, and backward() recomputes the forward first, so any peer of a stage can
// serve a backward for an input it never saw (DESIGN.md §5.2).
//
// Inputs: i32 tokens [B, T] for the first stage, f32 hidden [B, T, C] for the
// others. Outputs: hidden [B, T, C], or for the last stage the mean
// cross-entropy loss as f32 [1] when targets are given, logits [B, T, V] when not.
// Across a cut with a compressing boundary layer (config.boundaries, see
// boundary.h) the hidden tensor is [B, T, C/k]: the sender ends with the
// compression and the receiver starts with the expansion.
//
//   auto stage = swarm::gpt::GptStage<swarm::CpuBackend>::create(config, layout, seed);
//   auto loss = stage->forward(tokens, &targets);
//   auto none = stage->backward_after_forward(one);   // first stage: no input gradient
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "swarm/api/backend.h"
#include "models/gpt/config.h"
#include "swarm/core/tensor.h"
#include "swarm/api/stage.h"
#include "swarm/api/updater.h"

namespace swarm::gpt {

struct Parameter {
  std::string name;  // global, e.g. "h.3.mlp.fc.weight": equal across any stage split
  Tensor value;
  Tensor grad;
  bool apply_weight_decay = true;  // false for biases and LayerNorm gains
};

// A stage over a CUDA backend names the backend's updater (names_backend_updater),
// so a Replica steps its parameters on the device.
template <Backend B>
class GptStage : public names_backend_updater<B> {
 public:
  using stage_concept = stage_t;
  using caching_stage_concept = caching_stage_t;
  using backward_after_forward_concept = backward_after_forward_stage_t;

  // Parameters are initialized from (seed, name), so a split model starts with
  // exactly the weights of the whole one (plus its boundary layers). Fails when
  // config.boundaries do not fit layout.num_stages, or when a maxout boundary
  // ends this stage and the backend is no MaxoutBackend.
  static Result<GptStage> create(const GptConfig& config, const StageLayout& layout, uint64_t seed);

  GptStage(GptStage&&) noexcept;
  GptStage& operator=(GptStage&&) noexcept;
  ~GptStage();

  const GptConfig& config() const;
  const StageLayout& layout() const;

  std::vector<Parameter>& parameters();
  const std::vector<Parameter>& parameters() const;
  std::vector<StageParameterView> parameter_views();
  Status zero_grad();
  // The last stage takes targets and outputs the loss.
  bool takes_targets() const { return layout().has_head(); }
  // Tokens i32 [B, T] into the first stage, f32 [B, T, d_model] between stages
  // (d_model / k across a compressing cut), i32 [B, T] targets and the f32 [1]
  // loss at the last.
  StageIoSpec io_spec() const;

  Result<Tensor> forward(const TensorView& input, const TensorView* targets);
  // grad_output: d(loss) as f32 [1] for the last stage, else shaped like the output.
  // Returns the input gradient, or an undefined Tensor for the first stage.
  Result<Tensor> backward_after_forward(const TensorView& grad_output);
  // Uses a recent forward of the same input when one is still parked here
  // (the last few are kept), else recomputes the forward.
  Result<Tensor> backward(const TensorView& input, const TensorView& grad_output,
                          const TensorView* targets);
  // Forgets parked forwards; call after changing the parameters.
  void drop_cached_activations();
  // Backwards that had to recompute their forward (the rest found it parked).
  uint64_t recomputed_forwards() const;
  // Runs the active forward and its backward again on the inputs, targets and
  // output gradient already on the device, with no host transfer: the stage's
  // compute alone, for benchmarks. Gradients accumulate as usual; the output
  // gradient buffer is reused as it was left. Needs a forward (with targets on
  // the last stage) and, before, one backward_after_forward.
  Status replay_resident_step();

 private:
  struct State;
  explicit GptStage(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace swarm::gpt
