// Causal attention, bf16, the hand-written flash kernels against cuDNN's fused
// SDPA on the same inputs in the same run: GPT-2 small heads (12 x 64) at
// T = 1024 and a head size of 128. FLOPs count the causal half of the score
// matrix: forward 2 matmuls (4 * B * NH * T^2 * hd / 2), backward 2.5x that.
#include <cuda_runtime_api.h>

#include <fmt/core.h>

#include "bench/gpu/gpu_timer.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cudnn_attention.h"
#include "tests/cuda/cuda_test_util.h"

using namespace swarm;

namespace {

struct Shape {
  int B, T, C, NH;
};

void run(const Shape& s, cudaStream_t stream) {
  const size_t tokens = size_t(s.B) * s.T;
  cuda::testing::DeviceArray<bf16> qkv(cuda::testing::to_bf16(cuda::testing::random_vector(tokens * 3 * s.C, 1))),
      out(tokens * s.C), dout(cuda::testing::to_bf16(cuda::testing::random_vector(tokens * s.C, 2))),
      dqkv(tokens * 3 * s.C);
  const int64_t scratch_floats =
      std::max(cuda::attention_scratch_floats(s.B, s.T, s.NH), cuda::cudnn_attention_scratch_floats(s.B, s.T, s.NH));
  cuda::testing::DeviceArray<float> scratch{size_t(scratch_floats)};
  const int hd = s.C / s.NH;
  const double forward_flops = 4.0 * s.B * s.NH * double(s.T) * s.T * hd / 2;
  const double backward_flops = 2.5 * forward_flops;
  const std::string label = fmt::format("B={} T={} NH={} hd={}", s.B, s.T, s.NH, hd);

  double ms[2][2] = {};  // [ours, cudnn][forward, backward]
  bool cudnn_ok = true;
  for (int impl = 0; impl < 2; ++impl) {
    auto forward = [&] {
      return impl == 0 ? cuda::attention_forward(out.get(), scratch.get(), qkv.get(), s.B, s.T, s.C, s.NH, stream)
                       : cuda::cudnn_attention_forward(out.get(), scratch.get(), qkv.get(), s.B, s.T, s.C, s.NH, stream);
    };
    auto backward = [&] {
      return impl == 0 ? cuda::attention_backward(dqkv.get(), scratch.get(), dout.get(), qkv.get(), out.get(), s.B,
                                                  s.T, s.C, s.NH, stream)
                       : cuda::cudnn_attention_backward(dqkv.get(), scratch.get(), dout.get(), qkv.get(), out.get(),
                                                        s.B, s.T, s.C, s.NH, stream);
    };
    Status first = forward();
    if (first.is_ok()) first = backward();
    if (!first.is_ok()) {
      fmt::print("{} {}: not run: {}\n", impl == 0 ? "hand-written" : "cuDNN", label, first.to_string());
      if (impl == 1) cudnn_ok = false;
      if (impl == 0) return;
      continue;
    }
    ms[impl][0] = bench::median_ms([&] { (void)forward(); }, stream);
    ms[impl][1] = bench::median_ms([&] { (void)backward(); }, stream);
    fmt::print("{} {}: forward {:.1f} TFLOP/s ({:.3f} ms), backward {:.1f} TFLOP/s ({:.3f} ms)\n",
               impl == 0 ? "hand-written" : "cuDNN", label, forward_flops / (ms[impl][0] * 1e-3) / 1e12, ms[impl][0],
               backward_flops / (ms[impl][1] * 1e-3) / 1e12, ms[impl][1]);
  }
  if (cudnn_ok) {
    fmt::print("ratio attention forward {}: hand-written is {:.2f}x the speed of cuDNN\n", label, ms[1][0] / ms[0][0]);
    fmt::print("ratio attention backward {}: hand-written is {:.2f}x the speed of cuDNN\n", label, ms[1][1] / ms[0][1]);
  }
}

}  // namespace

int main() {
  if (cuda::testing::skip_without_device()) return 0;
  const double peak = bench::dense_bf16_peak_tflops();
  if (peak > 0) fmt::print("dense bf16 peak (estimate from SMs x clock): {:.0f} TFLOP/s\n", peak);
  run({8, 1024, 768, 12}, nullptr);
  run({4, 2048, 1024, 8}, nullptr);
  return 0;
}
