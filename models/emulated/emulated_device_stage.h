// emulated_device_stage: a real stage served at the pace of a faster device.
//
// On this machine's 2 cores a stage computes far slower than the GPU of a peer
// on a home link, so the CPU, not the link, bounds a swarm, and an experiment
// about links measures the CPU. This adapter keeps everything of its stage S
// that the swarm sees (the io spec, the parameters the stage-mates average, the
// checkpoints) and replaces only the arithmetic: a forward waits
// forward_flops_per_token x tokens / rate, a backward its own count. The tensors
// it returns have the true shapes, so every byte a real stage would send still
// crosses the wire through the codecs. Their values follow the input (each row
// repeats the input's row; a token becomes a fixed pseudo-random row), so a lossy
// codec sees varied data rather than constants that compress unrealistically.
//
// What it returns is not the model's: the loss is a function of the input, and
// no parameter gradient is added. A run on it measures time, never learning.
//
//   auto stage = EmulatedDeviceStage<GptStage<CpuBackend>>::create(
//       std::move(gpt_stage), {.forward_flops_per_token = 2.4e6, .flops_per_second = 25e12});
#pragma once

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "models/emulated/emulated_time.h"
#include "swarm/api/stage.h"
#include "swarm/core/status.h"
#include "swarm/core/tensor.h"

namespace swarm::emulated {

struct EmulatedDeviceConfig {
  double forward_flops_per_token = 0;
  double backward_flops_per_token = 0;  // usually twice the forward
  double flops_per_second = 25e12;      // a T4-class GPU
};

template <Stage S>
class EmulatedDeviceStage {
 public:
  using stage_concept = stage_t;

  static Result<EmulatedDeviceStage> create(S inner, const EmulatedDeviceConfig& config) {
    if (!(config.forward_flops_per_token >= 0) || !(config.backward_flops_per_token >= 0) ||
        !(config.flops_per_second > 0) || !std::isfinite(config.flops_per_second)) {
      return invalid_argument("an emulated device needs FLOPs >= 0 and a finite rate > 0");
    }
    const StageIoSpec io = inner.io_spec();
    if (!inner.takes_targets() && (io.output.dims.size() != 3 || io.output.dims[2] <= 0)) {
      return invalid_argument("an emulated device serves stages whose output is [B, T, width], not {}",
                              describe(io.output));
    }
    return EmulatedDeviceStage(std::move(inner), config);
  }

  const EmulatedDeviceConfig& config() const { return config_; }
  bool takes_targets() const { return inner_.takes_targets(); }
  StageIoSpec io_spec() const { return io_; }
  std::vector<StageParameterView> parameter_views() { return inner_.parameter_views(); }
  Status zero_grad() { return inner_.zero_grad(); }

  // The output, or for a loss stage [loss, metrics...]: the input's mean magnitude
  // for the loss, and 0 for every metric.
  Result<Tensor> forward(const TensorView& input, const TensorView* targets) {
    const auto until = EmulatedClock::now() + seconds_for(config_.forward_flops_per_token * tokens_of(input),
                                                          config_.flops_per_second);
    SWARM_RETURN_IF_ERROR(check_input(input));
    Tensor out;
    if (takes_targets()) {
      if (targets == nullptr) return invalid_argument("emulated device: a loss stage's forward needs targets");
      SWARM_ASSIGN_OR_RETURN(out, loss_row(input));
    } else {
      SWARM_ASSIGN_OR_RETURN(out, features(input, io_.output.dims[2]));
    }
    wait_until(until);
    return out;
  }

  // The input's gradient (undefined for tokens), shaped like the input.
  Result<Tensor> backward(const TensorView& input, const TensorView& /*grad_output*/, const TensorView* /*targets*/) {
    const auto until = EmulatedClock::now() + seconds_for(config_.backward_flops_per_token * tokens_of(input),
                                                          config_.flops_per_second);
    SWARM_RETURN_IF_ERROR(check_input(input));
    Tensor grad_input;
    if (input.dtype() == DType::f32) {
      SWARM_ASSIGN_OR_RETURN(grad_input, follow(input, input.shape()[2]));
    }
    wait_until(until);
    return grad_input;
  }

 private:
  EmulatedDeviceStage(S inner, const EmulatedDeviceConfig& config)
      : inner_(std::move(inner)), io_(inner_.io_spec()), config_(config) {}

  Status check_input(const TensorView& input) const {
    if (!admits(io_.input, input.dtype(), input.shape())) {
      return invalid_argument("emulated device: the input must be {}, got {} {}", describe(io_.input),
                              dtype_name(input.dtype()), input.shape().to_string());
    }
    if (input.dtype() == DType::f32 && input.shape().rank() != 3) {
      return invalid_argument("emulated device: a float input must be [B, T, width], got {}",
                              input.shape().to_string());
    }
    if (input.dtype() != DType::f32 && input.dtype() != DType::i32 && input.dtype() != DType::i64) {
      return invalid_argument("emulated device: inputs are f32 activations or i32/i64 tokens, not {}",
                              dtype_name(input.dtype()));
    }
    if (input.dtype() != DType::f32 && input.shape().rank() != 2) {
      return invalid_argument("emulated device: tokens must be [B, T], got {}", input.shape().to_string());
    }
    return Status::ok();
  }

  static Result<Tensor> features(const TensorView& input, int64_t width) {
    if (input.dtype() == DType::f32) return follow(input, width);
    SWARM_ASSIGN_OR_RETURN(Tensor out, Tensor::empty(Shape{input.shape()[0], input.shape()[1], width}, DType::f32));
    const int64_t rows = input.shape()[0] * input.shape()[1];
    float* o = out.data<float>();
    for (int64_t r = 0; r < rows; ++r) {
      const uint64_t token = input.dtype() == DType::i32 ? static_cast<uint64_t>(input.data<int32_t>()[r])
                                                         : static_cast<uint64_t>(input.data<int64_t>()[r]);
      for (int64_t c = 0; c < width; ++c) o[r * width + c] = unit_hash(token * 0x9E3779B97F4A7C15ull + c);
    }
    return out;
  }

  // A value in [-1, 1) from 64 bits (splitmix64's finalizer).
  static float unit_hash(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    return static_cast<float>(static_cast<double>(x >> 40) / static_cast<double>(1ull << 23) - 1.0);
  }

  Result<Tensor> loss_row(const TensorView& input) const {
    SWARM_ASSIGN_OR_RETURN(Tensor out, Tensor::empty(Shape{1 + static_cast<int64_t>(io_.metrics.size())}, DType::f32));
    double magnitude = 0;
    if (input.dtype() == DType::f32 && input.numel() > 0) {
      for (float v : input.span<float>()) magnitude += std::fabs(v);
      magnitude /= static_cast<double>(input.numel());
    }
    float* o = out.data<float>();
    o[0] = static_cast<float>(magnitude);
    for (size_t i = 0; i < io_.metrics.size(); ++i) o[1 + i] = 0;
    return out;
  }

  S inner_;
  StageIoSpec io_;
  EmulatedDeviceConfig config_;
};

}  // namespace swarm::emulated
