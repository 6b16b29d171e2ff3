// chain: layers applied one after another, itself a layer. Sequential and
// Residual are built on it; users rarely name it.
//
// Its backward first recomputes every layer's input from the chain's input
// (nothing is kept from a forward, which another peer may have served), then
// walks the layers back. A layer that recomputes more inside its own backward
// (a Residual's inner chain) does so once more.
//
// Layer i is seeded with derive_seed(seed, i) and its parameters are named
// "i.<name>", so names stay unique in nested chains: "2.0.weight".
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "swarm/layers/layer.h"

namespace swarm::layers {

template <typename... Layers>
constexpr bool first_takes_tokens() {
  if constexpr (sizeof...(Layers) == 0) {
    return false;
  } else {
    return std::tuple_element_t<0, std::tuple<Layers...>>::takes_tokens;
  }
}

template <typename... Layers>
constexpr bool a_later_layer_takes_tokens() {
  size_t index = 0;
  return ((index++ > 0 && Layers::takes_tokens) || ...);
}

template <Backend B, Layer... Layers>
class Chain {
 public:
  using backend = B;
  static constexpr size_t kSize = sizeof...(Layers);
  static constexpr bool takes_tokens = first_takes_tokens<Layers...>();
  static_assert((std::same_as<typename Layers::backend, B> && ...), "every layer of a chain runs on one backend");
  static_assert(!a_later_layer_takes_tokens<Layers...>(),
                "only the first layer of a stage may take tokens (an Embedding)");

  explicit Chain(Layers... layers) : layers_(std::move(layers)...) {}

  // Initializes every layer, and checks that each takes what the one before gives.
  Status initialize(uint64_t seed) {
    int64_t width = input_features();
    return for_each_layer([&](size_t i, auto& layer) -> Status {
      SWARM_RETURN_IF_ERROR(layer.initialize(derive_seed(seed, i)).with_context(fmt::format("layer {}", i)));
      const int64_t takes = layer.input_features();
      if (takes != kAnyWidth && width != kAnyWidth && takes != width) {
        return invalid_argument("layer {} takes {} features but the layer before gives {}", i, takes, width);
      }
      width = layer.output_features(width);
      return Status::ok();
    });
  }

  // The first width some layer fixes, looking through width-keeping layers.
  int64_t input_features() const {
    int64_t width = kAnyWidth;
    bool searching = true;
    auto look = [&](const auto& layer) {
      if (!searching) return;
      if (layer.input_features() != kAnyWidth) {
        width = layer.input_features();
        searching = false;
      } else if (layer.output_features(kAnyWidth) != kAnyWidth) {
        searching = false;  // it takes any width and gives a fixed one
      }
    };
    std::apply([&](const auto&... layer) { (look(layer), ...); }, layers_);
    return width;
  }

  int64_t output_features(int64_t width) const {
    std::apply([&](const auto&... layer) { ((width = layer.output_features(width)), ...); }, layers_);
    return width;
  }

  Result<Tensor> forward(const TensorView& x) const {
    if constexpr (kSize == 0) {
      return Tensor::copy_of(x, B::device);
    } else {
      return forward_from<0>(x);
    }
  }

  // Every layer's input, recomputed: inputs[i] for 0 < i < kSize (layer 0's is
  // the chain's), and the chain's output when asked for.
  struct Trace {
    std::array<Tensor, kSize + 1> inputs;
    const Tensor& output() const { return inputs[kSize]; }
  };
  Result<Trace> trace(const TensorView& x, bool with_output) const {
    Trace trace;
    if constexpr (kSize == 0) {
      if (with_output) {
        SWARM_ASSIGN_OR_RETURN(trace.inputs[0], Tensor::copy_of(x, B::device));
      }
    } else {
      SWARM_RETURN_IF_ERROR(trace_from<0>(x, with_output, trace));
    }
    return trace;
  }

  Result<Tensor> backward(const TensorView& x, const TensorView& dy) {
    SWARM_ASSIGN_OR_RETURN(Trace recomputed, trace(x, /*with_output=*/false));
    return backward(x, recomputed, dy);
  }

  Result<Tensor> backward(const TensorView& x, const Trace& trace, const TensorView& dy) {
    if constexpr (kSize == 0) {
      return Tensor::copy_of(dy, B::device);
    } else {
      return backward_from<kSize - 1>(x, trace, dy);
    }
  }

  void append_parameter_views(const std::string& prefix, std::vector<StageParameterView>& views) {
    Status ignored = for_each_layer([&](size_t i, auto& layer) {
      layer.append_parameter_views(prefix + std::to_string(i) + ".", views);
      return Status::ok();
    });
    (void)ignored;
  }

  Status zero_grad() {
    return for_each_layer([](size_t, auto& layer) { return layer.zero_grad(); });
  }

 private:
  // f(i, layer) for each layer in order, up to the first error.
  template <typename F>
  Status for_each_layer(F&& f) {
    Status status;
    [&]<size_t... I>(std::index_sequence<I...>) {
      static_cast<void>((((status = f(I, std::get<I>(layers_))).is_ok()) && ...));
    }(std::index_sequence_for<Layers...>{});
    return status;
  }

  static TensorView input_of(size_t i, const TensorView& x, const Trace& trace) {
    return i == 0 ? x : trace.inputs[i].view();
  }

  template <size_t I>
  Result<Tensor> forward_from(const TensorView& x) const {
    SWARM_ASSIGN_OR_RETURN(Tensor y, std::get<I>(layers_).forward(x));
    if constexpr (I + 1 == kSize) {
      return y;
    } else {
      return forward_from<I + 1>(y);
    }
  }

  template <size_t I>
  Status trace_from(const TensorView& x, bool with_output, Trace& trace) const {
    if (I + 1 == kSize && !with_output) return Status::ok();
    SWARM_ASSIGN_OR_RETURN(trace.inputs[I + 1], std::get<I>(layers_).forward(input_of(I, x, trace)));
    if constexpr (I + 1 == kSize) {
      return Status::ok();
    } else {
      return trace_from<I + 1>(x, with_output, trace);
    }
  }

  template <size_t I>
  Result<Tensor> backward_from(const TensorView& x, const Trace& trace, const TensorView& dy) {
    SWARM_ASSIGN_OR_RETURN(Tensor dx, std::get<I>(layers_).backward(input_of(I, x, trace), dy));
    if constexpr (I == 0) {
      return dx;
    } else {
      return backward_from<I - 1>(x, trace, dx);
    }
  }

  std::tuple<Layers...> layers_;
};

}  // namespace swarm::layers
