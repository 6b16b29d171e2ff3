// Every layer, alone in a stage and composed, passes swarm::testing::check_stage:
// gradients match finite differences, forward and backward are deterministic,
// and a batch stacked from two halves gives the halves' results.
#include <doctest/doctest.h>

#include "swarm/testing/stage_check.h"
#include "tests/layers/classifier_stages.h"
#include "tests/layers/layer_test_util.h"

namespace swarm::layers::testing {
namespace {

template <Stage S>
void check_passes(S& stage, const TensorView& input) {
  const auto report = swarm::testing::check_stage(stage, input);
  CHECK_MESSAGE(report.ok(), report.to_string());
}
template <Stage S>
void check_passes(S& stage, const TensorView& input, const TensorView& targets) {
  const auto report = swarm::testing::check_stage(stage, input, targets);
  CHECK_MESSAGE(report.ok(), report.to_string());
}

TEST_CASE("each layer alone in a stage passes the stage checker") {
  const Tensor x = normal_tensor(Shape{6, 5}, /*seed=*/1);
  SUBCASE("Linear") {
    auto stage = Sequential<Linear<Cpu>>::create(1, Linear<Cpu>(5, 4));
    REQUIRE(stage.is_ok());
    check_passes(*stage, x);
  }
  SUBCASE("LayerNorm") {
    auto stage = Sequential<LayerNorm<Cpu>>::create(1, LayerNorm<Cpu>(5));
    REQUIRE(stage.is_ok());
    check_passes(*stage, x);
  }
  SUBCASE("Gelu") {
    auto stage = Sequential<Gelu<Cpu>>::create(1, Gelu<Cpu>());
    REQUIRE(stage.is_ok());
    check_passes(*stage, x);
  }
  SUBCASE("Tanh") {
    auto stage = Sequential<Tanh<Cpu>>::create(1, Tanh<Cpu>());
    REQUIRE(stage.is_ok());
    check_passes(*stage, x);
  }
  SUBCASE("Residual") {
    auto stage = Sequential<Residual<Linear<Cpu>, Tanh<Cpu>>>::create(1, Residual(Linear<Cpu>(5, 5), Tanh<Cpu>()));
    REQUIRE(stage.is_ok());
    check_passes(*stage, x);
  }
  SUBCASE("token-only Embedding") {
    auto stage = SequenceSequential<Embedding<Cpu>>::create(1, Embedding<Cpu>(/*vocabulary=*/7, /*channels=*/5));
    REQUIRE(stage.is_ok());
    check_passes(*stage, ids_tensor(Shape{4, 3}, 7, /*seed=*/2));
  }
  SUBCASE("Embedding with positions") {
    auto stage = SequenceSequential<Embedding<Cpu>>::create(1, Embedding<Cpu>(7, 5, /*positions=*/4));
    REQUIRE(stage.is_ok());
    check_passes(*stage, ids_tensor(Shape{4, 3}, 7, /*seed=*/2));
  }
  SUBCASE("SoftmaxCrossEntropy") {
    auto stage = Sequential<SoftmaxCrossEntropy<Cpu>>::create(1, SoftmaxCrossEntropy<Cpu>());
    REQUIRE(stage.is_ok());
    check_passes(*stage, x, ids_tensor(Shape{6}, 5, /*seed=*/3));
  }
  SUBCASE("MeanSquaredError") {
    auto stage = Sequential<MeanSquaredError<Cpu>>::create(1, MeanSquaredError<Cpu>());
    REQUIRE(stage.is_ok());
    check_passes(*stage, x, normal_tensor(Shape{6, 5}, /*seed=*/4));
  }
}

TEST_CASE("the classifier's trunk and head stages pass the stage checker") {
  using Stages = classifier::ClassifierStages<Cpu>;
  auto trunk = Stages::make_trunk(1);
  auto head = Stages::make_head(2);
  REQUIRE(trunk.is_ok());
  REQUIRE(head.is_ok());
  check_passes(*trunk, normal_tensor(Shape{8, 2}, /*seed=*/5));
  check_passes(*head, normal_tensor(Shape{8, 16}, /*seed=*/6), ids_tensor(Shape{8}, 3, /*seed=*/7));
}

TEST_CASE("a head that reports accuracy passes the stage checker") {
  using Head = Sequential<Linear<Cpu>, SoftmaxCrossEntropy<Cpu, ReportAccuracy>>;
  auto head = Head::create(2, Linear<Cpu>(16, 3), SoftmaxCrossEntropy<Cpu, ReportAccuracy>());
  REQUIRE(head.is_ok());
  check_passes(*head, normal_tensor(Shape{8, 16}, /*seed=*/6), ids_tensor(Shape{8}, 3, /*seed=*/7));
}

TEST_CASE("a token model's first and last stages pass the stage checker") {
  using Embed = SequenceSequential<Embedding<Cpu>, LayerNorm<Cpu>, Residual<Linear<Cpu>, Gelu<Cpu>, Linear<Cpu>>>;
  auto embed = Embed::create(1, Embedding<Cpu>(11, 8, /*positions=*/6), LayerNorm<Cpu>(8),
                             Residual(Linear<Cpu>(8, 12), Gelu<Cpu>(), Linear<Cpu>(12, 8)));
  REQUIRE(embed.is_ok());
  check_passes(*embed, ids_tensor(Shape{4, 5}, 11, /*seed=*/8));

  using Predict = SequenceSequential<LayerNorm<Cpu>, Linear<Cpu>, SoftmaxCrossEntropy<Cpu>>;
  auto predict = Predict::create(2, LayerNorm<Cpu>(8), Linear<Cpu>(8, 11), SoftmaxCrossEntropy<Cpu>());
  REQUIRE(predict.is_ok());
  REQUIRE(fits(embed->io_spec().output, predict->io_spec().input));
  check_passes(*predict, normal_tensor(Shape{4, 5, 8}, /*seed=*/9), ids_tensor(Shape{4, 5}, 11, /*seed=*/10));
}

TEST_CASE("a stage that embeds tokens and computes the loss passes the stage checker") {
  using Model = SequenceSequential<Embedding<Cpu>, Tanh<Cpu>, Linear<Cpu>, SoftmaxCrossEntropy<Cpu>>;
  auto model = Model::create(3, Embedding<Cpu>(9, 6), Tanh<Cpu>(), Linear<Cpu>(6, 9), SoftmaxCrossEntropy<Cpu>());
  REQUIRE(model.is_ok());
  check_passes(*model, ids_tensor(Shape{4, 3}, 9, /*seed=*/11), ids_tensor(Shape{4, 3}, 9, /*seed=*/12));
}

TEST_CASE("a deep regression stage with nested residuals passes the stage checker") {
  using Block = Residual<LayerNorm<Cpu>, Linear<Cpu>, Gelu<Cpu>, Linear<Cpu>>;
  using Model = Sequential<Linear<Cpu>, Block, Block, Tanh<Cpu>, Linear<Cpu>, MeanSquaredError<Cpu>>;
  auto model = Model::create(4, Linear<Cpu>(3, 8), Block(LayerNorm<Cpu>(8), Linear<Cpu>(8, 16), Gelu<Cpu>(), Linear<Cpu>(16, 8)),
                             Block(LayerNorm<Cpu>(8), Linear<Cpu>(8, 16), Gelu<Cpu>(), Linear<Cpu>(16, 8)), Tanh<Cpu>(),
                             Linear<Cpu>(8, 2), MeanSquaredError<Cpu>());
  REQUIRE(model.is_ok());
  check_passes(*model, normal_tensor(Shape{6, 3}, /*seed=*/13), normal_tensor(Shape{6, 2}, /*seed=*/14));
}

}  // namespace
}  // namespace swarm::layers::testing
