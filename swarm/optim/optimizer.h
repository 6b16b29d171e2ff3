// optimizer: AdamW and LAMB over named CPU f32 parameters, with global-norm clipping and state
// that a checkpoint or a joining peer can carry.
//
// Every peer of a stage applies the same step to the same averaged gradients and must end up
// bit-identical, so the updates are deterministic: the same on 1 thread or 16, and a failed step
// (bad shapes, a non-finite gradient) changes nothing.
//
//   swarm::optim::Lamb lamb(swarm::optim::OptimizerConfig{});
//   std::vector<swarm::optim::ParamRef> params{{"h.0.attn.qkv.weight", w, dw, true}};
//   SWARM_RETURN_IF_ERROR(lamb.step(params, schedule.lr_at(lamb.steps_taken() + 1)));
//   auto state = lamb.export_state();   // "adam.m/<name>", "adam.v/<name>", "optimizer.step"
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "swarm/core/optimizer_state.h"
#include "swarm/core/status.h"
#include "swarm/core/tensor.h"

namespace swarm::optim {

struct ParamRef {
  std::string name;               // e.g. "h.3.attn.qkv.weight"; the key of its optimizer state
  TensorView value;               // f32 on the CPU, updated in place
  TensorView grad;                // f32, same shape; read only (clipping is applied on the fly)
  bool apply_weight_decay = true; // false for biases and norm gains
};

// The update rule of an optimizer: AdamW (solo steps, swarm train's default) or
// LAMB (the swarm's global steps).
enum class Rule { adamw, lamb };

// Defaults are the SWARM paper's.
struct OptimizerConfig {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-6f;
  float weight_decay = 0.01f;
  float clip_norm = 1.0f;         // global L2 norm of all gradients; <= 0 disables clipping
  float max_trust_ratio = 10.0f;  // LAMB only; <= 0 disables the clamp

  // Betas in [0, 1), eps > 0, weight decay >= 0, everything finite.
  Status validate() const;
};

// L2 norm over the gradients of all params, summed in double in a fixed order, so it does not
// depend on the thread count. A grad that is not f32 on the CPU makes it NaN.
float global_grad_norm(std::span<const ParamRef> params);

// Names of the exported state entries (swarm/core/optimizer_state.h: every
// device's optimizer reads and writes them).
using swarm::kFirstMomentPrefix;
using swarm::kSecondMomentPrefix;
using swarm::kStepStateName;

namespace detail {

// The Adam moments and step count that AdamW and LAMB share, and their checkpoint format.
class AdamState {
 public:
  struct Moments {
    Tensor m;
    Tensor v;
  };

  int64_t steps_taken() const { return steps_; }
  void advance() { ++steps_; }

  // Everything step() rejects before touching any weight.
  Status validate(std::span<const ParamRef> params) const;
  // The moments of each param, in order, creating zeroed ones for new names. All or nothing.
  Result<std::vector<Moments*>> moments_for(std::span<const ParamRef> params);

  std::vector<std::pair<std::string, Tensor>> export_state() const;
  Status import_state(const std::vector<std::pair<std::string, Tensor>>& entries);

 private:
  std::map<std::string, Moments, std::less<>> moments_;  // ordered, so exports are reproducible
  int64_t steps_ = 0;
};

}  // namespace detail

// Adam with decoupled weight decay: w -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * w).
class AdamW {
 public:
  explicit AdamW(OptimizerConfig config) : config_(config) {}

  // Clips by the global gradient norm, then updates every param. Params are matched to their
  // state by name; a new name starts from zero moments but shares the optimizer's step count.
  // Errors (invalid_argument): a bad config or lr, value/grad shape or dtype mismatch, a shape
  // different from the one the state was created with, duplicate names, a non-finite gradient
  // norm. On error no weight or state changes.
  Status step(std::span<const ParamRef> params, float lr);

  int64_t steps_taken() const { return state_.steps_taken(); }
  const OptimizerConfig& config() const { return config_; }

  // Deep copies, so a checkpoint writer may hold them while training goes on.
  std::vector<std::pair<std::string, Tensor>> export_state() const { return state_.export_state(); }
  // Replaces the whole state, or on error (invalid_argument) keeps the current one.
  Status import_state(const std::vector<std::pair<std::string, Tensor>>& entries) {
    return state_.import_state(entries);
  }

 private:
  OptimizerConfig config_;
  detail::AdamState state_;
};

// LAMB: the AdamW update u = m_hat / (sqrt(v_hat) + eps) + wd * w, rescaled per tensor by the
// trust ratio ||w|| / ||u|| (1 when either is zero, clamped at max_trust_ratio): w -= lr * r * u.
// Each tensor thus moves by about lr times its own norm, whatever its gradient scale.
class Lamb {
 public:
  explicit Lamb(OptimizerConfig config) : config_(config) {}

  // As AdamW::step.
  Status step(std::span<const ParamRef> params, float lr);

  int64_t steps_taken() const { return state_.steps_taken(); }
  const OptimizerConfig& config() const { return config_; }

  std::vector<std::pair<std::string, Tensor>> export_state() const { return state_.export_state(); }
  Status import_state(const std::vector<std::pair<std::string, Tensor>>& entries) {
    return state_.import_state(entries);
  }

 private:
  OptimizerConfig config_;
  detail::AdamState state_;
  std::vector<float> update_;  // scratch: u of one tensor, needed whole before its norm is known
};

}  // namespace swarm::optim
