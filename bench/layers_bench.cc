// A stage built from swarm/layers beside the hand-written MLP stage it replaces
// (models/mlp): Linear then GELU, 256 -> 256, on 64 rows, forward and backward per
// iteration: the same kernels run either way, so the ratio is what the layers'
// generality costs (one run: 0.90x; the layers copy each layer's input for the
// recomputing backward). Written with user_bench.h, as a user's own would be.
#include <random>

#include "bench/user_bench.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/mlp/mlp_stage.h"
#include "swarm/layers/layers.h"

namespace {

namespace L = swarm::layers;
using Cpu = L::HostOps<swarm::CpuBackend>;
using LinearGelu = L::Sequential<L::Linear<Cpu>, L::Gelu<Cpu>>;

constexpr int kWidth = 256;

swarm::Microbatch rows(int count) {
  swarm::Microbatch batch{*swarm::Tensor::empty({count, kWidth}, swarm::DType::f32), {}, count};
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (float& x : batch.inputs.span<float>()) x = normal(rng);
  return batch;
}

const bool registered = swarm::bench::compare_stages(
    "Linear+GELU from layers vs the hand-written MLP stage, 256x256, 64 rows",
    [] { return *LinearGelu::create(3, L::Linear<Cpu>(kWidth, kWidth), L::Gelu<Cpu>()); },
    [] { return *swarm::mlp::MlpStage::create({.in = kWidth, .out = kWidth, .gelu = true}, 3); }, rows(64));

}  // namespace
