// norm: LayerNorm over each row's features, on the backend's layernorm.
//
// The scale starts at one and the shift at zero, both exempt from weight decay.
// The row statistics the backward needs are recomputed from the input rather
// than kept from the forward, since another peer may have served the forward.
//
//   swarm::layers::LayerNorm<Cpu> norm(16);
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "swarm/layers/layer.h"

namespace swarm::layers {

template <Backend B>
class LayerNorm : public WeightAndBias {
 public:
  using backend = B;
  static constexpr bool takes_tokens = false;

  LayerNorm(int features) : features_(features) {}  // NOLINT: implicit, so a stage takes {16}

  Status initialize(uint64_t) {
    if (features_ <= 0) return invalid_argument("{}: the width must be positive", name());
    SWARM_ASSIGN_OR_RETURN(weight_, make_parameter<B>("weight", Shape{features_}, false, [] { return 1.0f; }));
    SWARM_ASSIGN_OR_RETURN(bias_, make_parameter<B>("bias", Shape{features_}, false, [] { return 0.0f; }));
    return Status::ok();
  }

  int64_t input_features() const { return features_; }
  int64_t output_features(int64_t) const { return features_; }

  Result<Tensor> forward(const TensorView& x) const {
    SWARM_ASSIGN_OR_RETURN(Normalized normalized, normalize(x));
    return std::move(normalized.y);
  }

  Result<Tensor> backward(const TensorView& x, const TensorView& dy) {
    SWARM_ASSIGN_OR_RETURN(Normalized normalized, normalize(x));
    SWARM_RETURN_IF_ERROR(check_gradient<B>(dy, x.shape(), name()));
    SWARM_ASSIGN_OR_RETURN(Tensor dx, zeros_like<B>(x));
    B::layernorm_backward(dx.data<float>(), weight_.grad.data<float>(), bias_.grad.data<float>(), dy.data<float>(),
                          x.data<float>(), weight_.value.data<float>(), normalized.mean.template data<float>(),
                          normalized.rstd.template data<float>(), static_cast<int>(x.shape()[0]), features_,
                          typename B::stream_type{});
    return dx;
  }

  Status zero_grad() { return zero_both<B>(); }

 private:
  struct Normalized {
    Tensor y, mean, rstd;  // the statistics are f32 [rows]
  };

  Result<Normalized> normalize(const TensorView& x) const {
    SWARM_RETURN_IF_ERROR(check_rows<B>(x, features_, name()));
    const int64_t rows = x.shape()[0];
    Normalized out;
    SWARM_ASSIGN_OR_RETURN(out.y, new_rows<B>(rows, features_));
    SWARM_ASSIGN_OR_RETURN(out.mean, Tensor::empty(Shape{rows}, DType::f32, B::device));
    SWARM_ASSIGN_OR_RETURN(out.rstd, Tensor::empty(Shape{rows}, DType::f32, B::device));
    B::layernorm_forward(out.y.template data<float>(), out.mean.template data<float>(),
                         out.rstd.template data<float>(), x.data<float>(), weight_.value.data<float>(),
                         bias_.value.data<float>(), static_cast<int>(rows), features_, typename B::stream_type{});
    return out;
  }

  std::string name() const { return fmt::format("LayerNorm({})", features_); }

  int features_;
};

}  // namespace swarm::layers
