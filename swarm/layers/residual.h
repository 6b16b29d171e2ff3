// residual: out = x + inner(x), inner being a chain of layers that keeps the width.
//
// The backward is the skip's gradient plus the inner chain's. The inner layers'
// parameters are named "<residual's index>.<inner index>.<name>".
//
//   swarm::layers::Residual block(Linear<Cpu>(16, 16), Tanh<Cpu>());  // deduces the types
//   using Block = swarm::layers::Residual<Linear<Cpu>, Tanh<Cpu>>;
#pragma once

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "swarm/layers/chain.h"
#include "swarm/layers/layer.h"

namespace swarm::layers {

template <Layer... Inner>
class Residual {
  static_assert(sizeof...(Inner) > 0, "a Residual wraps at least one layer");

 public:
  using backend = typename std::tuple_element_t<0, std::tuple<Inner...>>::backend;
  static constexpr bool takes_tokens = false;
  static_assert(!(Inner::takes_tokens || ...), "tokens cannot be added to vectors: no Embedding in a Residual");

  Residual(Inner... inner) : inner_(std::move(inner)...) {}  // NOLINT: implicit, so {Linear(..), Tanh()} works

  Status initialize(uint64_t seed) {
    SWARM_RETURN_IF_ERROR(inner_.initialize(seed));
    const int64_t takes = inner_.input_features(), gives = inner_.output_features(takes);
    if (takes != kAnyWidth && gives != kAnyWidth && takes != gives) {
      return invalid_argument("a Residual's inner layers must keep the width, but they take {} and give {}", takes,
                              gives);
    }
    return Status::ok();
  }

  int64_t input_features() const {
    const int64_t takes = inner_.input_features();
    return takes != kAnyWidth ? takes : inner_.output_features(kAnyWidth);
  }
  int64_t output_features(int64_t width) const { return width != kAnyWidth ? width : input_features(); }

  Result<Tensor> forward(const TensorView& x) const {
    SWARM_RETURN_IF_ERROR(check_rows<backend>(x, input_features(), "Residual"));
    SWARM_ASSIGN_OR_RETURN(Tensor inner, inner_.forward(x));
    SWARM_RETURN_IF_ERROR(check_inner_output(x, inner));
    SWARM_ASSIGN_OR_RETURN(Tensor y, new_rows<backend>(x.shape()[0], x.shape()[1]));
    backend::residual_forward(y.data<float>(), x.data<float>(), inner.data<float>(), x.numel(),
                              typename backend::stream_type{});
    return y;
  }

  Result<Tensor> backward(const TensorView& x, const TensorView& dy) {
    SWARM_RETURN_IF_ERROR(check_rows<backend>(x, input_features(), "Residual"));
    SWARM_RETURN_IF_ERROR(check_gradient<backend>(dy, x.shape(), "Residual"));
    SWARM_ASSIGN_OR_RETURN(Tensor dx, inner_.backward(x, dy));
    backend::accumulate(dx.data<float>(), dy.data<float>(), dx.numel(), typename backend::stream_type{});
    return dx;
  }

  void append_parameter_views(const std::string& prefix, std::vector<StageParameterView>& views) {
    inner_.append_parameter_views(prefix, views);
  }

  Status zero_grad() { return inner_.zero_grad(); }

 private:
  // Inner layers that take any width cannot be checked at initialize; checked here.
  static Status check_inner_output(const TensorView& x, const Tensor& inner) {
    if (inner.shape() != x.shape()) {
      return invalid_argument("a Residual's inner layers must keep the shape: {} became {}", x.shape().to_string(),
                              inner.shape().to_string());
    }
    return Status::ok();
  }

  Chain<backend, Inner...> inner_;
};

}  // namespace swarm::layers
