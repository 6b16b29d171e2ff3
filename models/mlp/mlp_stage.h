// mlp_stage: the example of bringing your own model to a swarm. One dense
// layer per stage (optionally GELU), and a mean-squared-error loss on the
// stage that takes targets. It is written only against the Stage concept, so
// the same Peer and Trainer templates that serve GPT stages serve it too.
//
//   auto first = swarm::mlp::MlpStage::create({.in = 4, .out = 16, .gelu = true}, seed);
//   auto last = swarm::mlp::MlpStage::create({.in = 16, .out = 1, .loss = true}, seed);
//   static_assert(swarm::Stage<swarm::mlp::MlpStage>);
#pragma once

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/ops.h"
#include "swarm/core/tensor.h"
#include "swarm/api/stage.h"

namespace swarm::mlp {

struct MlpLayerConfig {
  int in = 1;
  int out = 1;
  bool gelu = false;  // activation after the layer
  bool loss = false;  // this stage takes f32 [B, out] targets and outputs the MSE
};

class MlpStage {
 public:
  using stage_concept = stage_t;

  static Result<MlpStage> create(MlpLayerConfig config, uint64_t seed) {
    if (config.in <= 0 || config.out <= 0) return invalid_argument("layer sizes must be positive");
    MlpStage stage;
    stage.config_ = config;
    SWARM_ASSIGN_OR_RETURN(stage.weight_, Tensor::zeros(Shape{config.out, config.in}, DType::f32));
    SWARM_ASSIGN_OR_RETURN(stage.bias_, Tensor::zeros(Shape{config.out}, DType::f32));
    SWARM_ASSIGN_OR_RETURN(stage.dweight_, Tensor::zeros(Shape{config.out, config.in}, DType::f32));
    SWARM_ASSIGN_OR_RETURN(stage.dbias_, Tensor::zeros(Shape{config.out}, DType::f32));
    uint64_t state = seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(config.in * 131 + config.out);
    const float scale = 1.0f / std::sqrt(static_cast<float>(config.in));
    for (float& w : stage.weight_.span<float>()) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      w = (static_cast<float>(state >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f) * scale;
    }
    return stage;
  }

  bool takes_targets() const { return config_.loss; }
  StageIoSpec io_spec() const {
    StageIoSpec spec{{DType::f32, {-1, config_.in}}, std::nullopt, {DType::f32, {-1, config_.out}}};
    if (config_.loss) {
      spec.targets = TensorSpec{DType::f32, {-1, config_.out}};
      spec.output = TensorSpec{DType::f32, {1}};
    }
    return spec;
  }

  Result<Tensor> forward(const TensorView& input, const TensorView* targets) {
    SWARM_RETURN_IF_ERROR(check(input, targets));
    const int B = static_cast<int>(input.shape()[0]);
    SWARM_ASSIGN_OR_RETURN(Tensor pre, run_layer(input));
    if (!config_.loss) return pre;
    const float* y = pre.data<float>();
    const float* t = targets->data<float>();
    double total = 0;
    for (int64_t i = 0; i < pre.numel(); ++i) total += double(y[i] - t[i]) * (y[i] - t[i]);
    SWARM_ASSIGN_OR_RETURN(Tensor loss, Tensor::empty(Shape{1}, DType::f32));
    loss.data<float>()[0] = static_cast<float>(total / (double(B) * config_.out));
    return loss;
  }

  Result<Tensor> backward(const TensorView& input, const TensorView& grad_output, const TensorView* targets) {
    SWARM_RETURN_IF_ERROR(check(input, targets));
    const int B = static_cast<int>(input.shape()[0]);
    SWARM_ASSIGN_OR_RETURN(Tensor pre_activation, Tensor::empty(Shape{B, config_.out}, DType::f32));
    cpu::matmul_forward(pre_activation.data<float>(), input.data<float>(), weight_.data<float>(),
                        bias_.data<float>(), B, config_.in, config_.out);
    SWARM_ASSIGN_OR_RETURN(Tensor dpre, Tensor::zeros(Shape{B, config_.out}, DType::f32));
    if (config_.loss) {
      if (grad_output.dtype() != DType::f32 || grad_output.numel() != 1) {
        return invalid_argument("the loss stage's output gradient is f32 [1]");
      }
      const float scale = 2.0f * grad_output.data<float>()[0] / static_cast<float>(B * config_.out);
      const float* y = pre_activation.data<float>();
      const float* t = targets->data<float>();
      for (int64_t i = 0; i < dpre.numel(); ++i) dpre.data<float>()[i] = scale * (y[i] - t[i]);
    } else {
      if (grad_output.dtype() != DType::f32 || grad_output.numel() != int64_t{B} * config_.out) {
        return invalid_argument("output gradient must be f32 [{}, {}]", B, config_.out);
      }
      if (config_.gelu) {
        cpu::gelu_backward(dpre.data<float>(), pre_activation.data<float>(), grad_output.data<float>(),
                           dpre.numel());
      } else {
        std::memcpy(dpre.data<float>(), grad_output.data<float>(), dpre.size_bytes());
      }
    }
    SWARM_ASSIGN_OR_RETURN(Tensor dinput, Tensor::zeros(input.shape(), DType::f32));
    cpu::matmul_backward(dinput.data<float>(), dweight_.data<float>(), dbias_.data<float>(), dpre.data<float>(),
                         input.data<float>(), weight_.data<float>(), B, config_.in, config_.out);
    return dinput;
  }

  std::vector<StageParameterView> parameter_views() {
    return {{"weight", weight_, dweight_, true}, {"bias", bias_, dbias_, false}};
  }

  Status zero_grad() {
    std::memset(dweight_.raw_data(), 0, dweight_.size_bytes());
    std::memset(dbias_.raw_data(), 0, dbias_.size_bytes());
    return Status::ok();
  }

 private:
  Status check(const TensorView& input, const TensorView* targets) const {
    if (input.dtype() != DType::f32 || input.shape().rank() != 2 || input.shape()[1] != config_.in ||
        input.shape()[0] < 1) {
      return invalid_argument("input must be f32 [batch, {}], got {}", config_.in, input.describe());
    }
    if (config_.loss) {
      if (targets == nullptr) return invalid_argument("the loss stage needs targets");
      if (targets->dtype() != DType::f32 || targets->numel() != input.shape()[0] * config_.out) {
        return invalid_argument("targets must be f32 [batch, {}], got {}", config_.out, targets->describe());
      }
    } else if (targets != nullptr) {
      return invalid_argument("only the loss stage takes targets");
    }
    return Status::ok();
  }

  Result<Tensor> run_layer(const TensorView& input) {
    const int B = static_cast<int>(input.shape()[0]);
    SWARM_ASSIGN_OR_RETURN(Tensor out, Tensor::empty(Shape{B, config_.out}, DType::f32));
    cpu::matmul_forward(out.data<float>(), input.data<float>(), weight_.data<float>(), bias_.data<float>(), B,
                        config_.in, config_.out);
    if (config_.gelu) cpu::gelu_forward(out.data<float>(), out.data<float>(), out.numel());
    return out;
  }

  MlpLayerConfig config_;
  Tensor weight_, bias_, dweight_, dbias_;
};

static_assert(Stage<MlpStage>);

}  // namespace swarm::mlp
