// init: deterministic parameter initialization, keyed by (seed, parameter name).
//
// Keying on the name rather than on creation order means a model split into
// any stages starts with exactly the weights of the unsplit model, and peers of
// one stage start identical without talking to each other.
//
//   swarm::Tensor w = swarm::gpt::make_initialized("h.0.mlp.fc.weight", swarm::Shape{512, 128},
//                                                  swarm::gpt::InitKind::normal, 0.02f, seed);
#pragma once

#include <cstdint>
#include <string_view>

#include "swarm/core/tensor.h"

namespace swarm::gpt {

enum class InitKind { normal, zeros, ones };

// A host f32 tensor. Normal values come from SplitMix64 and Box-Muller, written
// out here so the numbers do not depend on the standard library's distributions.
Tensor make_initialized(std::string_view name, const Shape& shape, InitKind kind, float stddev,
                        uint64_t seed);

uint64_t name_hash(std::string_view name);

}  // namespace swarm::gpt
