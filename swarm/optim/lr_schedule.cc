#include "swarm/optim/lr_schedule.h"

#include <cmath>
#include <numbers>

namespace swarm::optim {

float LrSchedule::lr_at(int64_t step) const {
  if (step < 1) step = 1;
  const double peak = peak_lr;
  if (step <= warmup_steps) {
    return static_cast<float>(peak * static_cast<double>(step) / static_cast<double>(warmup_steps));
  }
  if (total_steps <= warmup_steps) return peak_lr;  // no decay phase
  const double final_lr = peak * final_lr_fraction;
  if (step >= total_steps) return static_cast<float>(final_lr);
  const double progress = static_cast<double>(step - warmup_steps) /
                          static_cast<double>(total_steps - warmup_steps);
  const double remaining = decay == Decay::linear
                               ? 1.0 - progress
                               : 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return static_cast<float>(final_lr + (peak - final_lr) * remaining);
}

Status LrSchedule::validate() const {
  if (!(std::isfinite(peak_lr) && peak_lr >= 0.0f)) {
    return invalid_argument("peak_lr {} must be finite and >= 0", peak_lr);
  }
  if (warmup_steps < 0) return invalid_argument("warmup_steps {} is negative", warmup_steps);
  if (total_steps < 0) return invalid_argument("total_steps {} is negative", total_steps);
  if (total_steps != 0 && total_steps <= warmup_steps) {
    return invalid_argument("total_steps {} must exceed warmup_steps {} (or be 0 for no decay)",
                            total_steps, warmup_steps);
  }
  if (!(final_lr_fraction >= 0.0f && final_lr_fraction <= 1.0f)) {
    return invalid_argument("final_lr_fraction {} must be in [0, 1]", final_lr_fraction);
  }
  if (decay != Decay::linear && decay != Decay::cosine) {
    return invalid_argument("unknown decay kind {}", static_cast<int>(decay));
  }
  return Status::ok();
}

}  // namespace swarm::optim
