// stage_state: a stage replica's state as one flat gradient, one hash and one Checkpoint.
//
// The averaging round needs the accumulated gradients as one vector (in
// parameter_views() order, the same on every replica), the replica invariant needs
// a hash of the parameters, and state download and resume need parameters plus
// optimizer state as a Checkpoint. These helpers are the one place that knows the
// naming: "param/<name>" for parameters, "optim/<entry>" for optimizer state.
//
//   std::vector<float> mean = swarm::flatten_gradients(stage, /*divide_by=*/microbatches);
//   uint64_t hash = swarm::parameters_hash(stage);
//   SWARM_ASSIGN_OR_RETURN(swarm::Checkpoint state, swarm::stage_checkpoint(stage, optimizer, step));
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "swarm/checkpoint/checkpoint.h"
#include "swarm/core/status.h"
#include "swarm/api/stage.h"

namespace swarm {

inline constexpr std::string_view kParamPrefix = "param/";
inline constexpr std::string_view kOptimizerPrefix = "optim/";

template <Stage S>
int64_t parameter_count(S& stage) {
  int64_t total = 0;
  for (const auto& view : stage.parameter_views()) total += view.value.numel();
  return total;
}

// The accumulated gradients, concatenated, each divided by `divide_by` (>= 1).
template <Stage S>
std::vector<float> flatten_gradients(S& stage, double divide_by) {
  std::vector<float> out;
  out.reserve(static_cast<size_t>(parameter_count(stage)));
  const float scale = static_cast<float>(1.0 / std::max(1.0, divide_by));
  for (const auto& view : stage.parameter_views()) {
    const float* g = static_cast<const float*>(view.grad.raw_data());
    for (int64_t i = 0; i < view.grad.numel(); ++i) out.push_back(g[i] * scale);
  }
  return out;
}

// Puts a snapshot taken by flatten_gradients(stage, divide_by) back into the
// accumulators (adding, since new gradients may have arrived since).
template <Stage S>
void restore_gradients(S& stage, const std::vector<float>& mean, double divide_by) {
  const float scale = static_cast<float>(std::max(1.0, divide_by));
  size_t offset = 0;
  for (const auto& view : stage.parameter_views()) {
    float* g = static_cast<float*>(view.grad.raw_data());
    for (int64_t i = 0; i < view.grad.numel(); ++i) g[i] += mean[offset + static_cast<size_t>(i)] * scale;
    offset += static_cast<size_t>(view.grad.numel());
  }
}

template <Stage S>
uint64_t parameters_hash(S& stage) {
  std::vector<NamedTensorView> views;
  for (const auto& view : stage.parameter_views()) views.push_back({view.name, view.value});
  return content_hash(views);
}

template <Stage S, typename Optimizer>
Result<Checkpoint> stage_checkpoint(S& stage, const Optimizer& optimizer, int64_t step) {
  Checkpoint checkpoint;
  checkpoint.step = step;
  for (const auto& view : stage.parameter_views()) {
    SWARM_ASSIGN_OR_RETURN(Tensor copy, Tensor::copy_of(view.value));
    checkpoint.tensors.push_back({std::string(kParamPrefix) + view.name, std::move(copy)});
  }
  for (auto& [name, tensor] : optimizer.export_state()) {
    checkpoint.tensors.push_back({std::string(kOptimizerPrefix) + name, std::move(tensor)});
  }
  return checkpoint;
}

// Copies parameters and optimizer state in; checks every parameter is present with
// its shape before changing anything, so a wrong checkpoint leaves the stage as it was.
template <Stage S, typename Optimizer>
Status load_stage_checkpoint(S& stage, Optimizer& optimizer, const Checkpoint& checkpoint) {
  std::map<std::string, const Tensor*> params;
  std::vector<std::pair<std::string, Tensor>> optimizer_state;
  for (const auto& named : checkpoint.tensors) {
    if (named.name.starts_with(kParamPrefix)) {
      params[named.name.substr(kParamPrefix.size())] = &named.tensor;
    } else if (named.name.starts_with(kOptimizerPrefix)) {
      optimizer_state.emplace_back(named.name.substr(kOptimizerPrefix.size()), named.tensor);
    }
  }
  auto views = stage.parameter_views();
  if (params.size() != views.size()) {
    return invalid_argument("the checkpoint has {} parameters, the stage {}", params.size(), views.size());
  }
  for (const auto& view : views) {
    auto it = params.find(view.name);
    if (it == params.end()) return invalid_argument("the checkpoint lacks parameter {}", view.name);
    if (it->second->shape() != view.value.shape() || it->second->dtype() != view.value.dtype()) {
      return invalid_argument("parameter {}: the checkpoint's shape or dtype differs from the stage's", view.name);
    }
  }
  SWARM_RETURN_IF_ERROR(optimizer.import_state(optimizer_state));
  for (const auto& view : views) {
    std::memcpy(view.value.raw_data(), params[view.name]->raw_data(), view.value.size_bytes());
  }
  return Status::ok();
}

}  // namespace swarm
