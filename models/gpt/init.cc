#include "models/gpt/init.h"

#include <cmath>

#include "swarm/core/random.h"

namespace swarm::gpt {
namespace {

// Uniform in (0, 1]: never zero, so log() below is finite.
double uniform_open(SplitMix64& rng) { return rng.next_unit() + 0x1.0p-53; }

}  // namespace

uint64_t name_hash(std::string_view name) {
  uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a
  for (char c : name) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001b3ull;
  }
  return hash;
}

Tensor make_initialized(std::string_view name, const Shape& shape, InitKind kind, float stddev,
                        uint64_t seed) {
  Tensor tensor = *Tensor::empty(shape, DType::f32);
  float* data = tensor.data<float>();
  const int64_t n = tensor.numel();
  if (kind != InitKind::normal) {
    const float fill = kind == InitKind::ones ? 1.0f : 0.0f;
    for (int64_t i = 0; i < n; ++i) data[i] = fill;
    return tensor;
  }
  SplitMix64 rng(seed ^ name_hash(name));
  constexpr double kTwoPi = 6.283185307179586;
  for (int64_t i = 0; i < n; i += 2) {
    const double radius = std::sqrt(-2.0 * std::log(uniform_open(rng)));
    const double angle = kTwoPi * uniform_open(rng);
    data[i] = static_cast<float>(radius * std::cos(angle) * stddev);
    if (i + 1 < n) data[i + 1] = static_cast<float>(radius * std::sin(angle) * stddev);
  }
  return tensor;
}

}  // namespace swarm::gpt
