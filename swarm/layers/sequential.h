// sequential: a pipeline stage made of layers, one after another; it models the
// Stage concept, so Peer and Trainer serve it like any other stage.
//
// When the last layer is a loss (loss.h) the stage takes targets and outputs
// the mean loss, f32 [1] (with the metrics a loss reports after it: f32 [1 + n]);
// its output gradient is f32 [1] holding d(loss), usually 1. Layers work on rows; a stage's leading dims index them:
//
//   Sequential<...>          a batch of vectors: rows are dim 0
//     input    f32 [-1, in]
//     output   f32 [-1, out], or the loss f32 [1]
//     targets  i32 [-1] class ids (SoftmaxCrossEntropy), f32 [-1, out] (MeanSquaredError)
//   SequenceSequential<...>  a batch of sequences: rows are (batch, position), GPT's layout
//     input    f32 [-1, -1, in], or i32 [-1, -1] tokens when it starts with an Embedding
//     output   f32 [-1, -1, out], or the loss f32 [1]
//     targets  i32 [-1, -1] class ids, f32 [-1, -1, out]
//
// A width that no layer fixes (a stage of only activations) is -1. backward
// recomputes the forward from the input, adds the parameter gradients into the
// layers' accumulators and returns the input gradient (undefined for tokens).
// Parameters are named "<layer index>.<name>": "0.weight", "2.0.bias".
//
// Copies of a stage share its parameters (Tensors share storage).
//
//   using Cpu = swarm::layers::HostOps<swarm::CpuBackend>;
//   using Trunk = Sequential<Linear<Cpu>, Tanh<Cpu>>;
//   using Head = Sequential<Linear<Cpu>, SoftmaxCrossEntropy<Cpu>>;
//   SWARM_ASSIGN_OR_RETURN(Trunk trunk, Trunk::create(/*seed=*/1, {2, 16}, {}));
//   SWARM_ASSIGN_OR_RETURN(Head head, Head::create(/*seed=*/2, {16, 3}, {}));
#pragma once

#include <algorithm>
#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "swarm/api/stage.h"
#include "swarm/layers/chain.h"
#include "swarm/layers/layer.h"

namespace swarm::layers {

namespace sequential_detail {

struct NoLoss {};

// Chain<B, the first `count` of Layers...>.
template <Backend B, typename Tuple, typename Indices>
struct ChainOfFirst;
template <Backend B, typename Tuple, size_t... I>
struct ChainOfFirst<B, Tuple, std::index_sequence<I...>> {
  using type = Chain<B, std::tuple_element_t<I, Tuple>...>;
};

}  // namespace sequential_detail

// The first `count` dims of `t` merged into one: [B, T, C] -> [B * T, C], [B, T] -> [B * T].
inline Result<TensorView> merge_leading_dims(const TensorView& t, int count) {
  if (count == 1) return t;
  if (t.shape().rank() < count) return invalid_argument("{} has fewer than {} dims", t.describe(), count);
  std::vector<int64_t> dims(t.shape().dims().begin() + count - 1, t.shape().dims().end());
  for (int i = 0; i + 1 < count; ++i) dims[0] *= t.shape()[i];
  SWARM_ASSIGN_OR_RETURN(Shape merged, Shape::from_dims(dims));
  return t.reshaped(merged);
}

// A stage whose first kRowDims dims index the rows; see Sequential and SequenceSequential.
template <int kRowDims, typename... Layers>
class LayerStage {
  static_assert(sizeof...(Layers) > 0, "a stage has at least one layer");
  static_assert(kRowDims == 1 || kRowDims == 2, "rows are indexed by (batch) or (batch, position)");
  using All = std::tuple<Layers...>;
  using Last = std::tuple_element_t<sizeof...(Layers) - 1, All>;

 public:
  using stage_concept = stage_t;
  using backend = typename std::tuple_element_t<0, All>::backend;
  static constexpr bool kHasLoss = LossLayer<Last>;
  static constexpr size_t kBodySize = sizeof...(Layers) - (kHasLoss ? 1 : 0);
  using Body = typename sequential_detail::ChainOfFirst<backend, All, std::make_index_sequence<kBodySize>>::type;
  using Loss = std::conditional_t<kHasLoss, Last, sequential_detail::NoLoss>;
  static_assert(std::same_as<typename Last::backend, backend>, "every layer of a stage runs on one backend");
  static_assert(!Body::takes_tokens || kRowDims == 2,
                "an Embedding takes tokens [batch, positions]: a stage that starts with one is a SequenceSequential");

  // The stage with its parameters seeded from `seed`; an error for a bad
  // layer size or a layer that does not take what the one before gives.
  static Result<LayerStage> create(uint64_t seed, Layers... layers) {
    All all(std::move(layers)...);
    LayerStage stage(body_of(all, std::make_index_sequence<kBodySize>{}), loss_of(all));
    SWARM_RETURN_IF_ERROR(stage.body_.initialize(seed));
    return stage;
  }

  bool takes_targets() const { return kHasLoss; }

  StageIoSpec io_spec() const {
    StageIoSpec spec;
    const int64_t in = body_.input_features(), out = body_.output_features(in);
    spec.input = Body::takes_tokens ? TensorSpec{DType::i32, {-1, -1}} : TensorSpec{DType::f32, row_dims({in})};
    spec.output = TensorSpec{DType::f32, row_dims({out})};
    if constexpr (kHasLoss) {
      const TensorSpec per_row = loss_.target_spec(out);  // its dim 0 is the rows
      std::vector<int64_t> dims(per_row.dims.begin() + 1, per_row.dims.end());
      spec.targets = TensorSpec{per_row.dtype, row_dims(dims)};
      if constexpr (requires { { loss_.metric_names() } -> std::same_as<std::vector<std::string>>; }) {
        spec.metrics = loss_.metric_names();
      }
      spec.output = TensorSpec{DType::f32, {static_cast<int64_t>(1 + spec.metrics.size())}};
    }
    return spec;
  }

  Result<Tensor> forward(const TensorView& input, const TensorView* targets) {
    SWARM_RETURN_IF_ERROR(check_request(input, targets));
    SWARM_ASSIGN_OR_RETURN(TensorView rows, rows_of_input(input));
    SWARM_ASSIGN_OR_RETURN(Tensor output, body_.forward(rows));
    if constexpr (kHasLoss) {
      SWARM_ASSIGN_OR_RETURN(TensorView target_rows, merge_leading_dims(*targets, kRowDims));
      SWARM_ASSIGN_OR_RETURN(output, loss_.forward(output, target_rows));
    } else {
      SWARM_ASSIGN_OR_RETURN(output, output.reshaped(output_shape(input, output.shape()[1])));
    }
    SWARM_RETURN_IF_ERROR(backend::synchronize(typename backend::stream_type{}));
    return output;
  }

  Result<Tensor> backward(const TensorView& input, const TensorView& grad_output, const TensorView* targets) {
    SWARM_RETURN_IF_ERROR(check_request(input, targets));
    SWARM_ASSIGN_OR_RETURN(TensorView rows, rows_of_input(input));
    Tensor grad_rows;
    if constexpr (kHasLoss) {
      SWARM_ASSIGN_OR_RETURN(TensorView target_rows, merge_leading_dims(*targets, kRowDims));
      SWARM_ASSIGN_OR_RETURN(typename Body::Trace trace, body_.trace(rows, /*with_output=*/true));
      SWARM_ASSIGN_OR_RETURN(Tensor grad_body_output, loss_.backward(trace.output(), target_rows, grad_output));
      SWARM_ASSIGN_OR_RETURN(grad_rows, body_.backward(rows, trace, grad_body_output));
    } else {
      const Shape expected = output_shape(input, body_.output_features(input_width(input)));
      if (grad_output.dtype() != DType::f32 || grad_output.shape() != expected) {
        return invalid_argument("the output gradient must be f32 {}, like the output, got {}", expected.to_string(),
                                grad_output.describe());
      }
      SWARM_ASSIGN_OR_RETURN(TensorView grad_output_rows, merge_leading_dims(grad_output, kRowDims));
      SWARM_ASSIGN_OR_RETURN(grad_rows, body_.backward(rows, grad_output_rows));
    }
    SWARM_RETURN_IF_ERROR(backend::synchronize(typename backend::stream_type{}));
    if (!grad_rows.defined()) return grad_rows;  // tokens have no gradient
    return grad_rows.reshaped(input.shape());
  }

  // What the layers before the loss give, for inference: a classifier's
  // logits, a regression's predictions. The stage's output for a stage without a loss.
  Result<Tensor> predict(const TensorView& input) const {
    SWARM_RETURN_IF_ERROR(check_input(input));
    SWARM_ASSIGN_OR_RETURN(TensorView rows, rows_of_input(input));
    SWARM_ASSIGN_OR_RETURN(Tensor output, body_.forward(rows));
    SWARM_RETURN_IF_ERROR(backend::synchronize(typename backend::stream_type{}));
    return output.reshaped(output_shape(input, output.shape()[1]));
  }

  std::vector<StageParameterView> parameter_views() {
    std::vector<StageParameterView> views;
    body_.append_parameter_views("", views);
    return views;
  }

  Status zero_grad() {
    SWARM_RETURN_IF_ERROR(body_.zero_grad());
    return backend::synchronize(typename backend::stream_type{});
  }

 private:
  LayerStage(Body body, Loss loss) : body_(std::move(body)), loss_(std::move(loss)) {}

  template <size_t... I>
  static Body body_of(All& all, std::index_sequence<I...>) {
    return Body(std::move(std::get<I>(all))...);
  }
  static Loss loss_of(All& all) {
    if constexpr (kHasLoss) {
      return std::move(std::get<sizeof...(Layers) - 1>(all));
    } else {
      return {};
    }
  }

  // [-1 for each row dim, then `rest`].
  static std::vector<int64_t> row_dims(std::vector<int64_t> rest) {
    rest.insert(rest.begin(), kRowDims, -1);
    return rest;
  }

  // Tokens go to the Embedding as [batch, positions]; vectors as rows.
  static Result<TensorView> rows_of_input(const TensorView& input) {
    if constexpr (Body::takes_tokens) {
      return input;
    } else {
      return merge_leading_dims(input, kRowDims);
    }
  }

  static int64_t input_width(const TensorView& input) {
    return Body::takes_tokens ? kAnyWidth : input.shape()[kRowDims];
  }

  static Shape row_shape(const TensorView& input) {
    return *Shape::from_dims(input.shape().dims().first(kRowDims));
  }

  // The input's row dims, then `width`.
  static Shape output_shape(const TensorView& input, int64_t width) {
    std::vector<int64_t> dims(input.shape().dims().begin(), input.shape().dims().begin() + kRowDims);
    dims.push_back(width);
    return *Shape::from_dims(dims);
  }

  // The layers check shapes too; this names the stage's contract in the error.
  Status check_input(const TensorView& input) const {
    const TensorSpec spec = io_spec().input;
    if (!admits(spec, input.dtype(), input.shape()) || input.numel() == 0 || input.device() != backend::device) {
      return invalid_argument("the stage takes {} on {}, got {}", describe(spec), device_name(backend::device),
                              input.describe());
    }
    return Status::ok();
  }

  Status check_request(const TensorView& input, const TensorView* targets) const {
    SWARM_RETURN_IF_ERROR(check_input(input));
    const StageIoSpec spec = io_spec();
    if (kHasLoss && targets == nullptr) {
      return invalid_argument("the stage computes the loss and needs targets {}", describe(*spec.targets));
    }
    if (!kHasLoss && targets != nullptr) {
      return invalid_argument("the stage takes no targets: only a stage that ends in a loss does");
    }
    if (kHasLoss && (!admits(*spec.targets, targets->dtype(), targets->shape()) ||
                     targets->device() != backend::device)) {
      return invalid_argument("the stage takes targets {} on {}, got {}", describe(*spec.targets),
                              device_name(backend::device), targets->describe());
    }
    if (kHasLoss && !std::equal(input.shape().dims().begin(), input.shape().dims().begin() + kRowDims,
                                targets->shape().dims().begin())) {
      return invalid_argument("the stage takes targets for rows {}, got {}", row_shape(input).to_string(),
                              targets->describe());
    }
    return Status::ok();
  }

  Body body_;
  [[no_unique_address]] Loss loss_;
};

template <typename... Layers>
using Sequential = LayerStage<1, Layers...>;
template <typename... Layers>
using SequenceSequential = LayerStage<2, Layers...>;

}  // namespace swarm::layers
