// layer: what every layer of swarm/layers provides, and the helpers they share.
//
// A layer is a forward/backward pair over rows: f32 [rows, features] in and
// out (an embedding takes i32 tokens instead). Its backward gets the input the
// forward got, recomputes whatever it needs from it, ADDS its parameter
// gradients into its accumulators and returns the input gradient; nothing is
// kept between calls, because any peer may serve a stage's backward. Layers
// are not stages: Sequential (sequential.h) chains them into one.
//
// Layers compute in f32, the dtype of activations on the wire, so they need a
// backend whose value_type is float.
//
//   static_assert(swarm::layers::Layer<swarm::layers::Linear<Cpu>>);
#pragma once

#include <climits>
#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "swarm/api/backend.h"
#include "swarm/api/stage.h"
#include "swarm/core/status.h"
#include "swarm/core/tensor.h"

namespace swarm::layers {

// A width a layer leaves open: an activation takes and gives any number of features.
inline constexpr int64_t kAnyWidth = -1;

template <typename L>
concept Layer =
    Backend<typename L::backend> && std::same_as<typename L::backend::value_type, float> &&
    requires(L layer, const L& const_layer, const TensorView& x, const TensorView& dy, uint64_t seed,
             int64_t width, const std::string& prefix, std::vector<StageParameterView>& views) {
      { L::takes_tokens } -> std::convertible_to<bool>;
      // Allocates and seeds the parameters; checks the configuration.
      { layer.initialize(seed) } -> std::same_as<Status>;
      { const_layer.input_features() } -> std::same_as<int64_t>;
      { const_layer.output_features(width) } -> std::same_as<int64_t>;
      { const_layer.forward(x) } -> std::same_as<Result<Tensor>>;
      { layer.backward(x, dy) } -> std::same_as<Result<Tensor>>;
      { layer.append_parameter_views(prefix, views) } -> std::same_as<void>;
      { layer.zero_grad() } -> std::same_as<Status>;
    };

// The last layer of a stage that computes the loss: the mean loss as f32 [1].
template <typename L>
concept LossLayer =
    Backend<typename L::backend> && std::same_as<typename L::backend::value_type, float> &&
    requires(const L& loss, const TensorView& x, const TensorView& targets, const TensorView& dloss, int64_t width) {
      { loss.target_spec(width) } -> std::same_as<TensorSpec>;
      { loss.forward(x, targets) } -> std::same_as<Result<Tensor>>;
      { loss.backward(x, targets, dloss) } -> std::same_as<Result<Tensor>>;
    };

// One learned tensor and its gradient accumulator, both f32 on the backend's device.
struct Parameter {
  std::string name;
  Tensor value, grad;
  bool apply_weight_decay = true;

  StageParameterView view(const std::string& prefix) const {
    return {prefix + name, value, grad, apply_weight_decay};
  }
};

// splitmix64's finalizer: a well-mixed 64-bit value of any 64-bit value.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// splitmix64: the same weights from the same seed on every platform, which
// the standard distributions do not promise.
class SeededUniform {
 public:
  explicit SeededUniform(uint64_t seed) : state_(seed) {}
  // Uniform in [-bound, bound).
  float next(float bound) {
    state_ += 0x9e3779b97f4a7c15ull;
    const float unit = static_cast<float>(mix64(state_) >> 40) / static_cast<float>(1 << 24);  // [0, 1)
    return (unit * 2.0f - 1.0f) * bound;
  }

 private:
  uint64_t state_;
};

// Layer `index`'s seed: the layers of one stage get unrelated weights.
inline uint64_t derive_seed(uint64_t seed, uint64_t index) { return mix64(seed ^ mix64(index + 1)); }

// A parameter whose elements are fill() in row-major order.
template <Backend B, typename Fill>
Result<Parameter> make_parameter(std::string name, const Shape& shape, bool apply_weight_decay, Fill fill) {
  SWARM_ASSIGN_OR_RETURN(Tensor host, Tensor::empty(shape, DType::f32));
  for (float& v : host.span<float>()) v = fill();
  Parameter parameter{std::move(name), {}, {}, apply_weight_decay};
  SWARM_ASSIGN_OR_RETURN(parameter.value, Tensor::copy_of(host, B::device));
  SWARM_ASSIGN_OR_RETURN(parameter.grad, Tensor::zeros(shape, DType::f32, B::device));
  return parameter;
}

template <Backend B>
void zero_grad_of(const Parameter& parameter) {
  B::fill_zero(parameter.grad.data<float>(), parameter.grad.numel(), typename B::stream_type{});
}

// The parameters of an affine layer (Linear, LayerNorm): a weight and a bias, named
// and zeroed together.
class WeightAndBias {
 public:
  void append_parameter_views(const std::string& prefix, std::vector<StageParameterView>& views) {
    views.push_back(weight_.view(prefix));
    views.push_back(bias_.view(prefix));
  }

 protected:
  template <Backend B>
  Status zero_both() {
    zero_grad_of<B>(weight_);
    zero_grad_of<B>(bias_);
    return Status::ok();
  }

  Parameter weight_, bias_;
};

// "[rows, 16]", or "[rows, features]" for an open width.
inline std::string rows_of(int64_t width) {
  return width == kAnyWidth ? "[rows, features]" : fmt::format("[rows, {}]", width);
}

// Kernels index with int: a tensor past that is refused rather than wrapped.
inline Status check_kernel_size(const TensorView& t, std::string_view who) {
  if (t.numel() > INT_MAX) return invalid_argument("{} takes at most {} elements, got {}", who, INT_MAX, t.describe());
  return Status::ok();
}

// `x` must be f32 [rows, width] with rows >= 1, on the backend's device.
template <Backend B>
Status check_rows(const TensorView& x, int64_t width, std::string_view who) {
  const bool fits = x.dtype() == DType::f32 && x.shape().rank() == 2 && x.shape()[0] >= 1 && x.shape()[1] >= 1 &&
                    (width == kAnyWidth || x.shape()[1] == width) && x.device() == B::device;
  if (!fits) {
    return invalid_argument("{} takes f32 {} on {}, got {}", who, rows_of(width), device_name(B::device),
                            x.describe());
  }
  return check_kernel_size(x, who);
}

// An output gradient must match the output it is the gradient of.
template <Backend B>
Status check_gradient(const TensorView& dy, const Shape& output_shape, std::string_view who) {
  if (dy.dtype() != DType::f32 || dy.shape() != output_shape || dy.device() != B::device) {
    return invalid_argument("{}'s output gradient must be f32 {} on {}, got {}", who, output_shape.to_string(),
                            device_name(B::device), dy.describe());
  }
  return Status::ok();
}

template <Backend B>
Result<Tensor> new_rows(int64_t rows, int64_t width) {
  return Tensor::empty(Shape{rows, width}, DType::f32, B::device);
}

// Backward kernels may add into their input gradient; a zeroed one makes
// adding and overwriting agree.
template <Backend B>
Result<Tensor> zeros_like(const TensorView& x) {
  SWARM_ASSIGN_OR_RETURN(Tensor zeros, Tensor::empty(x.shape(), DType::f32, B::device));
  B::fill_zero(zeros.data<float>(), zeros.numel(), typename B::stream_type{});
  return zeros;
}

// Every id of `ids` (i32) in [0, limit): kernels index tables with them unchecked.
inline Status check_ids(const TensorView& ids, int64_t limit, std::string_view what) {
  Tensor keep;
  SWARM_ASSIGN_OR_RETURN(TensorView host, host_view(ids, keep));
  const auto values = host.span<const int32_t>();
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] < 0 || values[i] >= limit) {
      return invalid_argument("{} {} at index {} is outside [0, {})", what, values[i], i, limit);
    }
  }
  return Status::ok();
}

}  // namespace swarm::layers
