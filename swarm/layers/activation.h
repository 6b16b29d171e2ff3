// activation: element-wise nonlinearities. They have no parameters and keep
// the width, whatever it is, so they fit between any two layers.
//
// Gelu is GPT-2's tanh approximation, on the Backend concept's op. Tanh needs a
// TanhBackend (backend_ops.h); HostOps<CpuBackend> is one.
//
//   swarm::layers::Gelu<Cpu> gelu;
//   swarm::layers::Tanh<Cpu> squash;
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "swarm/layers/backend_ops.h"
#include "swarm/layers/layer.h"

namespace swarm::layers {

// What parameterless, width-keeping layers share; Derived supplies the op as
// apply(y, x, n, stream) and apply_backward(dx, x, dy, n, stream).
template <Backend B, typename Derived>
class ElementwiseLayer {
 public:
  using backend = B;
  static constexpr bool takes_tokens = false;

  Status initialize(uint64_t) { return Status::ok(); }
  int64_t input_features() const { return kAnyWidth; }
  int64_t output_features(int64_t width) const { return width; }

  Result<Tensor> forward(const TensorView& x) const {
    SWARM_RETURN_IF_ERROR(check_rows<B>(x, kAnyWidth, Derived::kName));
    SWARM_ASSIGN_OR_RETURN(Tensor y, new_rows<B>(x.shape()[0], x.shape()[1]));
    Derived::apply(y.data<float>(), x.data<float>(), x.numel(), typename B::stream_type{});
    return y;
  }

  Result<Tensor> backward(const TensorView& x, const TensorView& dy) {
    SWARM_RETURN_IF_ERROR(check_rows<B>(x, kAnyWidth, Derived::kName));
    SWARM_RETURN_IF_ERROR(check_gradient<B>(dy, x.shape(), Derived::kName));
    SWARM_ASSIGN_OR_RETURN(Tensor dx, zeros_like<B>(x));
    Derived::apply_backward(dx.data<float>(), x.data<float>(), dy.data<float>(), x.numel(),
                            typename B::stream_type{});
    return dx;
  }

  void append_parameter_views(const std::string&, std::vector<StageParameterView>&) {}
  Status zero_grad() { return Status::ok(); }
};

template <Backend B>
class Gelu : public ElementwiseLayer<B, Gelu<B>> {
 public:
  static constexpr const char* kName = "Gelu";
  static void apply(float* y, const float* x, int64_t n, typename B::stream_type s) { B::gelu_forward(y, x, n, s); }
  static void apply_backward(float* dx, const float* x, const float* dy, int64_t n, typename B::stream_type s) {
    B::gelu_backward(dx, x, dy, n, s);
  }
};

template <TanhBackend B>
class Tanh : public ElementwiseLayer<B, Tanh<B>> {
 public:
  static constexpr const char* kName = "Tanh";
  static void apply(float* y, const float* x, int64_t n, typename B::stream_type s) { B::tanh_forward(y, x, n, s); }
  static void apply_backward(float* dx, const float* x, const float* dy, int64_t n, typename B::stream_type s) {
    B::tanh_backward(dx, x, dy, n, s);
  }
};

}  // namespace swarm::layers
