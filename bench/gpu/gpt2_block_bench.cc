// One Transformer block shaped like GPT-2 small (d_model 768, 12 heads, seq
// 1024, batch 8), forward + backward as a GptStage runs it on the device, in
// tokens/s, for each CUDA backend, and as a fraction of the device's dense bf16
// peak (model FLOPs: 72 C^2 per token for the GEMMs, 7 T C per token for causal
// attention, forward plus backward). bench/gpu_check.sh sets the bf16 line
// beside PyTorch's on the same block (bench/torch_block.py --device cuda).
//
//   gpt2_block_bench [--batch 8] [--seq 1024] [--reps 10]
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include <fmt/core.h>

#include "bench/gpu/gpu_timer.h"
#include "kernels/cuda/cuda_backend.h"
#include "models/gpt/gpt_stage.h"
#include "tests/cuda/cuda_test_util.h"

using namespace swarm;

namespace {

int arg(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  }
  return fallback;
}

// Tokens per second of one block's forward + backward, or 0 with a message.
template <Backend B>
double tokens_per_second(const char* name, int batch, int seq, int reps) {
  gpt::GptConfig config;
  config.vocab_size = 50304;
  config.max_seq_len = seq;
  config.d_model = 768;
  config.n_heads = 12;
  config.n_layers = 1;
  gpt::StageLayout middle{.stage_index = 1, .num_stages = 3, .first_layer = 0, .end_layer = 1};
  auto stage = gpt::GptStage<B>::create(config, middle, 1);
  if (!stage.is_ok()) {
    fmt::print("{}: not run: {}\n", name, stage.status().to_string());
    return 0;
  }
  const size_t n = size_t(batch) * seq * config.d_model;
  Tensor hidden = *Tensor::empty(Shape{batch, seq, config.d_model}, DType::f32);
  Tensor grad = *Tensor::empty(Shape{batch, seq, config.d_model}, DType::f32);
  const auto x = cuda::testing::random_vector(n, 1), g = cuda::testing::random_vector(n, 2, 1e-3f);
  std::copy(x.begin(), x.end(), hidden.data<float>());
  std::copy(g.begin(), g.end(), grad.data<float>());
  Status status = stage->forward(hidden, nullptr).status();
  if (status.is_ok()) status = stage->backward_after_forward(grad).status();
  if (status.is_ok()) status = stage->replay_resident_step();  // warm-up: plans, caches
  if (!status.is_ok()) {
    fmt::print("{}: not run: {}\n", name, status.to_string());
    return 0;
  }
  std::vector<double> seconds;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    status = stage->replay_resident_step();  // synchronizes before returning
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (!status.is_ok()) {
      fmt::print("{}: failed: {}\n", name, status.to_string());
      return 0;
    }
  }
  std::nth_element(seconds.begin(), seconds.begin() + reps / 2, seconds.end());
  return double(batch) * seq / seconds[reps / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (cuda::testing::skip_without_device()) return 0;
  const int batch = arg(argc, argv, "--batch", 8), seq = arg(argc, argv, "--seq", 1024);
  const int reps = std::max(3, arg(argc, argv, "--reps", 10));
  const double C = 768;
  const double flops_per_token = 72 * C * C + 7.0 * seq * C;
  const double peak = bench::dense_bf16_peak_tflops();
  fmt::print("GPT-2 small block, batch {} x seq {}: {:.1f} GFLOP per step\n", batch, seq,
             flops_per_token * batch * seq / 1e9);

  struct Row {
    const char* name;
    double tokens_per_s;
  };
  const Row rows[] = {
      {"bf16, hand-written attention", tokens_per_second<CudaBf16Backend>("bf16", batch, seq, reps)},
      {"bf16, cuDNN attention", tokens_per_second<CudaBf16CudnnBackend>("bf16 cudnn", batch, seq, reps)},
      {"fp32", tokens_per_second<CudaBackend>("fp32", batch, seq, reps)},
  };
  for (const Row& row : rows) {
    if (row.tokens_per_s <= 0) continue;
    const double tflops = row.tokens_per_s * flops_per_token / 1e12;
    fmt::print("block {}: {:.0f} tokens/s, {:.1f} TFLOP/s\n", row.name, row.tokens_per_s, tflops);
    if (peak > 0) fmt::print("ratio block {}: {:.3f} of the dense bf16 peak ({:.0f} TFLOP/s)\n", row.name, tflops / peak, peak);
  }
  // gpu_check.sh reads this line to set it beside PyTorch.
  fmt::print("{{\"tokens_per_s\": {:.1f}}}\n", rows[0].tokens_per_s);
  return 0;
}
