// Boundary layers at stage cuts (models/gpt/boundary.h) on the CPU backend:
// gradients of a two-stage split against central finite differences for each
// compressing layer, the widths stages declare and check, parameter names,
// counts and weight decay, configs with none at every cut against configs
// without boundary layers (bit for bit), and the refusals.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/ops.h"
#include "models/gpt/gpt_model.h"
#include "tests/models/gpt/tiny_gpt.h"
// For GptStage<CpuWithoutMaxout>, a backend this test instantiates itself.
#include "models/gpt/gpt_stage_impl.h"

namespace swarm::gpt {
namespace {

using Stage = GptStage<CpuBackend>;
using Model = GptModel<CpuBackend>;

using testing::Batch;
using testing::random_batch;

GptConfig tiny_config(const std::string& boundaries) {
  GptConfig config = testing::tiny_config();
  if (!boundaries.empty()) config.boundaries = *parse_boundary_layers(boundaries);
  return config;
}

Tensor one_tensor() {
  Tensor one = *Tensor::empty(Shape{1}, DType::f32);
  one.data<float>()[0] = 1.0f;
  return one;
}

// Two stages chained by hand, as peers chain them: the hidden tensor crossing
// the cut is visible, and so is its gradient.
struct TwoStages {
  Stage first, last;
  Batch batch;

  std::vector<Parameter*> parameters() {
    std::vector<Parameter*> all;
    for (Stage* stage : {&first, &last}) {
      for (Parameter& p : stage->parameters()) all.push_back(&p);
    }
    return all;
  }
  double loss_of_hidden(const Tensor& hidden) {
    TensorView targets = batch.targets;
    return last.forward(hidden, &targets)->data<float>()[0];
  }
  double loss() { return loss_of_hidden(*first.forward(batch.inputs, nullptr)); }
  // Returns the gradient crossing the cut; adds into every parameter gradient.
  Tensor forward_backward() {
    REQUIRE(first.zero_grad().is_ok());
    REQUIRE(last.zero_grad().is_ok());
    auto hidden = first.forward(batch.inputs, nullptr);
    REQUIRE(hidden.is_ok());
    TensorView targets = batch.targets;
    REQUIRE(last.forward(*hidden, &targets).is_ok());
    auto grad_hidden = last.backward_after_forward(one_tensor());
    REQUIRE(grad_hidden.is_ok());
    auto none = first.backward_after_forward(*grad_hidden);
    REQUIRE(none.is_ok());
    return *grad_hidden;
  }
};

TwoStages make_two_stages(const GptConfig& config, uint64_t seed, uint32_t redraw_seed) {
  auto layouts = partition_layers(config, 2);
  REQUIRE(layouts.is_ok());
  auto first = Stage::create(config, (*layouts)[0], seed);
  auto last = Stage::create(config, (*layouts)[1], seed);
  REQUIRE_MESSAGE(first.is_ok(), first.status().to_string());
  REQUIRE_MESSAGE(last.is_ok(), last.status().to_string());
  TwoStages stages{std::move(*first), std::move(*last), random_batch(config, 2, 5, 9)};
  // As in the whole-model check: O(1) parameters so that a step of 1e-2
  // measures the slope rather than LayerNorm's curvature at GPT-2's init.
  std::mt19937 rng(redraw_seed);
  std::normal_distribution<float> normal(0.0f, 0.4f);
  for (Parameter* p : stages.parameters()) {
    const bool gain = p->name.find("ln") != std::string::npos && p->name.find("weight") != std::string::npos;
    for (float& x : p->value.span<float>()) x = (gain ? 1.0f : 0.0f) + normal(rng);
  }
  return stages;
}

// The smallest gap, over all rows and outputs, between the largest and the
// second-largest of maxout's k candidates: the sender's LayerNorm output,
// recomputed here from a copy of the first stage without the boundary layer.
double smallest_maxout_gap(TwoStages& stages, const GptConfig& config, int k) {
  GptConfig plain = config;
  plain.boundaries.clear();
  auto layout = (*partition_layers(plain, 2))[0];
  auto blocks_only = Stage::create(plain, layout, 0);
  REQUIRE(blocks_only.is_ok());
  std::map<std::string, Parameter*> by_name;
  for (Parameter* p : stages.parameters()) by_name[p->name] = p;
  for (Parameter& p : blocks_only->parameters()) REQUIRE(p.value.copy_from(by_name.at(p.name)->value).is_ok());
  Tensor x = *blocks_only->forward(stages.batch.inputs, nullptr);
  const int C = config.d_model, N = static_cast<int>(x.numel() / C), W = C / k;
  std::vector<float> ln(x.numel()), mean(N), rstd(N);
  cpu::layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data<float>(),
                         by_name.at("boundary.0.ln.weight")->value.data<float>(),
                         by_name.at("boundary.0.ln.bias")->value.data<float>(), N, C);
  double smallest = INFINITY;
  for (int n = 0; n < N; ++n) {
    for (int j = 0; j < W; ++j) {
      std::vector<float> candidates;
      for (int g = 0; g < k; ++g) candidates.push_back(ln[n * C + g * W + j]);
      std::sort(candidates.rbegin(), candidates.rend());
      smallest = std::min(smallest, double(candidates[0]) - candidates[1]);
    }
  }
  return smallest;
}

constexpr float kStep = 1e-2f;
// Per tensor, relative to its largest gradient entry: fp32 losses and h = 1e-2
// leave ~1e-3 of noise and O(h^2) curvature error at this scale.
constexpr double kTolerance = 2e-2;

void check_against_finite_differences(const std::string& what, float* values, const float* grads, int64_t n,
                                      const std::function<double()>& loss) {
  CAPTURE(what);
  double scale = 1e-8;
  for (int64_t i = 0; i < n; ++i) scale = std::max(scale, double(std::fabs(grads[i])));
  const int64_t stride = std::max<int64_t>(1, n / 7);
  for (int64_t i = 0; i < n; i += stride) {
    const float saved = values[i];
    values[i] = saved + kStep;
    const double plus = loss();
    values[i] = saved - kStep;
    const double minus = loss();
    values[i] = saved;
    const double numeric = (plus - minus) / (2 * kStep);
    CAPTURE(i);
    CAPTURE(numeric);
    CAPTURE(grads[i]);
    CAPTURE(scale);
    CHECK(std::fabs(numeric - grads[i]) / scale < kTolerance);
  }
}

TEST_CASE("boundary layers: a two-stage split's gradients match central finite differences") {
  for (const std::string text : {"bottleneck:2", "bottleneck:4", "maxout:2", "maxout:4"}) {
    CAPTURE(text);
    const GptConfig config = tiny_config(text);
    const BoundaryLayer layer = config.boundaries[0];
    // Maxout is piecewise linear: a finite difference is its slope only while
    // no step moves an argmax. Take the first re-draw whose candidates are
    // separated by far more than the step (the LayerNorm outputs move by
    // O(step) per parameter step).
    uint32_t redraw = 13;
    if (layer.kind == BoundaryKind::maxout) {
      const double margin = 10 * kStep;
      double gap = 0;
      for (; redraw < 13 + 500; ++redraw) {
        TwoStages probe = make_two_stages(config, 5, redraw);
        gap = smallest_maxout_gap(probe, config, layer.k);
        if (gap > margin) break;
      }
      MESSAGE(text << ": re-draw seed " << redraw << ", smallest gap between maxout candidates " << gap);
      REQUIRE(gap > margin);
    }
    TwoStages stages = make_two_stages(config, 5, redraw);
    Tensor grad_hidden = stages.forward_backward();
    const int64_t width = config.d_model / layer.k;
    REQUIRE(grad_hidden.shape() == Shape{2, 5, width});

    // The gradient crossing the cut: d(loss)/d(wire), through the receiver alone.
    Tensor hidden = *stages.first.forward(stages.batch.inputs, nullptr);
    check_against_finite_differences("gradient crossing the cut", hidden.data<float>(), grad_hidden.data<float>(),
                                     hidden.numel(), [&] { return stages.loss_of_hidden(hidden); });
    // Every parameter, boundary layers first; the sender's block parameters see
    // the compression's backward, the receiver's the expansion's forward.
    int boundary_params = 0;
    for (Parameter* p : stages.parameters()) {
      if (p->name.rfind("boundary.", 0) == 0) ++boundary_params;
      check_against_finite_differences(p->name, p->value.data<float>(), p->grad.data<float>(), p->value.numel(),
                                       [&] { return stages.loss(); });
    }
    CHECK(boundary_params == (layer.kind == BoundaryKind::bottleneck ? 8 : 6));
  }
}

TEST_CASE("stages declare and check the compressed width at their cut") {
  const GptConfig config = tiny_config("bottleneck:4,none");  // d_model 8: 2 across the first cut
  auto layouts = partition_layers(config, 3);
  REQUIRE(layouts.is_ok());
  std::vector<Stage> stages;
  for (const StageLayout& layout : *layouts) stages.push_back(*Stage::create(config, layout, 1));
  CHECK(stages[0].io_spec().input == TensorSpec{DType::i32, {-1, -1}});
  CHECK(stages[0].io_spec().output == TensorSpec{DType::f32, {-1, -1, 2}});
  CHECK(stages[1].io_spec().input == TensorSpec{DType::f32, {-1, -1, 2}});
  CHECK(stages[1].io_spec().output == TensorSpec{DType::f32, {-1, -1, 8}});
  CHECK(stages[2].io_spec().input == TensorSpec{DType::f32, {-1, -1, 8}});

  for (const std::string text : {"bottleneck:2", "bottleneck:4", "maxout:2", "maxout:4"}) {
    CAPTURE(text);
    const GptConfig two = tiny_config(text);
    const int64_t width = two.d_model / two.boundaries[0].k;
    auto split = partition_layers(two, 2);
    Stage first = *Stage::create(two, (*split)[0], 1), last = *Stage::create(two, (*split)[1], 1);
    CHECK(first.io_spec().output == TensorSpec{DType::f32, {-1, -1, width}});
    CHECK(last.io_spec().input == TensorSpec{DType::f32, {-1, -1, width}});
    Batch batch = random_batch(two, 1, 4, 2);
    auto hidden = first.forward(batch.inputs, nullptr);
    REQUIRE(hidden.is_ok());
    CHECK(hidden->shape() == Shape{1, 4, width});
    // The full width is refused at both ends of the cut.
    Tensor full = *Tensor::zeros(Shape{1, 4, 8}, DType::f32);
    auto refused = last.forward(full, nullptr).status();
    CHECK(refused.code() == StatusCode::invalid_argument);
    CHECK(refused.message().find(fmt::format("[batch, seq, {}]", width)) != std::string::npos);
    CHECK(first.backward_after_forward(full).status().code() == StatusCode::invalid_argument);
    CHECK(last.forward(*hidden, nullptr).is_ok());
  }
}

TEST_CASE("boundary parameters: global names, the counted total, weight decay on weights only") {
  const GptConfig config = tiny_config("bottleneck:2,maxout:4");
  auto model = Model::create(config, 3, 7);
  REQUIRE(model.is_ok());
  std::map<std::string, int> stage_of;
  std::map<std::string, bool> decays;
  int64_t total = 0;
  for (size_t s = 0; s < model->stages().size(); ++s) {
    for (const Parameter& p : model->stages()[s].parameters()) {
      stage_of[p.name] = static_cast<int>(s);
      decays[p.name] = p.apply_weight_decay;
      total += p.value.numel();
    }
  }
  CHECK(total == config.parameter_count(3));
  const std::map<std::string, int> expected = {
      {"boundary.0.ln.weight", 0}, {"boundary.0.ln.bias", 0},    {"boundary.0.down.weight", 0},
      {"boundary.0.down.bias", 0}, {"boundary.0.up.weight", 1},  {"boundary.0.up.bias", 1},
      {"boundary.0.up_ln.weight", 1}, {"boundary.0.up_ln.bias", 1}, {"boundary.1.ln.weight", 1},
      {"boundary.1.ln.bias", 1},   {"boundary.1.up.weight", 2},  {"boundary.1.up.bias", 2},
      {"boundary.1.up_ln.weight", 2}, {"boundary.1.up_ln.bias", 2}};
  for (const auto& [name, stage] : expected) {
    CAPTURE(name);
    REQUIRE(stage_of.count(name) == 1);
    CHECK(stage_of[name] == stage);
    const bool projection =
        name.find(".down.weight") != std::string::npos || name.find(".up.weight") != std::string::npos;
    CHECK(decays[name] == projection);
  }
  CHECK(stage_of.count("boundary.1.down.weight") == 0);  // maxout has no projection

  // Keyed by (seed, name): another split with the same cut starts identical.
  auto other = Model::create(tiny_config("bottleneck:2"), 2, 7);
  REQUIRE(other.is_ok());
  std::map<std::string, Tensor> values;
  for (Parameter* p : model->parameters()) values[p->name] = p->value;
  for (Parameter* p : other->parameters()) {
    if (p->name.rfind("boundary.0.", 0) == 0) CHECK(bitwise_equal(values.at(p->name), p->value));
  }
}

TEST_CASE("none at every cut is bit for bit the model without boundary layers") {
  for (int stages : {2, 3}) {
    CAPTURE(stages);
    const GptConfig plain = tiny_config("");
    Batch batch = random_batch(plain, 3, 6, 21);
    auto reference = Model::create(plain, stages, 77);
    REQUIRE(reference.is_ok());
    REQUIRE(reference->zero_grad().is_ok());
    const float reference_loss = *reference->forward_backward(batch.inputs, batch.targets);
    const std::vector<std::string> texts =
        stages == 2 ? std::vector<std::string>{"none"} : std::vector<std::string>{"none", "none,none"};
    for (const std::string& text : texts) {
      CAPTURE(text);
      const GptConfig explicit_none = tiny_config(text);
      CHECK_FALSE(explicit_none == plain);
      auto model = Model::create(explicit_none, stages, 77);
      REQUIRE(model.is_ok());
      REQUIRE(model->zero_grad().is_ok());
      const float loss = *model->forward_backward(batch.inputs, batch.targets);
      CHECK(std::memcmp(&loss, &reference_loss, sizeof(float)) == 0);
      auto ours = model->parameters(), theirs = reference->parameters();
      REQUIRE(ours.size() == theirs.size());
      for (size_t i = 0; i < ours.size(); ++i) {
        CAPTURE(theirs[i]->name);
        CHECK(ours[i]->name == theirs[i]->name);
        CHECK(bitwise_equal(ours[i]->value, theirs[i]->value));
        CHECK(bitwise_equal(ours[i]->grad, theirs[i]->grad));
      }
      for (size_t s = 0; s < model->stages().size(); ++s) {
        const StageIoSpec a = model->stages()[s].io_spec(), b = reference->stages()[s].io_spec();
        CHECK((a.input == b.input && a.targets == b.targets && a.output == b.output));
      }
    }
  }
}

TEST_CASE("a boundary list that does not fit the stages is refused by GptStage::create") {
  const GptConfig config = tiny_config("bottleneck:2,none");  // two cuts: three stages
  CHECK(partition_layers(config, 3).is_ok());
  const StageLayout two_stage_first{0, 2, 0, 2};
  auto status = Stage::create(config, two_stage_first, 1).status();
  CHECK(status.code() == StatusCode::invalid_argument);
  CAPTURE(status.message());
  CHECK(status.message().find("lists 2 boundary layers") != std::string::npos);
  CHECK(status.message().find("2 stages have 1 boundary between them") != std::string::npos);
  // The one-stage model has no cuts, and takes a single boundary layer (for all cuts) as is.
  CHECK(Model::create(tiny_config("maxout:2"), 1, 1).is_ok());
  CHECK_FALSE(Model::create(config, 1, 1).is_ok());
}

// The CPU backend with the maxout op hidden behind a wrong tag.
struct CpuWithoutMaxout : CpuBackend {
  using maxout_concept = void;
};
static_assert(Backend<CpuWithoutMaxout> && !MaxoutBackend<CpuWithoutMaxout>);

TEST_CASE("a backend without maxout refuses a stage that ends in maxout, and serves the rest") {
  const GptConfig config = tiny_config("maxout:2");
  auto layouts = *partition_layers(config, 2);
  auto sender = GptStage<CpuWithoutMaxout>::create(config, layouts[0], 1);
  CHECK(sender.status().code() == StatusCode::unimplemented);
  CAPTURE(sender.status().message());
  CHECK(sender.status().message().find("maxout:2") != std::string::npos);
  CHECK(sender.status().message().find("MaxoutBackend") != std::string::npos);
  // The receiver only expands (Linear + LayerNorm): no maxout op needed.
  CHECK(GptStage<CpuWithoutMaxout>::create(config, layouts[1], 1).is_ok());
  CHECK(GptStage<CpuWithoutMaxout>::create(tiny_config("bottleneck:2"), layouts[0], 1).is_ok());
}

}  // namespace
}  // namespace swarm::gpt
