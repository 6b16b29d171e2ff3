// matmul_bench: the GEMMs of a GPT-2 small block (and its LM head) at B*T = 8192 tokens,
// bf16, on cuBLASLt. Ours is timed as the model calls it (matmul_forward /
// matmul_gelu_forward, matmul_backward / matmul_backward_dgelu including the dbias
// column sum); the ceiling is the fastest of up to 16 cuBLASLt heuristic candidates for
// the same problem and epilogue, each timed in this run. Also prints the fraction of an
// estimated dense bf16 tensor-core peak.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "bench/gpu/gpu_timer.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/matmul.h"

namespace swarm::cuda {
namespace {

constexpr int kTokens = 8192;  // B * T
constexpr int kWidth = 768;    // GPT-2 small

void check(const Status& status) {
  if (status.is_ok()) return;
  fmt::print("matmul_bench: {}\n", status.to_string());
  std::exit(1);
}

// A device buffer of `count` elements of T, freed on scope exit.
template <typename T>
struct Buffer {
  T* ptr = nullptr;
  explicit Buffer(size_t count) { SWARM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr), count * sizeof(T))); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { cudaFree(ptr); }
};

// Fills with normal(0, scale) values (a 1 Mi-value pattern, tiled): zeros would flatter
// the tensor cores' power draw, and so the clock.
void fill_normal(bf16* dst, size_t count, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<bf16> pattern(size_t{1} << 20);
  for (bf16& v : pattern) v = bf16::from_float(normal(rng));
  for (size_t at = 0; at < count; at += pattern.size()) {
    const size_t n = std::min(pattern.size(), count - at);
    SWARM_CUDA_CHECK(cudaMemcpy(dst + at, pattern.data(), n * sizeof(bf16), cudaMemcpyHostToDevice));
  }
}

struct Best {
  double ms = INFINITY;
  int algo = -1;
  int candidates = 0;
  double candidate0_ms = INFINITY;  // what our calls run
};

// Times `run(algo)` for every heuristic candidate cuBLASLt offers; fewer timed calls
// than for ours, since there are up to 16 of them.
template <typename Run>
Best time_candidates(const Run& run, cudaStream_t stream) {
  Best best;
  for (int algo = 0; algo < kMatmulMaxAlgos; ++algo) {
    const Status status = run(algo);
    if (status.code() == StatusCode::out_of_range) break;
    if (!status.is_ok()) {
      fmt::print("    candidate {} refused: {}\n", algo, status.to_string());
      continue;
    }
    ++best.candidates;
    const double ms = bench::median_ms([&] { check(run(algo)); }, stream, /*warmup=*/2, /*batches=*/5,
                                       /*calls_per_batch=*/5);
    if (algo == 0) best.candidate0_ms = ms;
    if (ms < best.ms) {
      best.ms = ms;
      best.algo = algo;
    }
  }
  if (best.candidates == 0) check(internal("no cuBLASLt candidate ran"));
  return best;
}

double tflops(double flops, double ms) { return flops / (ms * 1e-3) / 1e12; }

struct Layer {
  const char* name;
  int C, OC;
  bool bias;
  bool gelu_after;   // forward through the GELU epilogue (the MLP's fc)
  bool gelu_before;  // input was gelu(pre): backward through the DGELU epilogue (fc proj)
};

struct Peak {
  double tflops = 0;  // 0: no estimate for this GPU
};

Peak estimate_peak() {
  int sms = 0, clock_khz = 0, major = 0, minor = 0;
  SWARM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  SWARM_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  SWARM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  SWARM_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
  if (major != 9) {
    fmt::print("peak estimate: none for sm_{}{} (the formula below is Hopper's)\n", major, minor);
    return {};
  }
  // Hopper: 4 tensor cores per SM, 1024 dense bf16 FLOP/clk each.
  const double peak = double(sms) * clock_khz * 1e3 * 4096 / 1e12;
  fmt::print(
      "peak estimate (dense bf16): {} SMs x {:.0f} MHz x 4096 FLOP/clk/SM = {:.0f} TFLOP/s. An ESTIMATE: it uses "
      "the device's reported max clock; under sustained tensor-core load the clock is usually lower\n",
      sms, clock_khz / 1e3, peak);
  return {peak};
}

int run() {
  const DeviceCount devices = count_devices();
  if (devices.count == 0) {
    fmt::print("skipped: no CUDA device ({})\n", devices.reason);
    return 0;
  }
  for (const auto& line : describe_devices()) fmt::print("{}\n", line);
  const Peak peak = estimate_peak();

  const Layer layers[] = {
      {"qkv", kWidth, 3 * kWidth, true, false, false},
      {"attn_proj", kWidth, kWidth, true, false, false},
      {"fc", kWidth, 4 * kWidth, true, true, false},
      {"fc_proj", 4 * kWidth, kWidth, true, false, true},
      {"lm_head", kWidth, 50304, false, false, false},
  };
  size_t max_c = 0, max_oc = 0, max_weight = 0;
  for (const Layer& layer : layers) {
    max_c = std::max<size_t>(max_c, layer.C);
    max_oc = std::max<size_t>(max_oc, layer.OC);
    max_weight = std::max<size_t>(max_weight, size_t(layer.C) * layer.OC);
  }
  const size_t n = kTokens;
  const size_t pre_count = n * 4 * kWidth;  // the MLP's hidden activation, before GELU
  Buffer<bf16> inp(n * max_c), weight(max_weight), bias(max_oc), out(n * max_oc), pre(pre_count), dout(n * max_oc),
      dinp(n * max_c);
  Buffer<float> dweight(max_weight), dbias(max_oc);
  fill_normal(inp.ptr, n * max_c, 1.0f, 1);
  fill_normal(weight.ptr, max_weight, 0.02f, 2);
  fill_normal(bias.ptr, max_oc, 0.02f, 3);
  fill_normal(pre.ptr, pre_count, 1.0f, 4);
  fill_normal(dout.ptr, n * max_oc, 1.0f, 5);
  SWARM_CUDA_CHECK(cudaMemset(dinp.ptr, 0, n * max_c * sizeof(bf16)));
  SWARM_CUDA_CHECK(cudaMemset(dweight.ptr, 0, max_weight * sizeof(float)));
  SWARM_CUDA_CHECK(cudaMemset(dbias.ptr, 0, max_oc * sizeof(float)));

  cudaStream_t stream = nullptr;
  SWARM_CUDA_CHECK(cudaStreamCreate(&stream));
  double all_ours_ms = 0, all_best_ms = 0;
  for (const Layer& L : layers) {
    const int N = kTokens, C = L.C, OC = L.OC;
    const double flops = 2.0 * N * C * OC;  // each of the three GEMMs
    const bf16* b = L.bias ? bias.ptr : nullptr;
    bf16* fwd_pre = L.gelu_after ? pre.ptr : nullptr;
    const bf16* bwd_pre = L.gelu_before ? pre.ptr : nullptr;
    const std::string shape = fmt::format("{} [{}x{} -> {}]", L.name, N, C, OC);
    fmt::print("\ngemm {}{}{}{}\n", shape, L.bias ? ", bias" : "", L.gelu_after ? ", GELU epilogue" : "",
               L.gelu_before ? ", DGELU epilogue in backward" : "");

    // Forward.
    const double ours_fwd = bench::median_ms(
        [&] {
          if (L.gelu_after) check(matmul_gelu_forward(out.ptr, pre.ptr, inp.ptr, weight.ptr, b, N, C, OC, stream));
          else check(matmul_forward(out.ptr, inp.ptr, weight.ptr, b, N, C, OC, stream));
        },
        stream);
    const Best best_fwd = time_candidates(
        [&](int algo) {
          return matmul_forward_with_algo(algo, out.ptr, fwd_pre, inp.ptr, weight.ptr, b, N, C, OC, stream);
        },
        stream);
    // Backward, as the model calls it: both GEMMs and the dbias column sum.
    const double ours_bwd = bench::median_ms(
        [&] {
          float* db = L.bias ? dbias.ptr : nullptr;
          if (L.gelu_before) {
            check(matmul_backward_dgelu(dinp.ptr, dweight.ptr, db, dout.ptr, inp.ptr, weight.ptr, pre.ptr, N, C, OC,
                                        stream));
          } else {
            check(matmul_backward(dinp.ptr, dweight.ptr, db, dout.ptr, inp.ptr, weight.ptr, N, C, OC, stream));
          }
        },
        stream);
    const Best best_dinp = time_candidates(
        [&](int algo) {
          return matmul_backward_input_with_algo(algo, dinp.ptr, bwd_pre, dout.ptr, weight.ptr, N, C, OC, stream);
        },
        stream);
    const Best best_dweight = time_candidates(
        [&](int algo) {
          return matmul_backward_weight_with_algo(algo, dweight.ptr, dout.ptr, inp.ptr, N, C, OC, stream);
        },
        stream);

    auto report = [&](const char* what, const char* ours_label, double ours_ms, const Best& best) {
      std::string line = fmt::format(
          "  {:<14} {}: {:.4f} ms {:6.1f} TFLOP/s | cuBLASLt best: {:.4f} ms {:6.1f} TFLOP/s (candidate {} of {})", what,
          ours_label, ours_ms, tflops(flops, ours_ms), best.ms, tflops(flops, best.ms), best.algo, best.candidates);
      if (peak.tflops > 0) line += fmt::format(" | ours {:.1f}% of est. peak", 100.0 * tflops(flops, ours_ms) / peak.tflops);
      fmt::print("{}\n", line);
    };
    report(L.gelu_after ? "fwd (+GELU)" : "fwd", "ours", ours_fwd, best_fwd);
    report(L.gelu_before ? "bwd dinp+DGELU" : "bwd dinp", "ours (cand. 0)", best_dinp.candidate0_ms, best_dinp);
    report("bwd dweight", "ours (cand. 0)", best_dweight.candidate0_ms, best_dweight);
    const double best_bwd = best_dinp.ms + best_dweight.ms;
    fmt::print("  {:<14} ours: {:.4f} ms {:6.1f} TFLOP/s (matmul_backward{}{}) | best GEMMs: {:.4f} ms {:6.1f} TFLOP/s\n",
               "bwd total", ours_bwd, tflops(2 * flops, ours_bwd), L.gelu_before ? "_dgelu" : "",
               L.bias ? " incl. dbias" : "", best_bwd, tflops(2 * flops, best_bwd));
    const double ours_total = ours_fwd + ours_bwd;
    const double best_total = best_fwd.ms + best_bwd;
    all_ours_ms += ours_total;
    all_best_ms += best_total;
    fmt::print("ratio gemm {}: ours {:.2f} of cuBLASLt best (fwd + bwd: {:.4f} ms vs {:.4f} ms)\n", L.name,
               best_total / ours_total, ours_total, best_total);
  }
  SWARM_CUDA_CHECK(cudaStreamSynchronize(stream));
  SWARM_CUDA_CHECK(cudaGetLastError());
  SWARM_CUDA_CHECK(cudaStreamDestroy(stream));
  fmt::print("\nratio gemm overall: ours {:.2f} of cuBLASLt best (one block's GEMMs + LM head, fwd + bwd: {:.3f} ms vs "
             "{:.3f} ms)\n",
             all_best_ms / all_ours_ms, all_ours_ms, all_best_ms);
  fmt::print("epilogue fallbacks (our kernels instead of a cuBLASLt epilogue): {}\n", matmul_epilogue_fallbacks());
  return 0;
}

}  // namespace
}  // namespace swarm::cuda

int main() { return swarm::cuda::run(); }
