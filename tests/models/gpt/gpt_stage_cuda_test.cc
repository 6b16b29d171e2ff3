// A GPT split into two stages, forward and backward, on each CUDA backend
// against the same stages on the CPU backend: the hidden state crossing the
// split, the loss, the gradient crossing back, and every parameter gradient.
//
// Errors are normwise, ||cuda - cpu|| / ||cpu||, per tensor, because a bf16
// model's elementwise error on near-zero entries says nothing. Tolerances:
// - CudaBackend (float, true fp32 GEMMs): 1e-4 on everything, 1e-5 on the loss;
// - bf16 backends: activations carry 8 bits of mantissa through 2 blocks, so
//   3e-2 on hidden states and gradients, 1e-2 on the loss.
// The same again with a bottleneck and a maxout boundary layer at the cut (the
// hidden state crossing it is then [B, T, d/k]). In bf16, maxout's argmax flips
// wherever two candidates are closer than the activations' bf16 error (a few
// percent of outputs at k = 4), and each flip moves a whole gradient entry to
// another input, so the first stage's parameter gradients get a bound of 0.5
// there (garbage scores 1 or more); the loss, the hidden state, the gradient
// crossing back, and float CUDA keep their bounds.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "models/gpt/gpt_stage.h"
#include "tests/cuda/cuda_test_util.h"

namespace swarm::gpt {
namespace {

static_assert(Stage<GptStage<CudaBackend>>);
static_assert(Stage<GptStage<CudaBf16Backend>>);

GptConfig test_config(const std::string& boundaries = "") {
  GptConfig config;
  config.vocab_size = 256;
  config.max_seq_len = 64;
  config.d_model = 128;
  config.n_heads = 4;  // head size 32
  config.n_layers = 2;
  config.layer_repeat = 1;
  if (!boundaries.empty()) config.boundaries = *parse_boundary_layers(boundaries);
  return config;
}

double normwise_error(const TensorView& got, const TensorView& want) {
  const auto g = Tensor::copy_of(got, Device::cpu), w = Tensor::copy_of(want, Device::cpu);
  REQUIRE(g.is_ok());
  REQUIRE(w.is_ok());
  REQUIRE(g->numel() == w->numel());
  double diff = 0, norm = 0;
  auto gs = g->span<float>(), ws = w->span<float>();
  for (size_t i = 0; i < gs.size(); ++i) {
    diff += (double(gs[i]) - ws[i]) * (double(gs[i]) - ws[i]);
    norm += double(ws[i]) * ws[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

struct Run {
  Tensor hidden, loss, grad_hidden;
  std::vector<std::pair<std::string, Tensor>> grads;  // host copies, both stages
  size_t first_stage_grads = 0;
};

template <Backend B>
Run run_split_model(const GptConfig& config, const Tensor& tokens, const Tensor& targets) {
  auto layouts = partition_layers(config, 2);
  REQUIRE(layouts.is_ok());
  auto first = GptStage<B>::create(config, (*layouts)[0], /*seed=*/7);
  auto last = GptStage<B>::create(config, (*layouts)[1], /*seed=*/7);
  REQUIRE_MESSAGE(first.is_ok(), first.status().to_string());
  REQUIRE_MESSAGE(last.is_ok(), last.status().to_string());
  Run run;
  auto hidden = first->forward(tokens, nullptr);
  REQUIRE_MESSAGE(hidden.is_ok(), hidden.status().to_string());
  run.hidden = *hidden;
  TensorView targets_view = targets;
  auto loss = last->forward(run.hidden, &targets_view);
  REQUIRE_MESSAGE(loss.is_ok(), loss.status().to_string());
  run.loss = *loss;
  Tensor one = *Tensor::empty(Shape{1}, DType::f32);
  one.data<float>()[0] = 1.0f;
  auto grad_hidden = last->backward_after_forward(one);
  REQUIRE_MESSAGE(grad_hidden.is_ok(), grad_hidden.status().to_string());
  run.grad_hidden = *grad_hidden;
  auto none = first->backward_after_forward(run.grad_hidden);
  REQUIRE_MESSAGE(none.is_ok(), none.status().to_string());
  for (auto* stage : {&*first, &*last}) {
    for (const auto& p : stage->parameters()) run.grads.emplace_back(p.name, *Tensor::copy_of(p.grad, Device::cpu));
    if (stage == &*first) run.first_stage_grads = run.grads.size();
  }
  return run;
}

template <Backend B>
void check_against_cpu(double tolerance, double loss_tolerance, const std::string& boundaries = "",
                       double first_stage_grad_tolerance = 0) {
  if (first_stage_grad_tolerance == 0) first_stage_grad_tolerance = tolerance;
  INFO("boundaries: " << (boundaries.empty() ? "none" : boundaries));
  const GptConfig config = test_config(boundaries);
  const int batch = 2, seq = 64;
  std::mt19937 rng(3);
  Tensor tokens = *Tensor::empty(Shape{batch, seq}, DType::i32);
  Tensor targets = *Tensor::empty(Shape{batch, seq}, DType::i32);
  for (auto& id : tokens.span<int32_t>()) id = static_cast<int32_t>(rng() % config.vocab_size);
  for (auto& id : targets.span<int32_t>()) id = static_cast<int32_t>(rng() % config.vocab_size);

  const Run cpu = run_split_model<CpuBackend>(config, tokens, targets);
  const Run gpu = run_split_model<B>(config, tokens, targets);
  const float cpu_loss = cpu.loss.data<float>()[0], gpu_loss = gpu.loss.data<float>()[0];
  MESSAGE("loss cpu " << cpu_loss << " cuda " << gpu_loss);
  CHECK(std::abs(gpu_loss - cpu_loss) / cpu_loss < loss_tolerance);
  CHECK(normwise_error(gpu.hidden, cpu.hidden) < tolerance);
  CHECK(normwise_error(gpu.grad_hidden, cpu.grad_hidden) < tolerance);
  REQUIRE(gpu.grads.size() == cpu.grads.size());
  double worst = 0;
  for (size_t i = 0; i < cpu.grads.size(); ++i) {
    INFO(cpu.grads[i].first);
    REQUIRE(gpu.grads[i].first == cpu.grads[i].first);
    const double error = normwise_error(gpu.grads[i].second, cpu.grads[i].second);
    worst = std::max(worst, error);
    CHECK(error < (i < cpu.first_stage_grads ? first_stage_grad_tolerance : tolerance));
  }
  MESSAGE("worst normwise parameter-gradient error: " << worst);
}

TEST_CASE("a GPT split in two stages on CudaBackend (float) matches the CPU backend") {
  if (cuda::testing::skip_without_device()) return;
  check_against_cpu<CudaBackend>(1e-4, 1e-5);
}

TEST_CASE("a GPT split in two stages on CudaBf16Backend matches the CPU backend") {
  if (cuda::testing::skip_without_device()) return;
  check_against_cpu<CudaBf16Backend>(3e-2, 1e-2);
}

TEST_CASE("a GPT split in two stages on CudaBf16CudnnBackend matches the CPU backend") {
  if (cuda::testing::skip_without_device()) return;
  check_against_cpu<CudaBf16CudnnBackend>(3e-2, 1e-2);
}

TEST_CASE("with bottleneck and maxout boundary layers, CUDA stages match the CPU backend") {
  if (cuda::testing::skip_without_device()) return;
  for (const std::string boundaries : {"bottleneck:2", "maxout:4"}) {
    const double bf16_first_stage = boundaries.starts_with("maxout") ? 0.5 : 3e-2;
    check_against_cpu<CudaBackend>(1e-4, 1e-5, boundaries);
    check_against_cpu<CudaBf16Backend>(3e-2, 1e-2, boundaries, bf16_first_stage);
    check_against_cpu<CudaBf16CudnnBackend>(3e-2, 1e-2, boundaries, bf16_first_stage);
  }
}

TEST_CASE("without a device, creating a CUDA stage fails with a status instead of crashing") {
  if (cuda::count_devices().count > 0) return;  // covered by the cases above
  auto layouts = partition_layers(test_config(), 2);
  REQUIRE(layouts.is_ok());
  auto stage = GptStage<CudaBf16Backend>::create(test_config(), (*layouts)[0], 7);
  CHECK_FALSE(stage.is_ok());
  MESSAGE(stage.status().to_string());
}

}  // namespace
}  // namespace swarm::gpt
