// Sequential stages: what they declare (io_spec, parameter names), what they
// refuse (bad input is an invalid_argument, never a crash), and what their
// forward and backward compute beyond what the stage checker sees.
#include <doctest/doctest.h>

#include <cmath>
#include <set>
#include <string>

#include "tests/layers/classifier_stages.h"
#include "tests/layers/layer_test_util.h"

namespace swarm::layers::testing {
namespace {

using Stages = classifier::ClassifierStages<Cpu>;

void check_refused(const Status& status, const std::string& words) {
  CHECK(status.code() == StatusCode::invalid_argument);
  CHECK_MESSAGE(status.message().find(words) != std::string::npos, status.to_string());
}

TEST_CASE("the classifier's stages declare their shapes, and the trunk's output is the head's input") {
  auto trunk = Stages::make_trunk(1);
  auto head = Stages::make_head(2);
  REQUIRE(trunk.is_ok());
  REQUIRE(head.is_ok());
  const StageIoSpec trunk_spec = trunk->io_spec(), head_spec = head->io_spec();
  CHECK(trunk_spec.input == TensorSpec{DType::f32, {-1, 2}});
  CHECK(trunk_spec.output == TensorSpec{DType::f32, {-1, 16}});
  CHECK_FALSE(trunk_spec.targets.has_value());
  CHECK_FALSE(trunk->takes_targets());
  CHECK(head_spec.input == TensorSpec{DType::f32, {-1, 16}});
  REQUIRE(head_spec.targets.has_value());
  CHECK(*head_spec.targets == TensorSpec{DType::i32, {-1}});
  CHECK(head_spec.output == TensorSpec{DType::f32, {1}});
  CHECK(head->takes_targets());
  CHECK(fits(trunk_spec.output, head_spec.input));
}

TEST_CASE("parameters are named by layer index, unique, with weight decay on weights only") {
  auto trunk = Stages::make_trunk(1);
  REQUIRE(trunk.is_ok());
  const auto views = trunk->parameter_views();
  REQUIRE(views.size() == 4);
  CHECK(views[0].name == "0.weight");
  CHECK(views[0].value.shape() == Shape{16, 2});
  CHECK(views[0].apply_weight_decay);
  CHECK(views[1].name == "0.bias");
  CHECK_FALSE(views[1].apply_weight_decay);
  CHECK(views[2].name == "2.0.weight");
  CHECK(views[2].value.shape() == Shape{16, 16});
  CHECK(views[3].name == "2.0.bias");

  using Deep = Sequential<LayerNorm<Cpu>, Residual<Linear<Cpu>, Gelu<Cpu>, Linear<Cpu>>, Residual<LayerNorm<Cpu>>>;
  auto deep = Deep::create(1, LayerNorm<Cpu>(4), Residual(Linear<Cpu>(4, 8), Gelu<Cpu>(), Linear<Cpu>(8, 4)),
                           Residual(LayerNorm<Cpu>(4)));
  REQUIRE(deep.is_ok());
  std::set<std::string> names;
  for (const StageParameterView& view : deep->parameter_views()) names.insert(view.name);
  CHECK(names == std::set<std::string>{"0.weight", "0.bias", "1.0.weight", "1.0.bias", "1.2.weight", "1.2.bias",
                                       "2.0.weight", "2.0.bias"});
}

TEST_CASE("bad input to a stage is an invalid_argument that says what was expected") {
  auto trunk = Stages::make_trunk(1);
  auto head = Stages::make_head(2);
  REQUIRE(trunk.is_ok());
  REQUIRE(head.is_ok());
  const Tensor points = normal_tensor(Shape{4, 2}, 1), hidden = normal_tensor(Shape{4, 16}, 2);
  const Tensor labels = ids_tensor(Shape{4}, 3, 3);

  check_refused(trunk->forward(ids_tensor(Shape{4, 2}, 3, 4), nullptr).status(), "takes f32 [-1, 2]");
  check_refused(trunk->forward(normal_tensor(Shape{4, 3}, 5), nullptr).status(), "takes f32 [-1, 2]");
  check_refused(trunk->forward(normal_tensor(Shape{2, 2, 2}, 5), nullptr).status(), "takes f32 [-1, 2]");
  check_refused(trunk->forward(points, &labels.view()).status(), "takes no targets");
  check_refused(trunk->backward(points, normal_tensor(Shape{4, 15}, 6), nullptr).status(), "f32 [4, 16]");

  check_refused(head->forward(hidden, nullptr).status(), "needs targets i32 [-1]");
  check_refused(head->forward(hidden, &ids_tensor(Shape{5}, 3, 7).view()).status(), "targets for rows [4]");
  check_refused(head->forward(hidden, &normal_tensor(Shape{4}, 7).view()).status(), "targets i32 [-1]");
  Tensor bad_labels = labels.clone();
  bad_labels.data<int32_t>()[2] = 3;
  check_refused(head->forward(hidden, &bad_labels.view()).status(), "class id 3 at index 2 is outside [0, 3)");
  bad_labels.data<int32_t>()[2] = -1;
  check_refused(head->backward(hidden, scalar(1.0f), &bad_labels.view()).status(), "outside [0, 3)");
  check_refused(head->backward(hidden, normal_tensor(Shape{2}, 8), &labels.view()).status(), "f32 [1]");
}

TEST_CASE("bad tokens and targets of a sequence stage are refused") {
  using Model = SequenceSequential<Embedding<Cpu>, Linear<Cpu>, SoftmaxCrossEntropy<Cpu>>;
  auto model = Model::create(1, Embedding<Cpu>(5, 4, /*positions=*/3), Linear<Cpu>(4, 5), SoftmaxCrossEntropy<Cpu>());
  REQUIRE(model.is_ok());
  CHECK(model->io_spec().input == TensorSpec{DType::i32, {-1, -1}});
  CHECK(*model->io_spec().targets == TensorSpec{DType::i32, {-1, -1}});
  const Tensor tokens = ids_tensor(Shape{2, 3}, 5, 1), targets = ids_tensor(Shape{2, 3}, 5, 2);
  REQUIRE(model->forward(tokens, &targets.view()).is_ok());

  Tensor bad_tokens = tokens.clone();
  bad_tokens.data<int32_t>()[4] = 5;
  check_refused(model->forward(bad_tokens, &targets.view()).status(), "token 5 at index 4 is outside [0, 5)");
  check_refused(model->forward(ids_tensor(Shape{2, 4}, 5, 3), &ids_tensor(Shape{2, 4}, 5, 4).view()).status(),
                "has 3 positions, got rows of 4 tokens");
  check_refused(model->forward(normal_tensor(Shape{2, 3}, 5), &targets.view()).status(), "takes i32 [-1, -1]");
  check_refused(model->forward(tokens, &ids_tensor(Shape{6}, 5, 6).view()).status(), "targets i32 [-1, -1]");
  check_refused(model->forward(tokens, &ids_tensor(Shape{3, 2}, 5, 6).view()).status(),
                "targets for rows [2, 3], got i32[3, 2]");
}

TEST_CASE("create refuses layers that do not fit together, naming the layer") {
  using TwoLinear = Sequential<Linear<Cpu>, Tanh<Cpu>, Linear<Cpu>>;
  check_refused(TwoLinear::create(1, Linear<Cpu>(2, 16), Tanh<Cpu>(), Linear<Cpu>(8, 3)).status(),
                "layer 2 takes 8 features but the layer before gives 16");
  check_refused(Sequential<Residual<Linear<Cpu>>>::create(1, Residual(Linear<Cpu>(16, 8))).status(),
                "must keep the width, but they take 16 and give 8");
  check_refused(Sequential<Linear<Cpu>>::create(1, Linear<Cpu>(0, 3)).status(), "layer 0: Linear(0 -> 3)");
  check_refused(SequenceSequential<Embedding<Cpu>>::create(1, Embedding<Cpu>(0, 3)).status(), "sizes must be positive");
  check_refused(Sequential<LayerNorm<Cpu>>::create(1, LayerNorm<Cpu>(-1)).status(), "width must be positive");
}

std::vector<float> values_of(const StageParameterView& view) {
  auto span = view.value.span<float>();
  return {span.begin(), span.end()};
}

TEST_CASE("weights are seeded: the same seed gives the same weights, another seed and another layer others") {
  using Two = Sequential<Linear<Cpu>, Linear<Cpu>>;
  auto a = Two::create(7, Linear<Cpu>(4, 4), Linear<Cpu>(4, 4));
  auto b = Two::create(7, Linear<Cpu>(4, 4), Linear<Cpu>(4, 4));
  auto c = Two::create(8, Linear<Cpu>(4, 4), Linear<Cpu>(4, 4));
  REQUIRE((a.is_ok() && b.is_ok() && c.is_ok()));
  CHECK(values_of(a->parameter_views()[0]) == values_of(b->parameter_views()[0]));
  CHECK(values_of(a->parameter_views()[0]) != values_of(c->parameter_views()[0]));
  CHECK(values_of(a->parameter_views()[0]) != values_of(a->parameter_views()[2]));
  for (float w : values_of(a->parameter_views()[0])) CHECK(std::fabs(w) <= 0.5f);  // +-1/sqrt(in)
}

TEST_CASE("backward adds into the accumulators, needs no earlier forward, and zero_grad clears them") {
  auto trunk = Stages::make_trunk(1);
  REQUIRE(trunk.is_ok());
  const Tensor x = normal_tensor(Shape{5, 2}, 1), dy = normal_tensor(Shape{5, 16}, 2);
  auto once = trunk->backward(x, dy, nullptr);
  REQUIRE(once.is_ok());
  CHECK(once->shape() == x.shape());
  const std::vector<float> grad_once(trunk->parameter_views()[2].grad.span<float>().begin(),
                                     trunk->parameter_views()[2].grad.span<float>().end());
  // A forward of other data in between must not change what backward computes.
  REQUIRE(trunk->forward(normal_tensor(Shape{3, 2}, 3), nullptr).is_ok());
  REQUIRE(trunk->backward(x, dy, nullptr).is_ok());
  const auto grad_twice = trunk->parameter_views()[2].grad.span<float>();
  bool any_nonzero = false;
  for (size_t i = 0; i < grad_once.size(); ++i) {
    CHECK(grad_twice[i] == doctest::Approx(2 * grad_once[i]).epsilon(1e-5));
    any_nonzero = any_nonzero || grad_once[i] != 0;
  }
  CHECK(any_nonzero);
  REQUIRE(trunk->zero_grad().is_ok());
  for (const StageParameterView& view : trunk->parameter_views()) {
    for (float g : view.grad.span<float>()) CHECK(g == 0.0f);
  }
}

TEST_CASE("a token stage outputs [batch, positions, channels] and no input gradient") {
  using Embed = SequenceSequential<Embedding<Cpu>>;
  auto embed = Embed::create(1, Embedding<Cpu>(6, 4, /*positions=*/5));
  REQUIRE(embed.is_ok());
  const Tensor tokens = ids_tensor(Shape{2, 3}, 6, 1);
  auto out = embed->forward(tokens, nullptr);
  REQUIRE(out.is_ok());
  CHECK(out->shape() == Shape{2, 3, 4});
  // Row (b, t) is the token's vector plus position t's.
  const auto views = embed->parameter_views();
  REQUIRE(views.size() == 2);
  CHECK(views[0].name == "0.tokens");
  CHECK(views[1].name == "0.positions");
  const int token = tokens.data<int32_t>()[1 * 3 + 2];
  CHECK(out->data<float>()[(1 * 3 + 2) * 4 + 1] ==
        doctest::Approx(views[0].value.data<float>()[token * 4 + 1] + views[1].value.data<float>()[2 * 4 + 1]));
  auto grad = embed->backward(tokens, normal_tensor(Shape{2, 3, 4}, 2), nullptr);
  REQUIRE(grad.is_ok());
  CHECK_FALSE(grad->defined());
}

TEST_CASE("a Residual whose inner layer outputs zero is the identity") {
  using Skip = Sequential<Residual<Linear<Cpu>>>;
  auto skip = Skip::create(1, Residual(Linear<Cpu>(3, 3)));
  REQUIRE(skip.is_ok());
  for (const StageParameterView& view : skip->parameter_views()) {
    for (float& v : view.value.span<float>()) v = 0.0f;
  }
  const Tensor x = normal_tensor(Shape{4, 3}, 1);
  auto y = skip->forward(x, nullptr);
  REQUIRE(y.is_ok());
  CHECK(bitwise_equal(*y, x));
}

TEST_CASE("the losses' values: cross-entropy of equal logits is ln(classes), MSE the mean squared difference") {
  auto cross_entropy = Sequential<SoftmaxCrossEntropy<Cpu>>::create(1, SoftmaxCrossEntropy<Cpu>());
  REQUIRE(cross_entropy.is_ok());
  Tensor logits = *Tensor::zeros(Shape{3, 4}, DType::f32);
  auto loss = cross_entropy->forward(logits, &ids_tensor(Shape{3}, 4, 1).view());
  REQUIRE(loss.is_ok());
  CHECK(loss->shape() == Shape{1});
  CHECK(loss->data<float>()[0] == doctest::Approx(std::log(4.0f)));

  auto squared = Sequential<MeanSquaredError<Cpu>>::create(1, MeanSquaredError<Cpu>());
  REQUIRE(squared.is_ok());
  Tensor predictions = *Tensor::zeros(Shape{2, 2}, DType::f32), targets = *Tensor::zeros(Shape{2, 2}, DType::f32);
  targets.data<float>()[0] = 2.0f;  // squares: 4, 0, 0, 0
  targets.data<float>()[3] = 1.0f;  // and 1
  auto mse = squared->forward(predictions, &targets.view());
  REQUIRE(mse.is_ok());
  CHECK(mse->data<float>()[0] == doctest::Approx(5.0f / 4.0f));
  // d(loss)/d(prediction) = 2 (p - t) / 4, times d(loss) = 3.
  auto grad = squared->backward(predictions, scalar(3.0f), &targets.view());
  REQUIRE(grad.is_ok());
  CHECK(grad->data<float>()[0] == doctest::Approx(3.0f * 2.0f * -2.0f / 4.0f));
  CHECK(grad->data<float>()[3] == doctest::Approx(3.0f * 2.0f * -1.0f / 4.0f));
  CHECK(grad->data<float>()[1] == 0.0f);
}

TEST_CASE("a cross-entropy that reports accuracy gives [loss, accuracy], the same loss and gradient as without") {
  using Plain = Sequential<SoftmaxCrossEntropy<Cpu>>;
  using Measured = Sequential<SoftmaxCrossEntropy<Cpu, ReportAccuracy>>;
  auto plain = Plain::create(1, SoftmaxCrossEntropy<Cpu>());
  auto measured = Measured::create(1, SoftmaxCrossEntropy<Cpu, ReportAccuracy>());
  REQUIRE(plain.is_ok());
  REQUIRE(measured.is_ok());
  CHECK(plain->io_spec().metrics.empty());
  CHECK(measured->io_spec().metrics == std::vector<std::string>{"accuracy"});
  CHECK(measured->io_spec().output == TensorSpec{DType::f32, {2}});
  // Rows 0 and 2 have their largest logit at the target (row 2 ties: the first wins);
  // rows 1 and 3 do not: accuracy 1/2.
  Tensor logits = *Tensor::zeros(Shape{4, 3}, DType::f32);
  float* z = logits.data<float>();
  z[0 * 3 + 2] = 2.0f;                     // row 0: class 2, target 2
  z[1 * 3 + 0] = 1.0f;                     // row 1: class 0, target 1
  z[2 * 3 + 0] = z[2 * 3 + 1] = 0.5f;      // row 2: classes 0 and 1 tie, target 0
  z[3 * 3 + 1] = 3.0f;                     // row 3: class 1, target 2
  Tensor targets = *Tensor::empty(Shape{4}, DType::i32);
  const int32_t ids[] = {2, 1, 0, 2};
  std::copy(ids, ids + 4, targets.data<int32_t>());
  auto both = measured->forward(logits, &targets.view());
  auto loss = plain->forward(logits, &targets.view());
  REQUIRE(both.is_ok());
  REQUIRE(loss.is_ok());
  REQUIRE(both->shape() == Shape{2});
  CHECK(both->data<float>()[0] == loss->data<float>()[0]);
  CHECK(both->data<float>()[1] == 0.5f);
  auto grad_measured = measured->backward(logits, scalar(1.0f), &targets.view());
  auto grad_plain = plain->backward(logits, scalar(1.0f), &targets.view());
  REQUIRE(grad_measured.is_ok());
  CHECK(bitwise_equal(*grad_measured, *grad_plain));
}

}  // namespace
}  // namespace swarm::layers::testing
