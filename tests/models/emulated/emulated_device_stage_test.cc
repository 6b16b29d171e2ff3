// EmulatedDeviceStage over a real GPT stage: the stage's io spec and parameters,
// tensors of the true shapes, a wall time of FLOPs / rate, bad inputs refused.
#include <chrono>

#include <doctest/doctest.h>

#include "kernels/cpu/cpu_backend.h"
#include "models/emulated/emulated_device_stage.h"
#include "models/gpt/gpt_stage.h"

namespace swarm::emulated {
namespace {

using Gpt = gpt::GptStage<CpuBackend>;
using Emulated = EmulatedDeviceStage<Gpt>;

static_assert(Stage<Emulated>);
static_assert(!CachingStage<Emulated>);  // a backward costs its own time: nothing is parked

gpt::GptConfig small_model() {
  gpt::GptConfig config;
  config.d_model = 32;
  config.n_heads = 2;
  config.n_layers = 2;
  config.max_seq_len = 8;
  config.vocab_size = 16;
  return config;
}

Emulated emulated_stage(const gpt::GptConfig& config, int index, double flops_per_token, double rate) {
  auto layouts = gpt::partition_layers(config, 2);
  REQUIRE(layouts.is_ok());
  auto inner = Gpt::create(config, (*layouts)[index], 1);
  REQUIRE(inner.is_ok());
  auto stage = Emulated::create(std::move(*inner), {.forward_flops_per_token = flops_per_token,
                                                    .backward_flops_per_token = 2 * flops_per_token,
                                                    .flops_per_second = rate});
  REQUIRE(stage.is_ok());
  return std::move(*stage);
}

Tensor tokens(int64_t b, int64_t t) {
  Tensor x = *Tensor::empty(Shape{b, t}, DType::i32);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<int32_t>()[i] = static_cast<int32_t>(i % 16);
  return x;
}

double seconds_of(auto&& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST_CASE("the first stage turns tokens into activations of the stage's width, and varied ones") {
  const gpt::GptConfig config = small_model();
  auto layouts = *gpt::partition_layers(config, 2);
  Gpt real = *Gpt::create(config, layouts[0], 1);
  Emulated stage = emulated_stage(config, 0, 0, 1);
  CHECK(stage.io_spec().input == real.io_spec().input);
  CHECK(stage.io_spec().output == real.io_spec().output);
  CHECK(stage.parameter_views().size() == real.parameter_views().size());
  const Tensor x = tokens(4, 8);
  auto out = stage.forward(x, nullptr);
  REQUIRE(out.is_ok());
  CHECK(out->shape() == Shape{4, 8, 32});
  const float* o = out->data<float>();
  CHECK(o[0] != o[1]);          // not constant across a row
  CHECK(o[0] == o[16 * 32]);    // the same token (position 16 = token 0) gives the same row
  for (int64_t i = 0; i < out->numel(); ++i) REQUIRE((o[i] >= -1.0f && o[i] < 1.0f));
  auto grad = stage.backward(x, *out, nullptr);
  REQUIRE(grad.is_ok());
  CHECK(!grad->defined());  // tokens have no gradient
}

TEST_CASE("a maxout cut's narrower wire width is the emulated output's width") {
  gpt::GptConfig config = small_model();
  config.boundaries = *gpt::parse_boundary_layers("maxout:4");
  Emulated first = emulated_stage(config, 0, 0, 1);
  auto out = first.forward(tokens(1, 8), nullptr);
  REQUIRE(out.is_ok());
  CHECK(out->shape() == Shape{1, 8, 8});
}

TEST_CASE("the loss stage returns a finite loss row, and an input gradient shaped like its input") {
  const gpt::GptConfig config = small_model();
  Emulated last = emulated_stage(config, 1, 0, 1);
  CHECK(last.takes_targets());
  Emulated first = emulated_stage(config, 0, 0, 1);
  const Tensor x = tokens(2, 8);
  const Tensor activations = *first.forward(x, nullptr);
  auto loss = last.forward(activations, &static_cast<const TensorView&>(x.view()));
  REQUIRE(loss.is_ok());
  CHECK(loss->numel() == 1 + static_cast<int64_t>(last.io_spec().metrics.size()));
  CHECK(std::isfinite(loss->data<float>()[0]));
  CHECK(loss->data<float>()[0] > 0);
  CHECK(!last.forward(activations, nullptr).is_ok());  // a loss stage needs its targets
  auto grad = last.backward(activations, *loss, &static_cast<const TensorView&>(x.view()));
  REQUIRE(grad.is_ok());
  CHECK(grad->shape() == activations.shape());
}

TEST_CASE("compute takes the stage's FLOPs / rate of wall time, the backward twice that") {
  // 2 x 8 tokens at 1.25e5 FLOPs each: 2e6 at 1e8/s is 20 ms forward, 40 ms backward.
  const gpt::GptConfig config = small_model();
  Emulated stage = emulated_stage(config, 0, 1.25e5, 1e8);
  const Tensor x = tokens(2, 8);
  Tensor out;
  const double forward = seconds_of([&] { out = *stage.forward(x, nullptr); });
  Emulated second = emulated_stage(config, 1, 1.25e5, 1e8);
  const double backward = seconds_of([&] { REQUIRE(second.backward(out, out, nullptr).is_ok()); });
  CHECK(forward >= 0.020);
  CHECK(backward >= 0.040);
  CHECK(forward < 0.020 + 0.015);  // generous for a loaded machine, far below a second wait
  CHECK(backward < 0.040 + 0.015);
}

TEST_CASE("inputs the stage does not take, and bad rates, are refused with a status") {
  const gpt::GptConfig config = small_model();
  Emulated first = emulated_stage(config, 0, 0, 1);
  const Tensor floats = *Tensor::empty(Shape{1, 8, 32}, DType::f32);
  CHECK(!first.forward(floats, nullptr).is_ok());  // stage 0 takes tokens
  Emulated last = emulated_stage(config, 1, 0, 1);
  const Tensor narrow = *Tensor::empty(Shape{1, 8, 31}, DType::f32);
  CHECK(!last.backward(narrow, narrow, nullptr).is_ok());
  auto layouts = *gpt::partition_layers(config, 2);
  CHECK(!Emulated::create(*Gpt::create(config, layouts[0], 1), {.flops_per_second = 0}).is_ok());
  CHECK(!Emulated::create(*Gpt::create(config, layouts[0], 1), {.forward_flops_per_token = -1}).is_ok());
}

TEST_CASE("a GPT stage's FLOPs count its blocks, its head and a bottleneck's projections") {
  const gpt::GptConfig config = small_model();
  auto layouts = *gpt::partition_layers(config, 2);
  const double block = 24.0 * 32 * 32 + 4.0 * 8 * 32;
  CHECK(gpt::stage_forward_flops_per_token(config, layouts[0]) == doctest::Approx(block));
  CHECK(gpt::stage_forward_flops_per_token(config, layouts[1]) == doctest::Approx(block + 2.0 * 32 * 16));
  gpt::GptConfig narrowed = config;
  narrowed.boundaries = *gpt::parse_boundary_layers("bottleneck:4");
  CHECK(gpt::stage_forward_flops_per_token(narrowed, layouts[0]) == doctest::Approx(block + 2.0 * 32 * 8));
}

}  // namespace
}  // namespace swarm::emulated
