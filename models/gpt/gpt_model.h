// gpt_model: a whole GPT as the composition of its stages, in one process.
//
// The same GptStage code serves single-process training (here) and the swarm,
// where each stage lives on other peers. A split model computes exactly what
// the unsplit one does, unless config.boundaries put compressing layers at its
// cuts: then it computes the swarm's function, boundary layers included, and
// the one-stage model (no cuts) ignores them.
//
//   auto model = swarm::gpt::GptModel<swarm::CpuBackend>::create(config, /*num_stages=*/1, seed);
//   SWARM_ASSIGN_OR_RETURN(float loss, model->forward_backward(inputs, targets));
#pragma once

#include <vector>

#include "models/gpt/gpt_stage.h"

namespace swarm::gpt {

template <Backend B>
class GptModel {
 public:
  static Result<GptModel> create(const GptConfig& config, const std::vector<StageLayout>& layouts,
                                 uint64_t seed) {
    GptModel model;
    for (const StageLayout& layout : layouts) {
      SWARM_ASSIGN_OR_RETURN(GptStage<B> stage, GptStage<B>::create(config, layout, seed));
      model.stages_.push_back(std::move(stage));
    }
    if (model.stages_.empty()) return invalid_argument("a model needs at least one stage");
    model.config_ = config;
    return model;
  }
  static Result<GptModel> create(const GptConfig& config, int num_stages, uint64_t seed) {
    SWARM_ASSIGN_OR_RETURN(auto layouts, partition_layers(config, num_stages));
    return create(config, layouts, seed);
  }

  const GptConfig& config() const { return config_; }
  std::vector<GptStage<B>>& stages() { return stages_; }

  std::vector<Parameter*> parameters() {
    std::vector<Parameter*> all;
    for (auto& stage : stages_) {
      for (auto& p : stage.parameters()) all.push_back(&p);
    }
    return all;
  }

  Status zero_grad() {
    for (auto& stage : stages_) SWARM_RETURN_IF_ERROR(stage.zero_grad());
    return Status::ok();
  }

  // Mean loss over all tokens; adds d(loss)/d(params) into the gradients.
  Result<float> forward_backward(const TensorView& tokens, const TensorView& targets) {
    SWARM_ASSIGN_OR_RETURN(float loss, run_forward(tokens, &targets));
    SWARM_ASSIGN_OR_RETURN(Tensor grad, Tensor::empty(Shape{1}, DType::f32));
    grad.data<float>()[0] = 1.0f;
    for (size_t s = stages_.size(); s-- > 0;) {
      SWARM_ASSIGN_OR_RETURN(grad, stages_[s].backward_after_forward(grad));
    }
    return loss;
  }

  Result<float> loss(const TensorView& tokens, const TensorView& targets) {
    return run_forward(tokens, &targets);
  }

  // f32 [B, T, vocab]
  Result<Tensor> logits(const TensorView& tokens) {
    Tensor hidden;
    TensorView current = tokens;
    for (auto& stage : stages_) {
      SWARM_ASSIGN_OR_RETURN(hidden, stage.forward(current, nullptr));
      current = hidden;
    }
    return hidden;
  }

 private:
  Result<float> run_forward(const TensorView& tokens, const TensorView* targets) {
    Tensor hidden;
    TensorView current = tokens;
    for (size_t s = 0; s < stages_.size(); ++s) {
      const bool last = s + 1 == stages_.size();
      SWARM_ASSIGN_OR_RETURN(hidden, stages_[s].forward(current, last ? targets : nullptr));
      current = hidden;
    }
    return hidden.data<float>()[0];
  }

  GptConfig config_;
  std::vector<GptStage<B>> stages_;
};

}  // namespace swarm::gpt
