#include "models/gpt/config.h"

#include <charconv>

#include <nlohmann/json.hpp>

namespace swarm::gpt {
namespace {

const char* kind_name(BoundaryKind kind) {
  switch (kind) {
    case BoundaryKind::none: return "none";
    case BoundaryKind::bottleneck: return "bottleneck";
    case BoundaryKind::maxout: return "maxout";
  }
  return "?";
}

Result<BoundaryKind> kind_from_name(std::string_view name) {
  for (BoundaryKind kind : {BoundaryKind::none, BoundaryKind::bottleneck, BoundaryKind::maxout}) {
    if (name == kind_name(kind)) return kind;
  }
  return invalid_argument("unknown boundary layer \"{}\": expected none, bottleneck or maxout", name);
}

// Checked here rather than in validate() alone so that a parse error names the text.
Result<BoundaryLayer> make_boundary_layer(BoundaryKind kind, int64_t k) {
  BoundaryLayer layer{kind, static_cast<int>(k)};
  if (kind == BoundaryKind::none && k != 1) return invalid_argument("boundary layer none takes no k (got {})", k);
  if (kind != BoundaryKind::none && k != 2 && k != 4) {
    return invalid_argument("boundary layer {} needs k 2 or 4, got {}", kind_name(kind), k);
  }
  return layer;
}

std::string_view trimmed(std::string_view text) {
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  return text;
}

// One entry: "none", "bottleneck:K" or "maxout:K".
Result<BoundaryLayer> parse_boundary_layer(std::string_view entry) {
  const size_t colon = entry.find(':');
  SWARM_ASSIGN_OR_RETURN(BoundaryKind kind, kind_from_name(entry.substr(0, colon)));
  if (colon == std::string_view::npos) {
    if (kind != BoundaryKind::none) {
      return invalid_argument("boundary layer \"{}\" lacks its k: write {}:2 or {}:4", entry, entry, entry);
    }
    return BoundaryLayer{};
  }
  const std::string_view digits = entry.substr(colon + 1);
  int64_t k = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), k);
  if (error != std::errc() || end != digits.data() + digits.size() || digits.empty()) {
    return invalid_argument("boundary layer \"{}\": k \"{}\" is not an integer", entry, digits);
  }
  return make_boundary_layer(kind, k);
}

nlohmann::json boundary_json(const BoundaryLayer& layer) {
  nlohmann::json j = {{"kind", kind_name(layer.kind)}};
  if (layer.compresses()) j["k"] = layer.k;
  return j;
}

Result<BoundaryLayer> boundary_from_json(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("kind") || !j["kind"].is_string()) {
    return invalid_argument("model config: each boundary layer is an object with a string \"kind\", got {}",
                            j.dump());
  }
  SWARM_ASSIGN_OR_RETURN(BoundaryKind kind, kind_from_name(j["kind"].get<std::string>()));
  int64_t k = 1;
  if (j.contains("k")) {
    if (!j["k"].is_number_integer()) return invalid_argument("model config: boundary layer k is not an integer");
    k = j["k"].get<int64_t>();
  } else if (kind != BoundaryKind::none) {
    return invalid_argument("model config: boundary layer {} lacks \"k\"", kind_name(kind));
  }
  return make_boundary_layer(kind, k);
}

Result<std::vector<BoundaryLayer>> boundaries_from_json(const nlohmann::json& j) {
  std::vector<BoundaryLayer> layers;
  if (!j.contains("boundaries")) return layers;
  if (!j["boundaries"].is_array()) return invalid_argument("model config \"boundaries\" is not an array");
  for (const auto& entry : j["boundaries"]) {
    SWARM_ASSIGN_OR_RETURN(BoundaryLayer layer, boundary_from_json(entry));
    layers.push_back(layer);
  }
  return layers;
}

}  // namespace

Status BoundaryLayer::validate(int d_model) const {
  SWARM_RETURN_IF_ERROR(make_boundary_layer(kind, k).status());
  if (d_model % k != 0) {
    return invalid_argument("boundary layer {}: d_model {} is not divisible by k {}", to_string(), d_model, k);
  }
  return Status::ok();
}

// Sender: LayerNorm(d) and, for a bottleneck, Linear(d -> d/k). Receiver:
// Linear(d/k -> d) and LayerNorm(d).
int64_t BoundaryLayer::sender_parameter_count(int d_model) const {
  if (!compresses()) return 0;
  const int64_t C = d_model, W = wire_width(d_model);
  return 2 * C + (kind == BoundaryKind::bottleneck ? W * C + W : 0);
}

int64_t BoundaryLayer::receiver_parameter_count(int d_model) const {
  if (!compresses()) return 0;
  const int64_t C = d_model, W = wire_width(d_model);
  return C * W + C + 2 * C;
}

std::string BoundaryLayer::to_string() const {
  return compresses() ? fmt::format("{}:{}", kind_name(kind), k) : std::string(kind_name(kind));
}

Result<std::vector<BoundaryLayer>> parse_boundary_layers(std::string_view text) {
  std::vector<BoundaryLayer> layers;
  if (trimmed(text).empty()) {
    return invalid_argument("empty boundary layers: expected none, bottleneck:K or maxout:K (K 2 or 4)");
  }
  while (true) {
    const size_t comma = text.find(',');
    const std::string_view entry = trimmed(text.substr(0, comma));
    if (entry.empty()) return invalid_argument("boundary layers \"{}\" hold an empty entry", text);
    SWARM_ASSIGN_OR_RETURN(BoundaryLayer layer, parse_boundary_layer(entry));
    layers.push_back(layer);
    if (comma == std::string_view::npos) return layers;
    text.remove_prefix(comma + 1);
  }
}

std::string format_boundary_layers(const std::vector<BoundaryLayer>& layers) {
  if (layers.empty()) return "none";
  std::string text;
  for (const BoundaryLayer& layer : layers) {
    if (!text.empty()) text += ',';
    text += layer.to_string();
  }
  return text;
}

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
  for (const BoundaryLayer& layer : boundaries) SWARM_RETURN_IF_ERROR(layer.validate(d_model));
  return Status::ok();
}

Status GptConfig::check_boundaries_fit(int num_stages) const {
  const size_t cuts = num_stages > 1 ? static_cast<size_t>(num_stages - 1) : 0;
  if (boundaries.size() <= 1 || boundaries.size() == cuts) return Status::ok();
  return invalid_argument(
      "the model config lists {} boundary layers ({}), but {} stages have {} {} between them: give one for all "
      "boundaries or exactly one per boundary",
      boundaries.size(), format_boundary_layers(boundaries), num_stages, cuts, cuts == 1 ? "boundary" : "boundaries");
}

BoundaryLayer GptConfig::boundary_after(int stage_index) const {
  if (boundaries.empty()) return BoundaryLayer{};
  if (boundaries.size() == 1) return boundaries.front();
  return boundaries.at(static_cast<size_t>(stage_index));
}

int64_t GptConfig::parameter_count(int num_stages) const {
  const int64_t C = d_model;
  const int64_t per_block = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) +
                            (4 * C * C + C);
  int64_t total = vocab_size * C + max_seq_len * C + n_layers * per_block + 2 * C + vocab_size * C;
  for (int cut = 0; cut + 1 < num_stages; ++cut) {
    const BoundaryLayer layer = boundary_after(cut);
    total += layer.sender_parameter_count(d_model) + layer.receiver_parameter_count(d_model);
  }
  return total;
}

// "boundaries" is written only when set, so configs without boundary layers
// keep the exact JSON they had before the field existed.
std::string GptConfig::to_json() const {
  nlohmann::json j = {{"vocab_size", vocab_size}, {"max_seq_len", max_seq_len},
                      {"d_model", d_model},       {"n_heads", n_heads},
                      {"n_layers", n_layers},     {"layer_repeat", layer_repeat}};
  if (!boundaries.empty()) {
    j["boundaries"] = nlohmann::json::array();
    for (const BoundaryLayer& layer : boundaries) j["boundaries"].push_back(boundary_json(layer));
  }
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
  SWARM_ASSIGN_OR_RETURN(config.boundaries, boundaries_from_json(j));
  SWARM_RETURN_IF_ERROR(config.validate());
  return config;
}

Result<std::vector<StageLayout>> partition_at(const GptConfig& config,
                                              const std::vector<int>& boundaries) {
  SWARM_RETURN_IF_ERROR(config.validate());
  if (boundaries.size() < 2 || boundaries.front() != 0 || boundaries.back() != config.n_layers) {
    return invalid_argument("stage boundaries must run from 0 to n_layers ({})", config.n_layers);
  }
  SWARM_RETURN_IF_ERROR(config.check_boundaries_fit(static_cast<int>(boundaries.size()) - 1));
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

double block_forward_flops_per_token(int64_t d_model, int64_t seq, int64_t layers) {
  const double d = static_cast<double>(d_model);
  return static_cast<double>(layers) * (24.0 * d * d + 4.0 * static_cast<double>(seq) * d);
}

double stage_forward_flops_per_token(const GptConfig& config, const StageLayout& layout) {
  const double d = config.d_model;
  double flops = block_forward_flops_per_token(config.d_model, config.max_seq_len,
                                               int64_t{layout.num_layers()} * config.layer_repeat);
  if (layout.has_head()) flops += 2.0 * d * config.vocab_size;
  auto projection = [&](const BoundaryLayer& cut) {
    return cut.kind == BoundaryKind::bottleneck ? 2.0 * d * (d / cut.k) : 0.0;
  };
  if (layout.stage_index + 1 < layout.num_stages) flops += projection(config.boundary_after(layout.stage_index));
  if (layout.stage_index > 0) flops += projection(config.boundary_after(layout.stage_index - 1));
  return flops;
}

}  // namespace swarm::gpt
