// Tensor::copy_from against a bare memcpy of the same bytes: the tensor layer
// must add nothing measurable on top of the memory system.
#include <cstring>

#include <benchmark/benchmark.h>

#include "bench/ratio_report.h"
#include "swarm/core/tensor.h"

namespace {

void BM_TensorCopy(benchmark::State& state) {
  const int64_t floats = state.range(0) / 4;
  swarm::Tensor source = *swarm::Tensor::zeros(swarm::Shape{floats}, swarm::DType::f32);
  swarm::Tensor target = *swarm::Tensor::zeros(swarm::Shape{floats}, swarm::DType::f32);
  for (auto _ : state) {
    swarm::Status status = target.copy_from(source);
    benchmark::DoNotOptimize(status);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

void BM_Memcpy(benchmark::State& state) {
  const int64_t floats = state.range(0) / 4;
  swarm::Tensor source = *swarm::Tensor::zeros(swarm::Shape{floats}, swarm::DType::f32);
  swarm::Tensor target = *swarm::Tensor::zeros(swarm::Shape{floats}, swarm::DType::f32);
  for (auto _ : state) {
    std::memcpy(target.raw_data(), source.raw_data(), state.range(0));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

// Interleaved so that both halves of each pair see the same machine state.
BENCHMARK(BM_TensorCopy)->Arg(4 << 10);
BENCHMARK(BM_Memcpy)->Arg(4 << 10);
BENCHMARK(BM_TensorCopy)->Arg(1 << 20);
BENCHMARK(BM_Memcpy)->Arg(1 << 20);
BENCHMARK(BM_TensorCopy)->Arg(64 << 20);
BENCHMARK(BM_Memcpy)->Arg(64 << 20);

SWARM_BENCH_RATIO("tensor copy 4 KiB vs memcpy", "BM_TensorCopy/4096", "BM_Memcpy/4096");
SWARM_BENCH_RATIO("tensor copy 1 MiB vs memcpy", "BM_TensorCopy/1048576", "BM_Memcpy/1048576");
SWARM_BENCH_RATIO("tensor copy 64 MiB vs memcpy", "BM_TensorCopy/67108864", "BM_Memcpy/67108864");

}  // namespace
