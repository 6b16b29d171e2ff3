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

enum class BoundaryKind { none, bottleneck, maxout };

// The layers at one stage cut. k divides the width: the tensor crossing the
// cut is [B, T, d_model / k], so none has k = 1 and the others k in {2, 4}.
struct BoundaryLayer {
  BoundaryKind kind = BoundaryKind::none;
  int k = 1;

  bool compresses() const { return kind != BoundaryKind::none; }
  int wire_width(int d_model) const { return d_model / k; }
  Status validate(int d_model) const;
  // Parameters the sending resp. receiving stage holds for this cut.
  int64_t sender_parameter_count(int d_model) const;
  int64_t receiver_parameter_count(int d_model) const;
  // "none", "bottleneck:4", "maxout:2": what parse_boundary_layers reads.
  std::string to_string() const;

  friend bool operator==(const BoundaryLayer&, const BoundaryLayer&) = default;
};

// "none", "bottleneck:K" or "maxout:K" (K 2 or 4), one for every cut or a
// comma-separated list with one per cut: "maxout:2,none,bottleneck:2".
Result<std::vector<BoundaryLayer>> parse_boundary_layers(std::string_view text);
// The inverse of parse_boundary_layers; "none" for an empty list.
std::string format_boundary_layers(const std::vector<BoundaryLayer>& layers);

struct GptConfig {
  int vocab_size = 256;   // bytes
  int max_seq_len = 128;
  int d_model = 128;
  int n_heads = 4;
  int n_layers = 4;       // distinct blocks in the whole model
  int layer_repeat = 1;   // R: each block is applied R times in a row
  // Per stage cut: empty = none at every cut; one entry = that entry at every
  // cut; otherwise one entry per cut (num_stages - 1 of them).
  std::vector<BoundaryLayer> boundaries;

  Status validate() const;
  // Whether `boundaries` suits a split into num_stages (see above).
  Status check_boundaries_fit(int num_stages) const;
  // The layers at the cut after stage `stage_index`, for a split the
  // boundaries fit (check_boundaries_fit).
  BoundaryLayer boundary_after(int stage_index) const;
  // Of the model split into num_stages, boundary layers included; 1: the unsplit model.
  int64_t parameter_count(int num_stages = 1) const;
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

// Both check that config.boundaries fit the number of stages.
// Splits n_layers into num_stages contiguous runs, sizes differing by at most one.
Result<std::vector<StageLayout>> partition_layers(const GptConfig& config, int num_stages);

// A split at explicit boundaries: {0, 1, 4} gives stages [0,1) and [1,4).
Result<std::vector<StageLayout>> partition_at(const GptConfig& config,
                                              const std::vector<int>& boundaries);

// FLOPs per token of one forward through `layers` blocks of width d with causal
// attention over `seq` tokens: 24·d² for the four dense GEMMs (QKV, the
// projection and the 4d MLP, 2 FLOPs per multiply-add) and 4·seq·d for the
// scores and the weighted sum.
double block_forward_flops_per_token(int64_t d_model, int64_t seq, int64_t layers);

// One forward of a stage, per token: its blocks (each applied layer_repeat
// times), the head's 2·d·vocab on the last stage, and the projections of a
// bottleneck at its cuts. A backward costs about twice this.
double stage_forward_flops_per_token(const GptConfig& config, const StageLayout& layout);

}  // namespace swarm::gpt
