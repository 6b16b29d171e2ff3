// Shared by the tests of swarm/layers: the CPU backend they run on, seeded
// tensors, and the plain SGD step a trainer's optimizer stands in for.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "swarm/core/tensor.h"
#include "swarm/layers/layers.h"

namespace swarm::layers::testing {

using Cpu = HostOps<CpuBackend>;
static_assert(Backend<Cpu> && TanhBackend<Cpu> && MeanSquaredErrorBackend<Cpu>);

inline Tensor normal_tensor(const Shape& shape, uint64_t seed, float scale = 1.0f) {
  Tensor t = *Tensor::empty(shape, DType::f32);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  for (float& v : t.span<float>()) v = normal(rng);
  return t;
}

inline Tensor ids_tensor(const Shape& shape, int limit, uint64_t seed) {
  Tensor t = *Tensor::empty(shape, DType::i32);
  std::mt19937_64 rng(seed);
  for (int32_t& v : t.span<int32_t>()) v = static_cast<int32_t>(rng() % limit);
  return t;
}

inline Tensor scalar(float value) {
  Tensor t = *Tensor::empty(Shape{1}, DType::f32);
  t.data<float>()[0] = value;
  return t;
}

// value -= learning_rate * grad for every parameter, then the gradients are zeroed.
template <Stage S>
Status sgd_step(S& stage, float learning_rate) {
  for (const StageParameterView& p : stage.parameter_views()) {
    float* value = p.value.data<float>();
    const float* grad = p.grad.data<float>();
    for (int64_t i = 0; i < p.value.numel(); ++i) value[i] -= learning_rate * grad[i];
  }
  return stage.zero_grad();
}

}  // namespace swarm::layers::testing
