// state_inspection: is a downloaded state this stage's, before anything loads it?
//
// A state from a donor is checked as Replica::load would check it and more: every
// tensor a parameter of this stage (name, dtype, shape), an optimizer moment of one
// (f32, the second >= 0) or the optimizer's step counter, each once, all of them
// present, every value finite. What passes loads; the parameters hash it returns is
// the one the replica will have, to compare against the hash the stage vouched for.
//
//   SWARM_ASSIGN_OR_RETURN(uint64_t hash, StateInspection<S>::inspect(replica, state));
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "swarm/averaging/state_transfer.h"
#include "swarm/checkpoint/checkpoint.h"
#include "swarm/optim/optimizer.h"
#include "swarm/peer/replica.h"
#include "swarm/peer/stage_state.h"

namespace swarm {

template <Stage S>
class StateInspection {
 public:
  struct ParamLayout {
    std::string name;
    DType dtype;
    Shape shape;
  };
  // What a downloaded state holds, as far as Replica::load cares.
  struct StateTally {
    std::map<std::string, const Tensor*> params;
    std::map<std::string, int> moments;  // per parameter: 1 the first moment, 2 the second
    int step_counters = 0;
  };

  // Checks a downloaded state against this stage before anything loads it, as
  // Replica::load would and more (finite values), so a state that passes loads; and
  // returns the hash the replica will have once it does (state_hash: parameters,
  // optimizer state and step), which the stage's majority must have vouched for.
  static Result<uint64_t> inspect(Replica<S>& replica, const Checkpoint& state) {
    const auto layout = replica.exclusive([](S& stage) {
      std::vector<ParamLayout> out;
      for (const auto& view : stage.parameter_views()) out.push_back({view.name, view.value.dtype(), view.value.shape()});
      return out;
    });
    std::map<std::string, const ParamLayout*> by_name;
    for (const auto& p : layout) by_name[p.name] = &p;
    StateTally tally;
    for (const NamedTensor& named : state.tensors) SWARM_RETURN_IF_ERROR(check_state_entry(named, by_name, &tally));
    if (tally.params.size() != layout.size()) {
      return invalid_argument("the state has {} of this stage's {} parameters", tally.params.size(), layout.size());
    }
    if (tally.step_counters != 1) return invalid_argument("the state has {} optimizer step counters", tally.step_counters);
    for (const auto& [param, which] : tally.moments) {
      if (which != 3) return invalid_argument("the state has one optimizer moment of {} without the other", param);
    }
    SWARM_RETURN_IF_ERROR(check_finite(state));
    return state_hash(state);
  }

  // One tensor of a downloaded state: a parameter of this stage with its dtype and
  // shape, an optimizer moment (f32, the second one >= 0) of one of them with its
  // shape, or the optimizer's step counter (>= 0). Anything else, or any of them
  // twice, is no part of this stage's state.
  static Status check_state_entry(const NamedTensor& named, const std::map<std::string, const ParamLayout*>& layout,
                                  StateTally* tally) {
    const std::string_view name = named.name;
    const Tensor& t = named.tensor;
    // Of the parameter's shape, and of `dtype` (unset: the parameter's).
    auto fits = [&](const std::string& param, std::optional<DType> dtype) {
      auto it = layout.find(param);
      return it != layout.end() && t.dtype() == dtype.value_or(it->second->dtype) && t.shape() == it->second->shape;
    };
    if (name.starts_with(kParamPrefix)) {
      const std::string param(name.substr(kParamPrefix.size()));
      if (!fits(param, std::nullopt)) return invalid_argument("state parameter {} does not fit this stage", param);
      if (!tally->params.emplace(param, &t).second) return invalid_argument("state parameter {} appears twice", param);
      return Status::ok();
    }
    const std::string_view entry = name.starts_with(kOptimizerPrefix) ? name.substr(kOptimizerPrefix.size()) : "";
    if (entry == optim::kStepStateName && t.dtype() == DType::i64 && t.numel() == 1 && t.data<int64_t>()[0] >= 0) {
      ++tally->step_counters;
      return Status::ok();
    }
    for (int which : {1, 2}) {
      const std::string_view prefix = which == 1 ? optim::kFirstMomentPrefix : optim::kSecondMomentPrefix;
      if (!entry.starts_with(prefix)) continue;
      const std::string param(entry.substr(prefix.size()));
      if (!fits(param, DType::f32)) break;
      const auto values = t.span<const float>();
      if (which == 2 && std::any_of(values.begin(), values.end(), [](float x) { return x < 0.0f; })) {
        return invalid_argument("state tensor {} holds a negative second moment", name);
      }
      int& seen = tally->moments[param];
      if ((seen & which) != 0) return invalid_argument("state tensor {} appears twice", name);
      seen |= which;
      return Status::ok();
    }
    return invalid_argument("state tensor {} is no part of this stage's state", name);
  }
};

}  // namespace swarm
