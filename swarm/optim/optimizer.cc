#include "swarm/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "swarm/core/optim_math.h"

namespace swarm::optim {
namespace {

// Norms are summed per chunk of this many elements, then chunk by chunk in order. The chunking is
// fixed, not derived from the thread count, so every machine gets the same bits.
constexpr int64_t kNormChunk = 1 << 14;
// Below this many elements, starting threads costs more than it saves.
constexpr int64_t kParallelMin = 1 << 16;

int64_t chunk_count(int64_t n) { return (n + kNormChunk - 1) / kNormChunk; }

double sum_of_squares(const float* x, int64_t n) {
  const int64_t chunks = chunk_count(n);
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t end = std::min(n, (c + 1) * kNormChunk);
    double sum = 0.0;
    for (int64_t i = c * kNormChunk; i < end; ++i) sum += static_cast<double>(x[i]) * x[i];
    partial[static_cast<size_t>(c)] = sum;
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

bool is_cpu_f32(const TensorView& t) { return t.dtype() == DType::f32 && t.device() == Device::cpu; }

// The checks and the clip factor common to both optimizers. Nothing is modified.
Result<float> prepare_step(const OptimizerConfig& config, const detail::AdamState& state,
                           std::span<const ParamRef> params, float lr) {
  SWARM_RETURN_IF_ERROR(config.validate().with_context("optimizer config"));
  SWARM_RETURN_IF_ERROR(validate_learning_rate(lr));
  SWARM_RETURN_IF_ERROR(state.validate(params));
  double total = 0.0;
  for (const ParamRef& p : params) {
    const double sum = sum_of_squares(p.grad.data<float>(), p.grad.numel());
    if (!std::isfinite(sum)) {
      return invalid_argument("gradient of '{}' is not finite (sum of squares {}); step skipped",
                              p.name, sum);
    }
    total += sum;
  }
  // A norm past float's range cannot be clipped meaningfully either.
  const float norm = static_cast<float>(std::sqrt(total));
  if (!std::isfinite(norm)) {
    return invalid_argument("global gradient norm {} is not finite; step skipped", std::sqrt(total));
  }
  return clip_coefficient(norm, config.clip_norm);
}

}  // namespace

Status OptimizerConfig::validate() const {
  if (!(beta1 >= 0.0f && beta1 < 1.0f)) return invalid_argument("beta1 {} must be in [0, 1)", beta1);
  if (!(beta2 >= 0.0f && beta2 < 1.0f)) return invalid_argument("beta2 {} must be in [0, 1)", beta2);
  if (!(std::isfinite(eps) && eps > 0.0f)) return invalid_argument("eps {} must be finite and > 0", eps);
  if (!(std::isfinite(weight_decay) && weight_decay >= 0.0f)) {
    return invalid_argument("weight_decay {} must be finite and >= 0", weight_decay);
  }
  if (!std::isfinite(clip_norm)) return invalid_argument("clip_norm {} must be finite", clip_norm);
  if (!std::isfinite(max_trust_ratio)) {
    return invalid_argument("max_trust_ratio {} must be finite", max_trust_ratio);
  }
  return Status::ok();
}

float global_grad_norm(std::span<const ParamRef> params) {
  double total = 0.0;
  for (const ParamRef& p : params) {
    if (!is_cpu_f32(p.grad)) return std::nanf("");
    total += sum_of_squares(p.grad.data<float>(), p.grad.numel());
  }
  return static_cast<float>(std::sqrt(total));
}

namespace detail {

Status AdamState::validate(std::span<const ParamRef> params) const {
  std::set<std::string_view> seen;
  for (const ParamRef& p : params) {
    if (p.name.empty()) return invalid_argument("a parameter has an empty name");
    if (!seen.insert(p.name).second) return invalid_argument("parameter '{}' is listed twice", p.name);
    if (!is_cpu_f32(p.value) || !is_cpu_f32(p.grad)) {
      return invalid_argument("parameter '{}': value {} and grad {} must both be f32 on cpu", p.name,
                              p.value.describe(), p.grad.describe());
    }
    if (!(p.value.shape() == p.grad.shape())) {
      return invalid_argument("parameter '{}': value shape {} but grad shape {}", p.name,
                              p.value.shape().to_string(), p.grad.shape().to_string());
    }
    if (p.value.numel() > 0 && (p.value.raw_data() == nullptr || p.grad.raw_data() == nullptr)) {
      return invalid_argument("parameter '{}' has no data", p.name);
    }
    auto it = moments_.find(p.name);
    if (it != moments_.end() && !(it->second.m.shape() == p.value.shape())) {
      return invalid_argument("parameter '{}' has shape {} but its optimizer state has {}", p.name,
                              p.value.shape().to_string(), it->second.m.shape().to_string());
    }
  }
  return Status::ok();
}

Result<std::vector<AdamState::Moments*>> AdamState::moments_for(std::span<const ParamRef> params) {
  // Allocate every new pair first, so a failed allocation leaves the state as it was.
  std::vector<std::pair<const ParamRef*, Moments>> created;
  for (const ParamRef& p : params) {
    if (moments_.count(p.name) != 0) continue;
    SWARM_ASSIGN_OR_RETURN(Tensor m, Tensor::zeros(p.value.shape(), DType::f32));
    SWARM_ASSIGN_OR_RETURN(Tensor v, Tensor::zeros(p.value.shape(), DType::f32));
    created.push_back({&p, Moments{std::move(m), std::move(v)}});
  }
  for (auto& [p, moments] : created) moments_.emplace(p->name, std::move(moments));
  std::vector<Moments*> result;
  result.reserve(params.size());
  for (const ParamRef& p : params) result.push_back(&moments_.find(p.name)->second);
  return result;
}

std::vector<std::pair<std::string, Tensor>> AdamState::export_state() const {
  std::vector<std::pair<std::string, Tensor>> entries;
  entries.reserve(2 * moments_.size() + 1);
  for (const auto& [name, moments] : moments_) {
    entries.emplace_back(std::string(kFirstMomentPrefix) + name, moments.m.clone());
    entries.emplace_back(std::string(kSecondMomentPrefix) + name, moments.v.clone());
  }
  Tensor step = Tensor::zeros(Shape{1}, DType::i64).value();
  step.data<int64_t>()[0] = steps_;
  entries.emplace_back(std::string(kStepStateName), std::move(step));
  return entries;
}

Status AdamState::import_state(const std::vector<std::pair<std::string, Tensor>>& entries) {
  SWARM_ASSIGN_OR_RETURN(ParsedOptimizerState parsed, parse_optimizer_state(entries));
  std::map<std::string, Moments, std::less<>> imported;
  // Copies: the caller's tensors may be reused for the next checkpoint.
  for (const auto& [param, moments] : parsed.moments) imported[param] = {moments.m->clone(), moments.v->clone()};
  moments_ = std::move(imported);
  steps_ = parsed.steps;
  return Status::ok();
}

}  // namespace detail

Status AdamW::step(std::span<const ParamRef> params, float lr) {
  SWARM_ASSIGN_OR_RETURN(const float clip, prepare_step(config_, state_, params, lr));
  SWARM_ASSIGN_OR_RETURN(std::vector<detail::AdamState::Moments*> moments, state_.moments_for(params));
  const AdamCoefficients c =
      adam_coefficients(config_.beta1, config_.beta2, config_.eps, state_.steps_taken() + 1);
  const float wd = config_.weight_decay;
  for (size_t k = 0; k < params.size(); ++k) {
    const ParamRef& p = params[k];
    float* w = p.value.data<float>();
    const float* g = p.grad.data<float>();
    float* m = moments[k]->m.data<float>();
    float* v = moments[k]->v.data<float>();
    const bool decay = p.apply_weight_decay;
    const int64_t n = p.value.numel();
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
      const float direction = adam_update_element(g[i] * clip, m[i], v[i], c);
      w[i] -= lr * (direction + decoupled_weight_decay(w[i], wd, decay));
    }
  }
  state_.advance();
  return Status::ok();
}

Status Lamb::step(std::span<const ParamRef> params, float lr) {
  SWARM_ASSIGN_OR_RETURN(const float clip, prepare_step(config_, state_, params, lr));
  SWARM_ASSIGN_OR_RETURN(std::vector<detail::AdamState::Moments*> moments, state_.moments_for(params));
  const AdamCoefficients c =
      adam_coefficients(config_.beta1, config_.beta2, config_.eps, state_.steps_taken() + 1);
  const float wd = config_.weight_decay;
  for (size_t k = 0; k < params.size(); ++k) {
    const ParamRef& p = params[k];
    float* w = p.value.data<float>();
    const float* g = p.grad.data<float>();
    float* m = moments[k]->m.data<float>();
    float* v = moments[k]->v.data<float>();
    const bool decay = p.apply_weight_decay;
    const int64_t n = p.value.numel();
    update_.resize(static_cast<size_t>(n));
    float* u = update_.data();

    // Pass 1: moments, the update, and both norms per fixed chunk (see kNormChunk).
    const int64_t chunks = chunk_count(n);
    std::vector<double> weight_sq(static_cast<size_t>(chunks)), update_sq(static_cast<size_t>(chunks));
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      const int64_t end = std::min(n, (chunk + 1) * kNormChunk);
      double ws = 0.0;
      double us = 0.0;
      for (int64_t i = chunk * kNormChunk; i < end; ++i) {
        const float direction = adam_update_element(g[i] * clip, m[i], v[i], c);
        u[i] = direction + decoupled_weight_decay(w[i], wd, decay);
        ws += static_cast<double>(w[i]) * w[i];
        us += static_cast<double>(u[i]) * u[i];
      }
      weight_sq[static_cast<size_t>(chunk)] = ws;
      update_sq[static_cast<size_t>(chunk)] = us;
    }
    double weight_total = 0.0;
    double update_total = 0.0;
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      weight_total += weight_sq[static_cast<size_t>(chunk)];
      update_total += update_sq[static_cast<size_t>(chunk)];
    }
    const float ratio = trust_ratio(static_cast<float>(std::sqrt(weight_total)),
                                    static_cast<float>(std::sqrt(update_total)), config_.max_trust_ratio);

    // Pass 2: the scaled step.
    const float scale = lr * ratio;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) w[i] -= scale * u[i];
  }
  state_.advance();
  return Status::ok();
}

}  // namespace swarm::optim
