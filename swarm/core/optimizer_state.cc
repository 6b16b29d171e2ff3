#include "swarm/core/optimizer_state.h"

#include <cmath>

namespace swarm {
namespace {

bool is_cpu_f32(const TensorView& t) { return t.dtype() == DType::f32 && t.device() == Device::cpu; }

Status take_moment(const std::string& name, const Tensor& tensor, ParsedOptimizerState& parsed) {
  const bool first = name.starts_with(kFirstMomentPrefix);
  const bool second = name.starts_with(kSecondMomentPrefix);
  if (!first && !second) return invalid_argument("unknown optimizer state entry '{}'", name);
  const std::string param = name.substr(first ? kFirstMomentPrefix.size() : kSecondMomentPrefix.size());
  if (param.empty()) return invalid_argument("optimizer state entry '{}' names no parameter", name);
  if (!is_cpu_f32(tensor)) {
    return invalid_argument("optimizer state '{}' must be f32 on cpu, got {}", name, tensor.view().describe());
  }
  // A moment from a corrupt checkpoint would poison every later step.
  if (!all_finite(tensor, /*require_nonnegative=*/second)) {
    return invalid_argument("optimizer state '{}' holds {} values", name,
                            second ? "non-finite or negative" : "non-finite");
  }
  const Tensor*& slot = first ? parsed.moments[param].m : parsed.moments[param].v;
  if (slot != nullptr) return invalid_argument("optimizer state has '{}' twice", name);
  slot = &tensor;
  return Status::ok();
}

Result<int64_t> take_step(const std::string& name, const Tensor& tensor, int64_t steps_so_far) {
  if (steps_so_far >= 0) return invalid_argument("optimizer state has '{}' twice", name);
  if (tensor.dtype() != DType::i64 || tensor.device() != Device::cpu || tensor.numel() != 1) {
    return invalid_argument("'{}' must be one i64 on cpu, got {}", name, tensor.view().describe());
  }
  const int64_t steps = tensor.data<int64_t>()[0];
  if (steps < 0) return invalid_argument("'{}' is negative ({})", name, steps);
  return steps;
}

Status check_complete(const ParsedOptimizerState& parsed) {
  for (const auto& [param, moments] : parsed.moments) {
    if (moments.m == nullptr || moments.v == nullptr) {
      return invalid_argument("optimizer state lacks '{}{}'",
                              moments.m != nullptr ? kSecondMomentPrefix : kFirstMomentPrefix, param);
    }
    if (!(moments.m->shape() == moments.v->shape())) {
      return invalid_argument("optimizer state for '{}': first moment {} but second moment {}", param,
                              moments.m->shape().to_string(), moments.v->shape().to_string());
    }
  }
  return Status::ok();
}

}  // namespace

Result<ParsedOptimizerState> parse_optimizer_state(const std::vector<std::pair<std::string, Tensor>>& entries) {
  ParsedOptimizerState parsed;
  int64_t steps = -1;
  for (const auto& [name, tensor] : entries) {
    if (!tensor.defined()) return invalid_argument("optimizer state '{}' is an undefined tensor", name);
    if (name == kStepStateName) {
      SWARM_ASSIGN_OR_RETURN(steps, take_step(name, tensor, steps));
    } else {
      SWARM_RETURN_IF_ERROR(take_moment(name, tensor, parsed));
    }
  }
  if (steps < 0) return invalid_argument("optimizer state lacks '{}'", kStepStateName);
  SWARM_RETURN_IF_ERROR(check_complete(parsed));
  parsed.steps = steps;
  return parsed;
}

Status validate_learning_rate(float lr) {
  if (!std::isfinite(lr) || lr < 0.0f) return invalid_argument("learning rate {} must be finite and >= 0", lr);
  return Status::ok();
}

bool all_finite(const TensorView& t, bool require_nonnegative) {
  for (float x : t.span<const float>()) {
    if (!std::isfinite(x) || (require_nonnegative && x < 0.0f)) return false;
  }
  return true;
}

}  // namespace swarm
