// One GPT block, forward + backward, on the CPU backend, and the GEMM of its
// MLP against a plain Eigen GEMM of the same size. Prints one JSON object per
// thread count so bench/block_vs_pytorch.sh can set it beside PyTorch.
//
//   block_bench --threads 1 --d-model 512 --heads 8 --seq 256 --batch 4
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <Eigen/Core>
#include <fmt/core.h>

#include "kernels/cpu/cpu_backend.h"
#include "models/gpt/gpt_model.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Median of `reps` timings after `warmups` untimed calls.
template <typename F>
double median_seconds(int reps, F&& body, int warmups = 1) {
  for (int i = 0; i < warmups; ++i) body();
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    auto start = Clock::now();
    body();
    times.push_back(seconds_since(start));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

int arg(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = arg(argc, argv, "--threads", 1);
  const int C = arg(argc, argv, "--d-model", 512);
  const int NH = arg(argc, argv, "--heads", 8);
  const int T = arg(argc, argv, "--seq", 256);
  const int B = arg(argc, argv, "--batch", 4);
  const int reps = arg(argc, argv, "--reps", 7);
  swarm::cpu::set_num_threads(threads);

  swarm::gpt::GptConfig config;
  config.d_model = C;
  config.n_heads = NH;
  config.max_seq_len = T;
  config.n_layers = 3;
  // The middle stage of three is exactly one block: hidden in, hidden out.
  auto layouts = *swarm::gpt::partition_layers(config, 3);
  auto stage = swarm::gpt::GptStage<swarm::CpuBackend>::create(config, layouts[1], 1);
  if (!stage.is_ok()) {
    fmt::print(stderr, "{}\n", stage.status().to_string());
    return 1;
  }
  swarm::Tensor hidden = *swarm::Tensor::empty(swarm::Shape{B, T, C}, swarm::DType::f32);
  swarm::Tensor grad = *swarm::Tensor::empty(swarm::Shape{B, T, C}, swarm::DType::f32);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (float& x : hidden.span<float>()) x = normal(rng);
  for (float& x : grad.span<float>()) x = normal(rng) * 1e-3f;

  // A stage keeps its last few forwards for their backwards, so its first
  // calls allocate their buffers; time it once it reuses them, as a serving
  // peer does (and as PyTorch's caching allocator does after one call).
  const double block_seconds = median_seconds(reps, [&] {
    auto out = stage->forward(hidden, nullptr);
    auto dx = stage->backward_after_forward(grad);
    if (!out.is_ok() || !dx.is_ok()) std::abort();
  }, /*warmups=*/8);

  // The MLP's first GEMM: [N, C] x [C, 4C].
  const int N = B * T, OC = 4 * C;
  std::vector<float> x(size_t(N) * C), w(size_t(OC) * C), y(size_t(N) * OC);
  for (float& v : x) v = normal(rng);
  for (float& v : w) v = normal(rng);
  const double gemm_flops = 2.0 * N * C * OC;
  const double ours_seconds = median_seconds(reps, [&] {
    swarm::cpu::matmul_forward(y.data(), x.data(), w.data(), nullptr, N, C, OC);
  });
  Eigen::MatrixXf a = Eigen::MatrixXf::Random(N, C), b = Eigen::MatrixXf::Random(C, OC), c(N, OC);
  const double eigen_seconds = median_seconds(reps, [&] { c.noalias() = a * b; });

  // The FLOP limit: the block's forward+backward FLOPs (linear layers 3 x 24 N C^2,
  // causal attention 3 x 2 B T^2 C, half of the full T x T) at the GEMM rate
  // measured above. No fp32 implementation on this core beats it.
  const double block_flops = 3.0 * 24.0 * N * double(C) * C + 3.0 * 2.0 * B * double(T) * T * C;
  const double gemm_rate = std::max(gemm_flops / ours_seconds, gemm_flops / eigen_seconds);
  const double roofline_tokens_per_s = N / (block_flops / gemm_rate);
  fmt::print(
      "{{\"threads\": {}, \"tokens_per_s\": {:.1f}, \"block_ms\": {:.3f}, \"gemm_gflops\": {:.2f}, "
      "\"eigen_gemm_gflops\": {:.2f}, \"roofline_tokens_per_s\": {:.1f}, \"block_gflops\": {:.2f}}}\n",
      threads, N / block_seconds, block_seconds * 1e3, gemm_flops / ours_seconds / 1e9,
      gemm_flops / eigen_seconds / 1e9, roofline_tokens_per_s, block_flops / block_seconds / 1e9);
  return 0;
}
