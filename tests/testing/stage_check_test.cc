// The stage checker passes the stages the swarm ships, and catches each broken
// promise in a stage that wraps one: a wrong backward, a row that depends on the
// others, an answer that changes between runs.
#include <random>

#include <doctest/doctest.h>

#include "kernels/cpu/cpu_backend.h"
#include "models/gpt/config.h"
#include "models/gpt/gpt_stage.h"
#include "models/mlp/mlp_stage.h"
#include "swarm/testing/stage_check.h"

namespace swarm {
namespace {

using mlp::MlpStage;
using testing::check_stage;
using testing::StageCheckReport;

Tensor normal_tensor(Shape shape, uint64_t seed) {
  Tensor t = *Tensor::empty(shape, DType::f32);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  for (float& v : t.span<float>()) v = normal(rng);
  return t;
}

bool names(const StageCheckReport& report, std::string_view what) {
  return report.to_string().find(what) != std::string::npos;
}

// An MLP layer with one promise broken, chosen by `Flaw`.
enum class Flaw { backward_doubled, bias_gradient_dropped, batch_mean_subtracted, forward_drifts };

template <Flaw F>
class Flawed {
 public:
  using stage_concept = stage_t;
  explicit Flawed(MlpStage inner) : inner_(std::move(inner)) {}
  bool takes_targets() const { return inner_.takes_targets(); }
  StageIoSpec io_spec() const { return inner_.io_spec(); }
  Result<Tensor> forward(const TensorView& input, const TensorView* targets) {
    SWARM_ASSIGN_OR_RETURN(Tensor out, inner_.forward(input, targets));
    if constexpr (F == Flaw::batch_mean_subtracted) {
      // Normalizes over the batch, as batch norm does: a row's output depends on its neighbours.
      const int64_t rows = out.shape()[0], width = out.numel() / rows;
      for (int64_t j = 0; j < width; ++j) {
        double mean = 0;
        for (int64_t r = 0; r < rows; ++r) mean += out.data<float>()[r * width + j];
        mean /= double(rows);
        for (int64_t r = 0; r < rows; ++r) out.data<float>()[r * width + j] -= static_cast<float>(mean);
      }
    }
    if constexpr (F == Flaw::forward_drifts) out.data<float>()[0] += 1e-3f * static_cast<float>(++calls_);
    return out;
  }
  Result<Tensor> backward(const TensorView& input, const TensorView& grad, const TensorView* targets) {
    SWARM_ASSIGN_OR_RETURN(Tensor dinput, inner_.backward(input, grad, targets));
    if constexpr (F == Flaw::backward_doubled) {
      for (float& v : dinput.span<float>()) v *= 2.0f;
    }
    if constexpr (F == Flaw::bias_gradient_dropped) {
      for (float& v : inner_.parameter_views()[1].grad.span<float>()) v = 0.0f;
    }
    return dinput;
  }
  std::vector<StageParameterView> parameter_views() { return inner_.parameter_views(); }
  Status zero_grad() { return inner_.zero_grad(); }

 private:
  MlpStage inner_;
  int calls_ = 0;
};

MlpStage hidden_layer() { return *MlpStage::create({.in = 4, .out = 6, .gelu = true}, 7); }

TEST_CASE("the checker passes the MLP's hidden and loss stages") {
  MlpStage hidden = hidden_layer();
  const Tensor x = normal_tensor(Shape{6, 4}, 1);
  StageCheckReport report = check_stage(hidden, x);
  CHECK_MESSAGE(report.ok(), report.to_string());

  MlpStage loss = *MlpStage::create({.in = 4, .out = 2, .loss = true}, 8);
  const Tensor targets = normal_tensor(Shape{6, 2}, 2);
  report = check_stage(loss, x, targets);
  CHECK_MESSAGE(report.ok(), report.to_string());
  // Its parameters are as they were, and nothing is left accumulated.
  for (const StageParameterView& p : loss.parameter_views()) {
    for (float g : p.grad.span<float>()) CHECK(g == 0.0f);
  }
}

TEST_CASE("the checker passes a GPT middle stage and a GPT head stage") {
  gpt::GptConfig config;
  config.vocab_size = 11;
  config.max_seq_len = 6;
  config.d_model = 8;
  config.n_heads = 2;
  config.n_layers = 3;
  auto layouts = *gpt::partition_layers(config, 3);
  auto middle = *gpt::GptStage<CpuBackend>::create(config, layouts[1], 3);
  const Tensor hidden = normal_tensor(Shape{2, 5, config.d_model}, 3);
  StageCheckReport report = check_stage(middle, hidden);
  CHECK_MESSAGE(report.ok(), report.to_string());

  auto head = *gpt::GptStage<CpuBackend>::create(config, layouts[2], 4);
  Tensor tokens = *Tensor::empty(Shape{2, 5}, DType::i32);
  for (int i = 0; i < 10; ++i) tokens.data<int32_t>()[i] = (i * 7) % config.vocab_size;
  report = check_stage(head, hidden, tokens);
  CHECK_MESSAGE(report.ok(), report.to_string());
}

TEST_CASE("the checker catches a wrong input gradient and a dropped parameter gradient, naming them") {
  const Tensor x = normal_tensor(Shape{6, 4}, 1);
  Flawed<Flaw::backward_doubled> doubled(hidden_layer());
  StageCheckReport report = check_stage(doubled, x);
  CHECK_FALSE(report.ok());
  CHECK_MESSAGE(names(report, "input gradient at"), report.to_string());
  CHECK_FALSE(names(report, "parameter weight gradient"));  // the parameters' are right

  Flawed<Flaw::bias_gradient_dropped> dropped(hidden_layer());
  report = check_stage(dropped, x);
  CHECK_MESSAGE(names(report, "parameter bias gradient at"), report.to_string());
  CHECK_FALSE(names(report, "input gradient at"));
}

TEST_CASE("the checker catches a stage whose rows depend on the rest of the batch") {
  Flawed<Flaw::batch_mean_subtracted> batch_dependent(hidden_layer());
  StageCheckReport report = check_stage(batch_dependent, normal_tensor(Shape{6, 4}, 1));
  CHECK_FALSE(report.ok());
  CHECK_MESSAGE(names(report, "stacked from two halves"), report.to_string());
}

// A loss stage that reports, as a "metric", how many rows its batch had: a value
// that is no mean over rows, so the trainers' averages of it would mean nothing.
class CountsRows {
 public:
  using stage_concept = stage_t;
  explicit CountsRows(MlpStage inner) : inner_(std::move(inner)) {}
  bool takes_targets() const { return true; }
  StageIoSpec io_spec() const {
    StageIoSpec spec = inner_.io_spec();
    spec.metrics = {"rows"};
    spec.output = TensorSpec{DType::f32, {2}};
    return spec;
  }
  Result<Tensor> forward(const TensorView& input, const TensorView* targets) {
    SWARM_ASSIGN_OR_RETURN(Tensor loss, inner_.forward(input, targets));
    Tensor out = *Tensor::empty(Shape{2}, DType::f32);
    out.data<float>()[0] = loss.data<float>()[0];
    out.data<float>()[1] = static_cast<float>(input.shape()[0]);
    return out;
  }
  Result<Tensor> backward(const TensorView& input, const TensorView& grad, const TensorView* targets) {
    return inner_.backward(input, grad, targets);
  }
  std::vector<StageParameterView> parameter_views() { return inner_.parameter_views(); }
  Status zero_grad() { return inner_.zero_grad(); }

 private:
  MlpStage inner_;
};

TEST_CASE("the checker catches a metric that is no mean over rows, naming it") {
  CountsRows counts(*MlpStage::create({.in = 4, .out = 2, .loss = true}, 8));
  StageCheckReport report = check_stage(counts, normal_tensor(Shape{6, 4}, 1), normal_tensor(Shape{6, 2}, 2));
  CHECK_FALSE(report.ok());
  CHECK_MESSAGE(names(report, "metric rows"), report.to_string());
  CHECK_FALSE(names(report, "the loss of the whole batch"));  // its loss is fine
}

TEST_CASE("the checker catches a forward that changes between runs") {
  Flawed<Flaw::forward_drifts> drifting(hidden_layer());
  StageCheckReport report = check_stage(drifting, normal_tensor(Shape{6, 4}, 1));
  CHECK_MESSAGE(names(report, "forward is not deterministic"), report.to_string());
}

TEST_CASE("the checker refuses a batch its io_spec does not admit, or of one row") {
  MlpStage hidden = hidden_layer();
  CHECK(names(check_stage(hidden, normal_tensor(Shape{6, 5}, 1)), "io_spec takes f32 [-1, 4]"));
  CHECK(names(check_stage(hidden, normal_tensor(Shape{1, 4}, 1)), "at least two rows"));
  const Tensor targets = normal_tensor(Shape{6, 6}, 2);
  CHECK(names(check_stage(hidden, normal_tensor(Shape{6, 4}, 1), targets), "targets given to a stage without them"));
}

}  // namespace
}  // namespace swarm
