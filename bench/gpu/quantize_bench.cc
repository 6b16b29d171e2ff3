// quantize_bench: 8-bit blockwise quantize and dequantize of 64M floats, in GB/s
// (bytes read + written) and as a fraction of the device-to-device copy
// bandwidth measured in the same run, the ceiling for a memory-bound codec.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include <fmt/core.h>

#include "bench/gpu/gpu_timer.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/quantize.h"
#include "swarm/core/codebook8.h"
#include "swarm/core/dtype.h"

namespace {

// Cheap deterministic inputs (a hash, not a normal RNG: 64M values in well under a second).
std::vector<float> bench_values(std::size_t n) {
  std::vector<float> v(n);
  uint32_t state = 12345u;
  for (std::size_t i = 0; i < n; ++i) {
    state = state * 1664525u + 1013904223u;
    const float unit = static_cast<float>(state >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f;  // [-1, 1)
    v[i] = unit * unit * unit * static_cast<float>(1 + (i >> 12) % 7);  // denser near 0, scale per block
  }
  return v;
}

int run() {
  using namespace swarm;
  constexpr int64_t n = int64_t{64} << 20;
  const int64_t blocks = compression::blockwise8_num_blocks(n);
  const double value_bytes = 4.0 * n, code_bytes = 1.0 * n, absmax_bytes = 4.0 * blocks;
  const double bf16_bytes = 2.0 * n;

  const std::vector<float> host = bench_values(static_cast<std::size_t>(n));
  std::vector<bf16> host_bf16(host.size());
  for (std::size_t i = 0; i < host.size(); ++i) host_bf16[i] = bf16::from_float(host[i]);
  float* values = nullptr;
  float* decoded = nullptr;
  bf16* values_bf16 = nullptr;
  uint8_t* codes = nullptr;
  float* absmax = nullptr;
  SWARM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&values), n * sizeof(float)));
  SWARM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&decoded), n * sizeof(float)));
  SWARM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&values_bf16), n * sizeof(bf16)));
  SWARM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&codes), n));
  SWARM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&absmax), blocks * sizeof(float)));
  SWARM_CUDA_CHECK(cudaMemcpy(values, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  SWARM_CUDA_CHECK(cudaMemcpy(values_bf16, host_bf16.data(), n * sizeof(bf16), cudaMemcpyHostToDevice));
  cudaStream_t stream = nullptr;
  SWARM_CUDA_CHECK(cudaStreamCreate(&stream));

  auto must = [](Status status) {
    if (!status.is_ok()) fatal_error(__FILE__, __LINE__, status.to_string());
  };
  const double copy_gbps = bench::copy_bandwidth_gbps(static_cast<std::size_t>(value_bytes), stream);
  const double quantize_ms =
      bench::median_ms([&] { must(cuda::quantize_blockwise8(codes, absmax, values, n, stream)); }, stream);
  const double dequantize_ms =
      bench::median_ms([&] { must(cuda::dequantize_blockwise8(decoded, codes, absmax, n, stream)); }, stream);
  const double quantize_bf16_ms =
      bench::median_ms([&] { must(cuda::quantize_blockwise8(codes, absmax, values_bf16, n, stream)); }, stream);
  const double dequantize_bf16_ms =
      bench::median_ms([&] { must(cuda::dequantize_blockwise8(values_bf16, codes, absmax, n, stream)); }, stream);
  SWARM_CUDA_CHECK(cudaStreamSynchronize(stream));

  auto gbps = [](double bytes, double ms) { return bytes / (ms * 1e-3) / 1e9; };
  const double quantize_gbps = gbps(value_bytes + code_bytes + absmax_bytes, quantize_ms);
  const double dequantize_gbps = gbps(code_bytes + absmax_bytes + value_bytes, dequantize_ms);
  fmt::print("blockwise8 on {} f32 values ({} blocks of 4096)\n", n, blocks);
  fmt::print("D2D copy:            {:8.1f} GB/s (read + write)\n", copy_gbps);
  fmt::print("quantize f32:        {:8.3f} ms  {:8.1f} GB/s\n", quantize_ms, quantize_gbps);
  fmt::print("dequantize f32:      {:8.3f} ms  {:8.1f} GB/s\n", dequantize_ms, dequantize_gbps);
  fmt::print("quantize bf16:       {:8.3f} ms  {:8.1f} GB/s\n", quantize_bf16_ms,
             gbps(bf16_bytes + code_bytes + absmax_bytes, quantize_bf16_ms));
  fmt::print("dequantize bf16:     {:8.3f} ms  {:8.1f} GB/s\n", dequantize_bf16_ms,
             gbps(code_bytes + absmax_bytes + bf16_bytes, dequantize_bf16_ms));
  fmt::print("ratio quantize: {:.2f} of D2D copy bandwidth\n", quantize_gbps / copy_gbps);
  fmt::print("ratio dequantize: {:.2f} of D2D copy bandwidth\n", dequantize_gbps / copy_gbps);

  SWARM_CUDA_CHECK(cudaStreamDestroy(stream));
  SWARM_CUDA_CHECK(cudaFree(values));
  SWARM_CUDA_CHECK(cudaFree(decoded));
  SWARM_CUDA_CHECK(cudaFree(values_bf16));
  SWARM_CUDA_CHECK(cudaFree(codes));
  SWARM_CUDA_CHECK(cudaFree(absmax));
  return 0;
}

}  // namespace

int main() {
  const swarm::cuda::DeviceCount devices = swarm::cuda::count_devices();
  if (devices.count == 0) {
    fmt::print("skipped: no CUDA device ({})\n", devices.reason);
    return 0;
  }
  return run();
}
