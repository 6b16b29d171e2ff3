// stage_state: a stage replica's state as one flat gradient, one hash and one Checkpoint,
// whatever device the stage computes on (parameters on a device reach the host
// through host_view()).
//
// The averaging round needs the accumulated gradients as one vector (in
// parameter_views() order, the same on every replica), the replica invariant needs
// a hash of the whole state (state_hash), and state download and resume need parameters plus
// optimizer state as a Checkpoint. These helpers are the one place that knows the
// naming: "param/<name>" for parameters, "optim/<entry>" for optimizer state.
//
//   SWARM_ASSIGN_OR_RETURN(std::vector<float> mean, swarm::flatten_gradients(stage, /*divide_by=*/microbatches));
//   SWARM_ASSIGN_OR_RETURN(uint64_t hash, swarm::stage_state_hash(stage, *updater.export_state(), step));
//   SWARM_ASSIGN_OR_RETURN(swarm::Checkpoint state, swarm::stage_checkpoint(stage, *updater.export_state(), step));
#pragma once

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "swarm/api/stage.h"
#include "swarm/api/updater.h"
#include "swarm/checkpoint/checkpoint.h"
#include "swarm/core/status.h"

namespace swarm {

inline constexpr std::string_view kParamPrefix = "param/";
inline constexpr std::string_view kOptimizerPrefix = "optim/";

template <Stage S>
int64_t parameter_count(S& stage) {
  int64_t total = 0;
  for (const auto& view : stage.parameter_views()) total += view.value.numel();
  return total;
}

// The accumulated gradients, concatenated, each divided by `divide_by` (>= 1),
// on the host whatever device the stage computes on.
template <Stage S>
Result<std::vector<float>> flatten_gradients(S& stage, double divide_by) {
  std::vector<float> out;
  out.reserve(static_cast<size_t>(parameter_count(stage)));
  const float scale = static_cast<float>(1.0 / std::max(1.0, divide_by));
  Tensor staging;
  for (const auto& view : stage.parameter_views()) {
    SWARM_ASSIGN_OR_RETURN(TensorView grad, host_view(view.grad, staging));
    for (float g : grad.span<const float>()) out.push_back(g * scale);
  }
  return out;
}

// The hash a replica publishes and its stage-mates vouch for: of its whole state
// (parameters, optimizer state and global step), so that a donor cannot hand a
// joiner the vouched parameters with moments or a step counter of its own choosing.
// Tensors under their checkpoint names ("param/...", "optim/..."), in name order,
// then the step; a downloaded Checkpoint and the replica that loads it agree.
inline uint64_t state_hash(std::vector<NamedTensorView> tensors, int64_t step) {
  std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  int64_t step_value = step;
  tensors.push_back({"global_step", TensorView(&step_value, DType::i64, Shape{1})});
  return content_hash(tensors);
}

inline uint64_t state_hash(const Checkpoint& state) {
  std::vector<NamedTensorView> views;
  for (const NamedTensor& named : state.tensors) views.push_back({named.name, named.tensor.view()});
  return state_hash(std::move(views), state.step);
}

// state_hash of a stage and its optimizer state, without copying what is on the host.
template <Stage S>
Result<uint64_t> stage_state_hash(S& stage, const OptimizerState& optimizer_state, int64_t step) {
  auto params = stage.parameter_views();
  std::vector<Tensor> staging(params.size());
  std::vector<NamedTensorView> views;
  for (size_t i = 0; i < params.size(); ++i) {
    SWARM_ASSIGN_OR_RETURN(TensorView value, host_view(params[i].value, staging[i]));
    views.push_back({std::string(kParamPrefix) + params[i].name, value});
  }
  for (const auto& [name, tensor] : optimizer_state) {
    if (tensor.device() != Device::cpu) return internal("optimizer state {} is not on the host", name);
    views.push_back({std::string(kOptimizerPrefix) + name, tensor.view()});
  }
  return state_hash(std::move(views), step);
}

// True when every accumulated gradient is finite.
template <Stage S>
Result<bool> gradients_finite(S& stage) {
  Tensor staging;
  for (const auto& view : stage.parameter_views()) {
    SWARM_ASSIGN_OR_RETURN(TensorView grad, host_view(view.grad, staging));
    for (float g : grad.span<const float>()) {
      if (!std::isfinite(g)) return false;
    }
  }
  return true;
}

// A copy of the gradient accumulators on their own device, to put back when a
// backward must not count. Reuses the buffers of the last snapshot in `into`.
template <Stage S>
Status snapshot_gradients(S& stage, std::vector<Tensor>& into) {
  auto views = stage.parameter_views();
  into.resize(views.size());
  for (size_t i = 0; i < views.size(); ++i) {
    const TensorView& grad = views[i].grad;
    Tensor& copy = into[i];
    if (!copy.defined() || copy.device() != grad.device() || copy.dtype() != grad.dtype() ||
        !(copy.shape() == grad.shape())) {
      SWARM_ASSIGN_OR_RETURN(copy, Tensor::empty(grad.shape(), grad.dtype(), grad.device()));
    }
    SWARM_RETURN_IF_ERROR(copy.copy_from(grad));
  }
  return Status::ok();
}

template <Stage S>
Status restore_gradients(S& stage, const std::vector<Tensor>& snapshot) {
  auto views = stage.parameter_views();
  if (views.size() != snapshot.size()) return internal("a gradient snapshot of another stage");
  for (size_t i = 0; i < views.size(); ++i) SWARM_RETURN_IF_ERROR(copy_view(views[i].grad, snapshot[i]));
  return Status::ok();
}

template <Stage S>
Result<Checkpoint> stage_checkpoint(S& stage, const OptimizerState& optimizer_state, int64_t step) {
  Checkpoint checkpoint;
  checkpoint.step = step;
  for (const auto& view : stage.parameter_views()) {
    SWARM_ASSIGN_OR_RETURN(Tensor copy, Tensor::copy_of(view.value, Device::cpu));
    checkpoint.tensors.push_back({std::string(kParamPrefix) + view.name, std::move(copy)});
  }
  for (const auto& [name, tensor] : optimizer_state) {
    checkpoint.tensors.push_back({std::string(kOptimizerPrefix) + name, tensor});
  }
  return checkpoint;
}

// Copies parameters and optimizer state in, onto the stage's device; checks every
// parameter is present with its shape before changing anything, so a wrong
// checkpoint leaves the stage as it was.
template <Stage S, ParameterUpdater U>
Status load_stage_checkpoint(S& stage, U& updater, const Checkpoint& checkpoint) {
  std::map<std::string, const Tensor*> params;
  OptimizerState optimizer_state;
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
  SWARM_RETURN_IF_ERROR(updater.import_state(optimizer_state));
  for (const auto& view : views) SWARM_RETURN_IF_ERROR(copy_view(view.value, *params[view.name]));
  return Status::ok();
}

}  // namespace swarm
