// emulated_compute_stage: a Stage whose compute is a wait for FLOPs / rate,
// for network experiments at widths this machine cannot compute in time.
//
// It takes and returns real tensors of the true size ([B, T, input_width] in,
// [B, T, output_width] out, the input gradient on the way back), so every byte
// a real stage of that width would put on the wire still crosses it, through
// the real codecs and protocol. Only the arithmetic is replaced: a forward
// takes forward_flops_per_token × tokens / flops_per_second of wall time and a
// backward backward_flops_per_token × tokens / flops_per_second. The time spent
// filling the output counts toward that budget, not on top of it.
//
// The values it returns follow its input (each output row repeats the input
// row), so a lossy codec sees activations shaped like the ones it was sent, not
// constant buffers that compress unrealistically well. It has no parameters.
//
//   auto stage = swarm::emulated::EmulatedComputeStage::create(
//       {.input_width = 4096, .output_width = 4096, .forward_flops_per_token = 4.8e9,
//        .backward_flops_per_token = 9.6e9, .flops_per_second = 25e12});
#pragma once

#include <cstdint>
#include <vector>

#include "models/emulated/emulated_time.h"
#include "swarm/api/stage.h"
#include "swarm/core/status.h"
#include "swarm/core/tensor.h"

namespace swarm::emulated {

struct EmulatedComputeConfig {
  int64_t input_width = 1;
  int64_t output_width = 1;
  double forward_flops_per_token = 0;
  double backward_flops_per_token = 0;
  double flops_per_second = 25e12;  // a T4-class GPU
};

class EmulatedComputeStage {
 public:
  using stage_concept = stage_t;

  static Result<EmulatedComputeStage> create(const EmulatedComputeConfig& config) {
    if (config.input_width <= 0 || config.output_width <= 0) {
      return invalid_argument("emulated stage widths must be positive, got {} and {}", config.input_width,
                              config.output_width);
    }
    if (!(config.forward_flops_per_token >= 0) || !(config.backward_flops_per_token >= 0) ||
        !(config.flops_per_second > 0)) {
      return invalid_argument("emulated stage FLOPs must be >= 0 and the rate > 0");
    }
    EmulatedComputeStage stage;
    stage.config_ = config;
    return stage;
  }

  const EmulatedComputeConfig& config() const { return config_; }
  bool takes_targets() const { return false; }
  StageIoSpec io_spec() const {
    return StageIoSpec{TensorSpec{DType::f32, {-1, -1, config_.input_width}}, std::nullopt,
                       TensorSpec{DType::f32, {-1, -1, config_.output_width}}};
  }
  std::vector<StageParameterView> parameter_views() { return {}; }
  Status zero_grad() { return Status::ok(); }

  Result<Tensor> forward(const TensorView& input, const TensorView* /*targets*/) {
    const auto until = deadline_for(input, config_.forward_flops_per_token);
    SWARM_RETURN_IF_ERROR(check(input, config_.input_width, "input"));
    SWARM_ASSIGN_OR_RETURN(Tensor out, follow(input, config_.output_width));
    wait_until(until);
    return out;
  }

  Result<Tensor> backward(const TensorView& input, const TensorView& grad_output, const TensorView* /*targets*/) {
    const auto until = deadline_for(input, config_.backward_flops_per_token);
    SWARM_RETURN_IF_ERROR(check(input, config_.input_width, "input"));
    SWARM_RETURN_IF_ERROR(check(grad_output, config_.output_width, "output gradient"));
    SWARM_ASSIGN_OR_RETURN(Tensor grad_input, follow(grad_output, config_.input_width));
    wait_until(until);
    return grad_input;
  }

 private:
  EmulatedClock::time_point deadline_for(const TensorView& input, double flops_per_token) const {
    return EmulatedClock::now() + seconds_for(flops_per_token * tokens_of(input), config_.flops_per_second);
  }

  static Status check(const TensorView& t, int64_t width, const char* what) {
    if (t.dtype() != DType::f32 || t.shape().rank() != 3 || t.shape()[2] != width) {
      return invalid_argument("emulated stage: the {} must be f32 [B, T, {}], got {} {}", what, width,
                              dtype_name(t.dtype()), t.shape().to_string());
    }
    return Status::ok();
  }

  EmulatedComputeConfig config_;
};

static_assert(Stage<EmulatedComputeStage>);

}  // namespace swarm::emulated
