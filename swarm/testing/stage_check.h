// stage_check: what a user's stage must get right before a swarm can serve it,
// checked on one batch the user supplies.
//
// A swarm runs a stage's backward on another peer than its forward, adds up the
// gradients of many peers, and stacks requests that arrive together into one
// batch (swarm/peer/forward_batcher.h). So a stage must give the gradient of
// what its forward computes, the same bytes for the same input, and for a batch
// stacked from two the two results. Each check below is one of those promises;
// a failure names the tensor, the coordinate and both numbers.
//
//   auto report = swarm::testing::check_stage(stage, x, targets);  // or (stage, x)
//   CHECK_MESSAGE(report.ok(), report.to_string());
//
// The batch must have at least two rows (dim 0). Gradients are checked against
// central differences of the stage's own f32 forward, at a few coordinates of
// the input (when it is f32) and of every parameter; the objective is the loss
// for a stage that takes targets, else the output's dot product with a fixed
// random output gradient.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "swarm/api/stage.h"
#include "swarm/core/status.h"
#include "swarm/core/tensor.h"

namespace swarm::testing {

struct StageCheckOptions {
  int coordinates = 6;     // probed per input and per parameter
  double step = 1e-2;      // of the central difference, in the coordinate's units
  double tolerance = 5e-2;  // of |backward - differences|, relative to the tensor's gradient scale
  // Of a stacked batch's results against its halves', relative to the largest output.
  double stacking_tolerance = 1e-4;
  uint64_t seed = 1;
};

struct StageCheckReport {
  std::vector<std::string> failures;
  bool ok() const { return failures.empty(); }
  std::string to_string() const {
    std::string text = ok() ? "the stage passes every check" : "the stage fails:";
    for (const std::string& failure : failures) text += "\n  - " + failure;
    return text;
  }
};

namespace stage_check_detail {

// Rows [begin, end) of a row-major tensor, sharing its memory.
inline TensorView rows(const TensorView& t, int64_t begin, int64_t end) {
  std::vector<int64_t> dims(t.shape().dims().begin(), t.shape().dims().end());
  const int64_t row_bytes = static_cast<int64_t>(t.size_bytes()) / dims[0];
  dims[0] = end - begin;
  auto* data = static_cast<unsigned char*>(t.raw_data()) + begin * row_bytes;
  return TensorView(data, t.dtype(), *Shape::from_dims(dims), t.device());
}

inline double dot(const TensorView& a, const TensorView& b) {
  double total = 0;
  const auto x = a.span<float>(), y = b.span<float>();
  for (size_t i = 0; i < x.size(); ++i) total += double(x[i]) * y[i];
  return total;
}

inline double largest_magnitude(const TensorView& t) {
  double largest = 0;
  for (float v : t.span<float>()) largest = std::max(largest, double(std::fabs(v)));
  return largest;
}

inline double root_mean_square(const TensorView& t) {
  return t.numel() == 0 ? 0 : std::sqrt(dot(t, t) / static_cast<double>(t.numel()));
}

template <Stage S>
class Checker {
 public:
  Checker(S& stage, const TensorView& input, const TensorView* targets, const StageCheckOptions& options)
      : stage_(stage), input_(input), targets_(targets), options_(options), rng_(options.seed) {}

  StageCheckReport run() {
    if (!check_io()) return std::move(report_);
    if (!make_output_gradient()) return std::move(report_);
    check_determinism();
    check_stacking();
    check_gradients();
    return std::move(report_);
  }

 private:
  void fail(std::string what) { report_.failures.push_back(std::move(what)); }

  bool check_io() {
    const StageIoSpec spec = stage_.io_spec();
    if (input_.shape().rank() < 1 || input_.shape()[0] < 2) {
      fail(fmt::format("the batch must have at least two rows to check stacking, got {}", input_.describe()));
    }
    if (!admits(spec.input, input_.dtype(), input_.shape())) {
      fail(fmt::format("io_spec takes {} but the input is {}", describe(spec.input), input_.describe()));
    }
    if (stage_.takes_targets() != spec.targets.has_value()) fail("takes_targets() disagrees with io_spec().targets");
    if (spec.targets.has_value() != (targets_ != nullptr)) {
      fail(spec.targets ? "the stage takes targets and none were given" : "targets given to a stage without them");
    } else if (targets_ && !admits(*spec.targets, targets_->dtype(), targets_->shape())) {
      fail(fmt::format("io_spec takes targets {} but they are {}", describe(*spec.targets), targets_->describe()));
    }
    if (!report_.ok()) return false;
    auto output = stage_.forward(input_, targets_);
    if (!output.is_ok()) {
      fail("forward failed: " + output.status().to_string());
      return false;
    }
    if (!admits(spec.output, output->dtype(), output->shape())) {
      fail(fmt::format("io_spec returns {} but forward returned {}", describe(spec.output), output->view().describe()));
    } else if (output->dtype() != DType::f32) {
      fail("the checker needs an f32 output");
    }
    output_ = std::move(output).value();
    return report_.ok();
  }

  bool make_output_gradient() {
    if (targets_) {
      grad_output_ = *Tensor::empty(Shape{1}, DType::f32);
      grad_output_.data<float>()[0] = 1.0f;
      return true;
    }
    grad_output_ = *Tensor::empty(output_.shape(), DType::f32);
    std::normal_distribution<float> normal;
    for (float& g : grad_output_.span<float>()) g = normal(rng_);
    return true;
  }

  // The scalar whose gradient backward computes.
  Result<double> objective(const TensorView& input) {
    // As an optimizer does around its writes: a stage that keeps a compute copy of
    // its parameters refreshes it from the views, and forgets cached activations.
    stage_.parameter_views();
    drop_cached_activations(stage_);
    SWARM_ASSIGN_OR_RETURN(Tensor out, stage_.forward(input, targets_));
    return targets_ ? double(out.data<float>()[0]) : dot(out, grad_output_);
  }

  struct Gradients {
    Tensor input;
    std::vector<Tensor> parameters;
  };
  Result<Gradients> gradients() {
    SWARM_RETURN_IF_ERROR(stage_.zero_grad());
    drop_cached_activations(stage_);
    Gradients g;
    SWARM_ASSIGN_OR_RETURN(g.input, stage_.backward(input_, grad_output_, targets_));
    for (const StageParameterView& p : stage_.parameter_views()) {
      SWARM_ASSIGN_OR_RETURN(Tensor copy, Tensor::copy_of(p.grad));
      g.parameters.push_back(std::move(copy));
    }
    return g;
  }

  void check_determinism() {
    auto again = stage_.forward(input_, targets_);
    if (!again.is_ok() || !bitwise_equal(*again, output_)) fail("forward is not deterministic: the same input gave other bytes");
    auto first = gradients(), second = gradients();
    if (!first.is_ok() || !second.is_ok()) {
      fail("backward failed: " + (first.is_ok() ? second.status() : first.status()).to_string());
      return;
    }
    if (first->input.defined() != second->input.defined() ||
        (first->input.defined() && !bitwise_equal(first->input, second->input))) {
      fail("backward is not deterministic: the input gradient differs between two runs");
    }
    const std::vector<StageParameterView> names = stage_.parameter_views();
    for (size_t i = 0; i < first->parameters.size(); ++i) {
      if (!bitwise_equal(first->parameters[i], second->parameters[i])) {
        fail(fmt::format("backward is not deterministic: parameter {}'s gradient differs between two runs",
                         names[i].name));
      }
    }
  }

  // The forward batcher stacks requests into one batch and hands each its rows.
  void check_stacking() {
    const int64_t n = input_.shape()[0], split = n / 2;
    const TensorView top_targets = targets_ ? rows(*targets_, 0, split) : TensorView();
    const TensorView bottom_targets = targets_ ? rows(*targets_, split, n) : TensorView();
    drop_cached_activations(stage_);
    auto top = stage_.forward(rows(input_, 0, split), targets_ ? &top_targets : nullptr);
    auto bottom = stage_.forward(rows(input_, split, n), targets_ ? &bottom_targets : nullptr);
    if (!top.is_ok() || !bottom.is_ok()) {
      fail("forward of part of the batch failed: " + (top.is_ok() ? bottom.status() : top.status()).to_string());
      return;
    }
    const Tensor& first = *top;
    const Tensor& second = *bottom;
    const double scale = std::max(largest_magnitude(output_), 1e-12);
    if (targets_) {
      // The loss, and each metric after it, is a mean over rows: the halves' values, weighted by their rows.
      const auto whole = output_.span<float>();
      const std::vector<std::string> names = stage_.io_spec().metrics;
      if (first.numel() != output_.numel() || second.numel() != output_.numel()) {
        fail("the loss of part of the batch has another shape than the whole batch's");
        return;
      }
      for (size_t i = 0; i < whole.size(); ++i) {
        const double stacked = (split * first.span<float>()[i] + (n - split) * second.span<float>()[i]) / double(n);
        if (std::fabs(stacked - whole[i]) > options_.stacking_tolerance * scale) {
          const std::string what = i == 0 ? "loss" : i - 1 < names.size() ? "metric " + names[i - 1] : "value";
          fail(fmt::format("the {} of the whole batch is {} but its halves' weighted mean is {}: it must be a mean "
                           "over rows, each row's independent of the others",
                           what, whole[i], stacked));
        }
      }
      return;
    }
    double worst = 0;
    const auto whole = output_.span<float>();
    const auto a = first.span<float>(), b = second.span<float>();
    for (size_t i = 0; i < whole.size(); ++i) {
      const float part = i < a.size() ? a[i] : b[i - a.size()];
      worst = std::max(worst, double(std::fabs(part - whole[i])));
    }
    if (a.size() + b.size() != whole.size() || worst > options_.stacking_tolerance * scale) {
      fail(fmt::format("a batch stacked from two halves does not give the halves' outputs (largest difference {} "
                       "of outputs up to {}): a row's output must not depend on the other rows",
                       worst, scale));
    }
  }

  // Backward against central differences of the forward at a few coordinates of `values`.
  void probe(const std::string& what, float* values, int64_t count, const TensorView& analytic,
             const TensorView& input) {
    const double scale = std::max(root_mean_square(analytic), 1e-6);
    std::uniform_int_distribution<int64_t> pick(0, count - 1);
    for (int k = 0; k < options_.coordinates; ++k) {
      const int64_t i = pick(rng_);
      const float kept = values[i];
      values[i] = kept + static_cast<float>(options_.step);
      auto up = objective(input);
      values[i] = kept - static_cast<float>(options_.step);
      auto down = objective(input);
      values[i] = kept;
      if (!up.is_ok() || !down.is_ok()) {
        fail(fmt::format("forward failed while probing {}: {}", what, (up.is_ok() ? down : up).status().to_string()));
        return;
      }
      const double numeric = (*up - *down) / (2 * options_.step);
      const double given = analytic.data<float>()[i];
      // An f32 forward resolves the objective to a few ulps: below that, differences say nothing.
      const double resolution = 8 * FLT_EPSILON * std::max(std::fabs(*up), std::fabs(*down)) / (2 * options_.step);
      const double allowed =
          options_.tolerance * std::max({scale, std::fabs(given), std::fabs(numeric)}) + resolution;
      if (std::fabs(given - numeric) > allowed) {
        fail(fmt::format("{} gradient at [{}]: backward gives {:.6g}, finite differences {:.6g}", what, i, given,
                         numeric));
        return;  // one coordinate per tensor says enough
      }
    }
    drop_cached_activations(stage_);
  }

  void check_gradients() {
    auto g = gradients();
    if (!g.is_ok()) return;  // check_determinism reported it
    if (input_.dtype() == DType::f32) {
      if (!g->input.defined() || g->input.shape() != input_.shape()) {
        fail(fmt::format("backward of an f32 input must return its gradient shaped {}", input_.shape().to_string()));
      } else {
        Tensor probed = *Tensor::copy_of(input_);
        probe("input", probed.data<float>(), probed.numel(), g->input, probed);
      }
    }
    const std::vector<StageParameterView> views = stage_.parameter_views();
    for (size_t p = 0; p < views.size(); ++p) {
      if (views[p].value.dtype() != DType::f32) continue;
      probe("parameter " + views[p].name, views[p].value.data<float>(), views[p].value.numel(), g->parameters[p],
            input_);
    }
  }

  S& stage_;
  TensorView input_;
  const TensorView* targets_;
  StageCheckOptions options_;
  std::mt19937_64 rng_;
  StageCheckReport report_;
  Tensor output_, grad_output_;
};

}  // namespace stage_check_detail

// Every check on `input`, and `targets` for a stage that takes them. The stage's
// parameters are restored and its gradient accumulators zeroed afterwards.
template <Stage S>
StageCheckReport check_stage(S& stage, const TensorView& input, const TensorView& targets,
                             const StageCheckOptions& options = {}) {
  StageCheckReport report = stage_check_detail::Checker<S>(stage, input, &targets, options).run();
  if (Status zeroed = stage.zero_grad(); !zeroed.is_ok()) report.failures.push_back("zero_grad failed");
  return report;
}
template <Stage S>
StageCheckReport check_stage(S& stage, const TensorView& input, const StageCheckOptions& options = {}) {
  StageCheckReport report = stage_check_detail::Checker<S>(stage, input, nullptr, options).run();
  if (Status zeroed = stage.zero_grad(); !zeroed.is_ok()) report.failures.push_back("zero_grad failed");
  return report;
}

}  // namespace swarm::testing
