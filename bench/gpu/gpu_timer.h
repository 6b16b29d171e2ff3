// gpu_timer: times device work with CUDA events, for the GPU benchmarks.
//
// Host clocks would measure launch overhead and queueing; events measure the
// stream. Each measurement warms up, then takes the median of several timed
// batches, so one slow batch (clock ramp, another tenant) does not move it.
//
//   double ms = swarm::bench::median_ms([&] { my_kernel(args, stream); }, stream);
//   double tflops = 2.0 * M * N * K / (ms * 1e-3) / 1e12;
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "kernels/cuda/cuda_check.h"

namespace swarm::bench {

// Milliseconds per call of `work` on `stream`: the median over `batches` of
// `calls_per_batch` back-to-back calls, after `warmup` untimed calls.
inline double median_ms(const std::function<void()>& work, cudaStream_t stream, int warmup = 3,
                        int batches = 7, int calls_per_batch = 10) {
  for (int i = 0; i < warmup; ++i) work();
  cudaEvent_t start, stop;
  SWARM_CUDA_CHECK(cudaEventCreate(&start));
  SWARM_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> per_call;
  for (int b = 0; b < batches; ++b) {
    SWARM_CUDA_CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < calls_per_batch; ++i) work();
    SWARM_CUDA_CHECK(cudaEventRecord(stop, stream));
    SWARM_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    SWARM_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    per_call.push_back(static_cast<double>(ms) / calls_per_batch);
  }
  SWARM_CUDA_CHECK(cudaEventDestroy(start));
  SWARM_CUDA_CHECK(cudaEventDestroy(stop));
  std::nth_element(per_call.begin(), per_call.begin() + per_call.size() / 2, per_call.end());
  return per_call[per_call.size() / 2];
}

// Device-to-device copy bandwidth in GB/s (bytes read + bytes written), the
// ceiling that memory-bound kernels are reported against.
inline double copy_bandwidth_gbps(size_t bytes, cudaStream_t stream) {
  void *src = nullptr, *dst = nullptr;
  SWARM_CUDA_CHECK(cudaMalloc(&src, bytes));
  SWARM_CUDA_CHECK(cudaMalloc(&dst, bytes));
  SWARM_CUDA_CHECK(cudaMemsetAsync(src, 1, bytes, stream));
  const double ms =
      median_ms([&] { SWARM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream)); }, stream);
  SWARM_CUDA_CHECK(cudaFree(src));
  SWARM_CUDA_CHECK(cudaFree(dst));
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
}

// An estimate of the device's dense bf16 tensor-core peak in TFLOP/s: SMs x
// boost clock x FLOP per clock per SM (4096 on Hopper, 2048 on Ampere; 0 when
// the architecture is not one of those, so callers print no fraction).
inline double dense_bf16_peak_tflops() {
  int device = 0, sms = 0, khz = 0, major = 0;
  SWARM_CUDA_CHECK(cudaGetDevice(&device));
  SWARM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  SWARM_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device));
  SWARM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  const double flop_per_clock = major == 9 ? 4096 : major == 8 ? 2048 : 0;
  return sms * (khz * 1e3) * flop_per_clock / 1e12;
}

}  // namespace swarm::bench
