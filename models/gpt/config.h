// config: the shape of a GPT model and how its layers are cut into stages.
//
// A stage holds a contiguous run of layers. The first stage also holds the
// token and position embeddings, the last one the final LayerNorm, the LM head
// and the loss. With layer sharing (ALBERT-style), each block is applied
// `layer_repeat` times in a row, so the paper's stage is one block applied 16
// times, and any split computes the same function as the whole model.
//
//   swarm::gpt::GptConfig config;                        // d_model 128, 4 layers
//   auto stages = swarm::gpt::partition_layers(config, 2);  // layers [0,2) and [2,4)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "swarm/core/status.h"

namespace swarm::gpt {

struct GptConfig {
  int vocab_size = 256;   // bytes
  int max_seq_len = 128;
  int d_model = 128;
  int n_heads = 4;
  int n_layers = 4;       // distinct blocks in the whole model
  int layer_repeat = 1;   // R: each block is applied R times in a row

  Status validate() const;
  int64_t parameter_count() const;
  std::string to_json() const;
  static Result<GptConfig> from_json(const std::string& text);

  friend bool operator==(const GptConfig&, const GptConfig&) = default;
};

struct StageLayout {
  int stage_index = 0;
  int num_stages = 1;
  int first_layer = 0;  // inclusive
  int end_layer = 0;    // exclusive

  bool has_embedding() const { return stage_index == 0; }
  bool has_head() const { return stage_index == num_stages - 1; }
  int num_layers() const { return end_layer - first_layer; }

  friend bool operator==(const StageLayout&, const StageLayout&) = default;
};

// Splits n_layers into num_stages contiguous runs, sizes differing by at most one.
Result<std::vector<StageLayout>> partition_layers(const GptConfig& config, int num_stages);

// A split at explicit boundaries: {0, 1, 4} gives stages [0,1) and [1,4).
Result<std::vector<StageLayout>> partition_at(const GptConfig& config,
                                              const std::vector<int>& boundaries);

}  // namespace swarm::gpt
