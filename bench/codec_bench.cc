// The wire codecs against memcpy of the same f32 bytes: every activation and
// gradient crossing the network is encoded once and decoded once, so a codec
// must run at close to memory speed. Throughput is counted in f32 input bytes
// (4 per value) for encode and decode alike, so the GB/s columns compare
// directly; the ratios at the end are ours/memcpy from the same run.
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "bench/ratio_report.h"
#include "swarm/compression/codecs.h"

namespace {

using swarm::compression::Bf16Codec;
using swarm::compression::Blockwise4Codec;
using swarm::compression::Blockwise8Codec;
using swarm::compression::Fp16Codec;
using swarm::compression::NoneCodec;

std::vector<float> activations(std::size_t n) {
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

void memcpy_f32(benchmark::State& state, std::size_t n) {
  const std::vector<float> source = activations(n);
  std::vector<float> target(n);
  for (auto _ : state) {
    std::memcpy(target.data(), source.data(), n * sizeof(float));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * sizeof(float)));
}

template <swarm::Codec C>
void encode(benchmark::State& state, std::size_t n) {
  const std::vector<float> values = activations(n);
  std::vector<std::byte> frame(*C::encoded_bytes(n));
  for (auto _ : state) {
    swarm::Status status = C::encode(values, frame);
    benchmark::DoNotOptimize(status);
    benchmark::ClobberMemory();
  }
  if (!C::encode(values, frame).is_ok()) state.SkipWithError("encode failed");
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * sizeof(float)));
}

template <swarm::Codec C>
void decode(benchmark::State& state, std::size_t n) {
  const std::vector<float> values = activations(n);
  std::vector<std::byte> frame(*C::encoded_bytes(n));
  if (!C::encode(values, frame).is_ok()) state.SkipWithError("encode failed");
  std::vector<float> out(n);
  for (auto _ : state) {
    swarm::Status status = C::decode(frame, out);
    benchmark::DoNotOptimize(status);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * sizeof(float)));
}

template <swarm::Codec C>
void register_codec(std::size_t n, const std::string& size, const std::string& baseline) {
  const std::string name(swarm::codec_name(C::id));
  const std::string enc = "BM_Encode/" + name + "/" + size;
  const std::string dec = "BM_Decode/" + name + "/" + size;
  benchmark::RegisterBenchmark(enc.c_str(), [n](benchmark::State& s) { encode<C>(s, n); });
  benchmark::RegisterBenchmark(dec.c_str(), [n](benchmark::State& s) { decode<C>(s, n); });
  swarm::bench::register_ratio({name + " encode " + size + " vs memcpy", enc, baseline});
  swarm::bench::register_ratio({name + " decode " + size + " vs memcpy", dec, baseline});
}

// Each size's memcpy runs just before its codecs, so a pair sees the same machine state.
const bool registered = [] {
  for (int log2 : {20, 22}) {
    const std::size_t n = std::size_t{1} << log2;
    const std::string size = "2^" + std::to_string(log2);
    const std::string baseline = "BM_Memcpy/" + size;
    benchmark::RegisterBenchmark(baseline.c_str(), [n](benchmark::State& s) { memcpy_f32(s, n); });
    register_codec<NoneCodec>(n, size, baseline);
    register_codec<Fp16Codec>(n, size, baseline);
    register_codec<Bf16Codec>(n, size, baseline);
    register_codec<Blockwise8Codec>(n, size, baseline);
    register_codec<Blockwise4Codec>(n, size, baseline);
  }
  return true;
}();

}  // namespace
