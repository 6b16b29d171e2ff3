// LayerNorm forward, fused residual + LayerNorm, and backward, bf16, on a GPT-2
// small activation (8192 tokens x 768), in GB/s as a fraction of the device-to-
// device copy bandwidth measured in the same run. Bytes are the minimum each op
// must move: its reads plus its writes.
#include <cuda_runtime_api.h>

#include <fmt/core.h>

#include "bench/gpu/gpu_timer.h"
#include "kernels/cuda/layernorm.h"
#include "tests/cuda/cuda_test_util.h"

using namespace swarm;

int main() {
  if (cuda::testing::skip_without_device()) return 0;
  const int N = 8192, C = 768;
  const size_t NC = size_t(N) * C;
  cuda::testing::DeviceArray<bf16> x(cuda::testing::to_bf16(cuda::testing::random_vector(NC, 1))),
      y(cuda::testing::to_bf16(cuda::testing::random_vector(NC, 2))), out(NC), residual(NC), dx(NC),
      dy(cuda::testing::to_bf16(cuda::testing::random_vector(NC, 3))),
      w(cuda::testing::to_bf16(cuda::testing::random_vector(C, 4))), b{size_t(C)};
  cuda::testing::DeviceArray<float> mean{size_t(N)}, rstd{size_t(N)}, dw{size_t(C)}, db{size_t(C)};
  cudaStream_t stream = nullptr;

  const double copy_gbps = bench::copy_bandwidth_gbps(NC * sizeof(bf16) * 8, stream);
  fmt::print("device-to-device copy: {:.0f} GB/s\n", copy_gbps);
  auto report = [&](const char* name, double ms, double bytes) {
    const double gbps = bytes / (ms * 1e-3) / 1e9;
    fmt::print("{}: {:.1f} us, {:.0f} GB/s\n", name, ms * 1e3, gbps);
    fmt::print("ratio layernorm {}: {:.2f} of D2D copy bandwidth\n", name, gbps / copy_gbps);
  };
  auto check = [](Status status) {
    if (!status.is_ok()) fatal_error(__FILE__, __LINE__, status.to_string());
  };
  const double value = 2.0 * NC;  // bytes of one bf16 [N, C] tensor
  report("forward", bench::median_ms([&] {
           check(cuda::layernorm_forward(out.get(), mean.get(), rstd.get(), x.get(), w.get(), b.get(), N, C, stream));
         }, stream),
         value * 2 + 8.0 * N);
  report("residual+forward", bench::median_ms([&] {
           check(cuda::residual_layernorm_forward(residual.get(), out.get(), mean.get(), rstd.get(), x.get(), y.get(),
                                                  w.get(), b.get(), N, C, stream));
         }, stream),
         value * 4 + 8.0 * N);
  // Reads dout and inp twice in principle (input gradient and column sums),
  // counted once: the bound is what an ideal single pass would move.
  report("backward", bench::median_ms([&] {
           check(cuda::layernorm_backward(dx.get(), dw.get(), db.get(), dy.get(), x.get(), w.get(), mean.get(),
                                          rstd.get(), N, C, stream));
         }, stream),
         value * 4 + 8.0 * N);
  return 0;
}
