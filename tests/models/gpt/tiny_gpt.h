// tiny_gpt: the model and batches the GPT stage tests share, small enough for
// finite differences over every parameter (d_model 8, 3 layers, vocabulary 11).
#pragma once

#include <cstdint>
#include <random>

#include "models/gpt/config.h"
#include "swarm/core/tensor.h"

namespace swarm::gpt::testing {

inline GptConfig tiny_config(int layer_repeat = 1) {
  GptConfig config;
  config.vocab_size = 11;
  config.max_seq_len = 6;
  config.d_model = 8;
  config.n_heads = 2;
  config.n_layers = 3;
  config.layer_repeat = layer_repeat;
  return config;
}

struct Batch {
  Tensor inputs, targets;
};

// Tokens and targets drawn from `seed`.
inline Batch random_batch(const GptConfig& config, int B, int T, uint32_t seed) {
  std::mt19937 rng(seed);
  Batch batch{*Tensor::empty(Shape{B, T}, DType::i32), *Tensor::empty(Shape{B, T}, DType::i32)};
  for (auto& id : batch.inputs.span<int32_t>()) id = static_cast<int32_t>(rng() % config.vocab_size);
  for (auto& id : batch.targets.span<int32_t>()) id = static_cast<int32_t>(rng() % config.vocab_size);
  return batch;
}

}  // namespace swarm::gpt::testing
