// optimizer_state: the checkpoint format of an Adam-family optimizer's state, and
// its checks, shared by every device's optimizer (swarm/optim on the CPU,
// kernels/cuda's DeviceUpdater), so a state saved on one loads on another and a
// forged one is refused the same way everywhere.
//
// Entries, host tensors: "adam.m/<param>" and "adam.v/<param>" (f32, the param's
// shape), and "optimizer.step" (one i64 >= 0).
//
//   SWARM_ASSIGN_OR_RETURN(ParsedOptimizerState parsed, parse_optimizer_state(entries));
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "swarm/core/status.h"
#include "swarm/core/tensor.h"

namespace swarm {

inline constexpr std::string_view kStepStateName = "optimizer.step";
inline constexpr std::string_view kFirstMomentPrefix = "adam.m/";
inline constexpr std::string_view kSecondMomentPrefix = "adam.v/";

// An imported state, checked, still pointing into the entries it came from.
struct ParsedOptimizerState {
  struct Moments {
    const Tensor* m = nullptr;
    const Tensor* v = nullptr;
  };
  std::map<std::string, Moments> moments;  // by param name
  int64_t steps = 0;
};

// Every entry known, on the host, finite (v also >= 0, since the update takes its
// square root), none twice, every param with both moments of one shape, and the
// step count present. invalid_argument names the entry.
Result<ParsedOptimizerState> parse_optimizer_state(const std::vector<std::pair<std::string, Tensor>>& entries);

// Finite and >= 0, as every step requires of its learning rate.
Status validate_learning_rate(float lr);

// Every value finite (and >= 0 when asked); t is f32 on the host.
bool all_finite(const TensorView& t, bool require_nonnegative);

}  // namespace swarm
