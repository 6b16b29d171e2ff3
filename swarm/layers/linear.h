// linear: the dense layer, y = x W^T + b, on the backend's matmul.
//
// The weight is [out, in] as the backend's matmul expects (llm.c's layout),
// seeded uniform in +-1/sqrt(in) like torch.nn.Linear; the bias starts at zero
// and, as usual, is exempt from weight decay.
//
//   swarm::layers::Linear<Cpu> layer(2, 16);  // 2 features in, 16 out
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "swarm/layers/layer.h"

namespace swarm::layers {

template <Backend B>
class Linear : public WeightAndBias {
 public:
  using backend = B;
  static constexpr bool takes_tokens = false;

  Linear(int in_features, int out_features) : in_(in_features), out_(out_features) {}

  Status initialize(uint64_t seed) {
    if (in_ <= 0 || out_ <= 0 || int64_t{in_} * out_ > INT_MAX) {
      return invalid_argument("{}: sizes must be positive, with fewer than 2^31 weights", name());
    }
    SeededUniform random(seed);
    const float bound = 1.0f / std::sqrt(static_cast<float>(in_));
    SWARM_ASSIGN_OR_RETURN(weight_, make_parameter<B>("weight", Shape{out_, in_}, true, [&] { return random.next(bound); }));
    SWARM_ASSIGN_OR_RETURN(bias_, make_parameter<B>("bias", Shape{out_}, false, [] { return 0.0f; }));
    return Status::ok();
  }

  int64_t input_features() const { return in_; }
  int64_t output_features(int64_t) const { return out_; }

  Result<Tensor> forward(const TensorView& x) const {
    SWARM_RETURN_IF_ERROR(check_rows<B>(x, in_, name()));
    const int rows = static_cast<int>(x.shape()[0]);
    SWARM_ASSIGN_OR_RETURN(Tensor y, new_rows<B>(rows, out_));
    B::matmul_forward(y.data<float>(), x.data<float>(), weight_.value.data<float>(), bias_.value.data<float>(), rows,
                      in_, out_, typename B::stream_type{});
    return y;
  }

  Result<Tensor> backward(const TensorView& x, const TensorView& dy) {
    SWARM_RETURN_IF_ERROR(check_rows<B>(x, in_, name()));
    const int rows = static_cast<int>(x.shape()[0]);
    SWARM_RETURN_IF_ERROR(check_gradient<B>(dy, Shape{rows, out_}, name()));
    SWARM_ASSIGN_OR_RETURN(Tensor dx, zeros_like<B>(x));
    B::matmul_backward(dx.data<float>(), weight_.grad.data<float>(), bias_.grad.data<float>(), dy.data<float>(),
                       x.data<float>(), weight_.value.data<float>(), rows, in_, out_, typename B::stream_type{});
    return dx;
  }

  Status zero_grad() { return zero_both<B>(); }

 private:
  std::string name() const { return fmt::format("Linear({} -> {})", in_, out_); }

  int in_, out_;
};

}  // namespace swarm::layers
