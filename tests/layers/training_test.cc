// Models written with swarm/layers train: a two-stage classifier of 2-D points
// and a one-stage regression, driven in-process by forward/backward calls and
// plain SGD over parameter_views(), as a trainer and the peers would.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <random>

#include "tests/layers/classifier_stages.h"
#include "tests/layers/layer_test_util.h"

namespace swarm::layers::testing {
namespace {

using Stages = classifier::ClassifierStages<Cpu>;
static_assert(Stage<Stages::Trunk> && Stage<Stages::Head>);

struct Dataset {
  Tensor points;  // f32 [n, 2]
  Tensor labels;  // i32 [n]
};

// Three Gaussian blobs on a circle of radius 2, one per class, spread 0.8: they overlap a little.
Dataset three_blobs(int n, uint64_t seed) {
  Dataset data{*Tensor::empty(Shape{n, 2}, DType::f32), *Tensor::empty(Shape{n}, DType::i32)};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> spread(0.0f, 0.8f);
  for (int i = 0; i < n; ++i) {
    const int label = i % 3;
    const float angle = 2.0f * std::numbers::pi_v<float> * label / 3.0f;
    data.points.data<float>()[2 * i] = 2.0f * std::cos(angle) + spread(rng);
    data.points.data<float>()[2 * i + 1] = 2.0f * std::sin(angle) + spread(rng);
    data.labels.data<int32_t>()[i] = label;
  }
  return data;
}

double accuracy(const Stages::Trunk& trunk, const Stages::Head& head, const Dataset& data) {
  Tensor hidden = *trunk.predict(data.points);
  Tensor logits = *head.predict(hidden);
  int correct = 0;
  const int n = static_cast<int>(data.labels.numel());
  for (int i = 0; i < n; ++i) {
    const float* row = logits.data<float>() + 3 * i;
    const int guess = static_cast<int>(std::max_element(row, row + 3) - row);
    correct += guess == data.labels.data<int32_t>()[i];
  }
  return double(correct) / n;
}

TEST_CASE("the two-stage classifier of three blobs trains: loss below 30% of its start, accuracy above 90%") {
  auto trunk = Stages::make_trunk(/*seed=*/11);
  auto head = Stages::make_head(/*seed=*/12);
  REQUIRE(trunk.is_ok());
  REQUIRE(head.is_ok());
  const Dataset train = three_blobs(300, /*seed=*/5), held_out = three_blobs(300, /*seed=*/6);
  const Tensor one = scalar(1.0f);

  float first_loss = 0, last_loss = 0;
  const double accuracy_before = accuracy(*trunk, *head, held_out);
  for (int step = 0; step < 300; ++step) {
    // The trunk's peer and the head's peer, each serving its requests.
    auto hidden = trunk->forward(train.points, nullptr);
    REQUIRE(hidden.is_ok());
    auto loss = head->forward(*hidden, &train.labels.view());
    REQUIRE(loss.is_ok());
    auto grad_hidden = head->backward(*hidden, one, &train.labels.view());
    REQUIRE(grad_hidden.is_ok());
    auto grad_points = trunk->backward(train.points, *grad_hidden, nullptr);
    REQUIRE(grad_points.is_ok());
    REQUIRE(sgd_step(*trunk, 0.3f).is_ok());
    REQUIRE(sgd_step(*head, 0.3f).is_ok());
    if (step == 0) first_loss = loss->data<float>()[0];
    last_loss = loss->data<float>()[0];
  }
  const double accuracy_after = accuracy(*trunk, *head, held_out);
  MESSAGE("loss ", first_loss, " -> ", last_loss, ", held-out accuracy ", accuracy_before, " -> ", accuracy_after);
  CHECK(first_loss > 0.5f);  // near ln 3 untrained, so the fall below means something
  CHECK(last_loss < 0.3f * first_loss);
  CHECK(accuracy_after > 0.9);
}

// y = sin(2 x0) cos(x1) on [-1.5, 1.5]^2.
struct Regression {
  Tensor inputs, targets;
};
Regression wave(int n, uint64_t seed) {
  Regression data{*Tensor::empty(Shape{n, 2}, DType::f32), *Tensor::empty(Shape{n, 1}, DType::f32)};
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.5f, 1.5f);
  for (int i = 0; i < n; ++i) {
    const float a = uniform(rng), b = uniform(rng);
    data.inputs.data<float>()[2 * i] = a;
    data.inputs.data<float>()[2 * i + 1] = b;
    data.targets.data<float>()[i] = std::sin(2.0f * a) * std::cos(b);
  }
  return data;
}

TEST_CASE("a MeanSquaredError regression trains: loss below 20% of its start") {
  using Regressor = Sequential<Linear<Cpu>, Tanh<Cpu>, Linear<Cpu>, Gelu<Cpu>, Linear<Cpu>, MeanSquaredError<Cpu>>;
  static_assert(Stage<Regressor>);
  auto regressor = Regressor::create(/*seed=*/3, Linear<Cpu>(2, 32), Tanh<Cpu>(), Linear<Cpu>(32, 32), Gelu<Cpu>(),
                                     Linear<Cpu>(32, 1), MeanSquaredError<Cpu>());
  REQUIRE(regressor.is_ok());
  const Regression train = wave(256, /*seed=*/8);
  const Tensor one = scalar(1.0f);

  float first_loss = 0, last_loss = 0;
  for (int step = 0; step < 600; ++step) {
    auto loss = regressor->forward(train.inputs, &train.targets.view());
    REQUIRE(loss.is_ok());
    auto grad = regressor->backward(train.inputs, one, &train.targets.view());
    REQUIRE(grad.is_ok());
    REQUIRE(sgd_step(*regressor, 0.3f).is_ok());
    if (step == 0) first_loss = loss->data<float>()[0];
    last_loss = loss->data<float>()[0];
  }
  MESSAGE("loss ", first_loss, " -> ", last_loss);
  CHECK(first_loss > 0.05f);
  CHECK(last_loss < 0.2f * first_loss);
}

}  // namespace
}  // namespace swarm::layers::testing
