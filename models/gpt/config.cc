#include "models/gpt/config.h"

#include <nlohmann/json.hpp>

namespace swarm::gpt {

Status GptConfig::validate() const {
  if (vocab_size <= 0) return invalid_argument("vocab_size must be positive, got {}", vocab_size);
  if (max_seq_len <= 0) return invalid_argument("max_seq_len must be positive, got {}", max_seq_len);
  if (d_model <= 0 || n_heads <= 0) {
    return invalid_argument("d_model ({}) and n_heads ({}) must be positive", d_model, n_heads);
  }
  if (d_model % n_heads != 0) {
    return invalid_argument("d_model {} is not divisible by n_heads {}", d_model, n_heads);
  }
  if (n_layers <= 0) return invalid_argument("n_layers must be positive, got {}", n_layers);
  if (layer_repeat <= 0) return invalid_argument("layer_repeat must be positive, got {}", layer_repeat);
  return Status::ok();
}

int64_t GptConfig::parameter_count() const {
  const int64_t C = d_model;
  const int64_t per_block = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) +
                            (4 * C * C + C);
  return vocab_size * C + max_seq_len * C + n_layers * per_block + 2 * C + vocab_size * C;
}

std::string GptConfig::to_json() const {
  nlohmann::json j = {{"vocab_size", vocab_size}, {"max_seq_len", max_seq_len},
                      {"d_model", d_model},       {"n_heads", n_heads},
                      {"n_layers", n_layers},     {"layer_repeat", layer_repeat}};
  return j.dump();
}

Result<GptConfig> GptConfig::from_json(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument("model config is not a JSON object");
  GptConfig config;
  auto read = [&](const char* key, int* field) -> Status {
    if (!j.contains(key)) return invalid_argument("model config lacks \"{}\"", key);
    if (!j[key].is_number_integer()) return invalid_argument("model config \"{}\" is not an integer", key);
    *field = j[key].get<int>();
    return Status::ok();
  };
  SWARM_RETURN_IF_ERROR(read("vocab_size", &config.vocab_size));
  SWARM_RETURN_IF_ERROR(read("max_seq_len", &config.max_seq_len));
  SWARM_RETURN_IF_ERROR(read("d_model", &config.d_model));
  SWARM_RETURN_IF_ERROR(read("n_heads", &config.n_heads));
  SWARM_RETURN_IF_ERROR(read("n_layers", &config.n_layers));
  SWARM_RETURN_IF_ERROR(read("layer_repeat", &config.layer_repeat));
  SWARM_RETURN_IF_ERROR(config.validate());
  return config;
}

Result<std::vector<StageLayout>> partition_at(const GptConfig& config,
                                              const std::vector<int>& boundaries) {
  SWARM_RETURN_IF_ERROR(config.validate());
  if (boundaries.size() < 2 || boundaries.front() != 0 || boundaries.back() != config.n_layers) {
    return invalid_argument("stage boundaries must run from 0 to n_layers ({})", config.n_layers);
  }
  std::vector<StageLayout> stages;
  const int num_stages = static_cast<int>(boundaries.size()) - 1;
  for (int s = 0; s < num_stages; ++s) {
    if (boundaries[s + 1] <= boundaries[s]) {
      return invalid_argument("stage {} would hold no layers (boundaries {} and {})", s,
                              boundaries[s], boundaries[s + 1]);
    }
    stages.push_back({s, num_stages, boundaries[s], boundaries[s + 1]});
  }
  return stages;
}

Result<std::vector<StageLayout>> partition_layers(const GptConfig& config, int num_stages) {
  SWARM_RETURN_IF_ERROR(config.validate());
  if (num_stages <= 0 || num_stages > config.n_layers) {
    return invalid_argument("cannot split {} layers into {} stages", config.n_layers, num_stages);
  }
  std::vector<int> boundaries{0};
  for (int s = 0; s < num_stages; ++s) {
    const int size = config.n_layers / num_stages + (s < config.n_layers % num_stages ? 1 : 0);
    boundaries.push_back(boundaries.back() + size);
  }
  return partition_at(config, boundaries);
}

}  // namespace swarm::gpt
