// EmulatedComputeStage: real tensors of the declared widths, a wall time of
// FLOPs / rate (never less), and bad inputs refused.
#include <chrono>

#include <doctest/doctest.h>

#include "models/emulated/emulated_compute_stage.h"

namespace swarm::emulated {
namespace {

static_assert(Stage<EmulatedComputeStage>);
static_assert(!CachingStage<EmulatedComputeStage>);  // nothing is parked: a backward costs its own time

Tensor ramp(int64_t b, int64_t t, int64_t w) {
  Tensor x = *Tensor::empty(Shape{b, t, w}, DType::f32);
  float* p = x.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) p[i] = static_cast<float>(i);
  return x;
}

double seconds_of(auto&& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST_CASE("forward and backward return tensors of the declared widths that follow their input") {
  auto stage = EmulatedComputeStage::create({.input_width = 4, .output_width = 6, .forward_flops_per_token = 0,
                                             .backward_flops_per_token = 0, .flops_per_second = 1});
  REQUIRE(stage.is_ok());
  CHECK(stage->io_spec().input.dims == std::vector<int64_t>{-1, -1, 4});
  CHECK(stage->io_spec().output.dims == std::vector<int64_t>{-1, -1, 6});
  const Tensor x = ramp(2, 3, 4);
  auto out = stage->forward(x, nullptr);
  REQUIRE(out.is_ok());
  CHECK(out->shape() == Shape{2, 3, 6});
  CHECK(out->data<float>()[6 + 5] == x.data<float>()[4 + 1]);  // row 1, column 5 repeats column 5 % 4
  auto grad = stage->backward(x, *out, nullptr);
  REQUIRE(grad.is_ok());
  CHECK(grad->shape() == Shape{2, 3, 4});
  CHECK(stage->parameter_views().empty());
}

TEST_CASE("compute takes FLOPs / rate of wall time, backward its own count") {
  // 2 x 10 tokens: 2e6 FLOPs forward at 1e8/s is 20 ms; the backward 40 ms.
  auto stage = EmulatedComputeStage::create({.input_width = 8, .output_width = 8, .forward_flops_per_token = 1e5,
                                             .backward_flops_per_token = 2e5, .flops_per_second = 1e8});
  REQUIRE(stage.is_ok());
  const Tensor x = ramp(2, 10, 8);
  const double forward = seconds_of([&] { REQUIRE(stage->forward(x, nullptr).is_ok()); });
  const double backward = seconds_of([&] { REQUIRE(stage->backward(x, x, nullptr).is_ok()); });
  CHECK(forward >= 0.020);
  CHECK(backward >= 0.040);
  CHECK(forward < 0.020 + 0.015);  // generous for a loaded machine, but far below a second wait
  CHECK(backward < 0.040 + 0.015);
}

TEST_CASE("bad configurations and inputs are refused with a status") {
  CHECK(!EmulatedComputeStage::create({.input_width = 0, .output_width = 4}).is_ok());
  CHECK(!EmulatedComputeStage::create({.input_width = 4, .output_width = 4, .flops_per_second = 0}).is_ok());
  CHECK(!EmulatedComputeStage::create({.input_width = 4, .output_width = 4, .forward_flops_per_token = -1}).is_ok());
  auto stage = EmulatedComputeStage::create({.input_width = 4, .output_width = 4});
  REQUIRE(stage.is_ok());
  CHECK(stage->forward(ramp(1, 2, 5), nullptr).status().code() == StatusCode::invalid_argument);
  CHECK(stage->backward(ramp(1, 2, 4), ramp(1, 2, 3), nullptr).status().code() == StatusCode::invalid_argument);
  const Tensor tokens = *Tensor::zeros(Shape{1, 2}, DType::i32);
  CHECK(stage->forward(tokens, nullptr).status().code() == StatusCode::invalid_argument);
}

}  // namespace
}  // namespace swarm::emulated
