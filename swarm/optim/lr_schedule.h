// lr_schedule: linear warm-up to a peak learning rate, then linear or cosine decay to a floor.
//
// Pure arithmetic on the step number, so every peer that agrees on the step agrees on the lr.
// Steps count from 1: pass the number of the update about to be applied.
//
//   swarm::optim::LrSchedule schedule{.peak_lr = 1e-3f, .warmup_steps = 100, .total_steps = 10000};
//   SWARM_RETURN_IF_ERROR(schedule.validate());
//   float lr = schedule.lr_at(optimizer.steps_taken() + 1);
#pragma once

#include <cstdint>

#include "swarm/core/status.h"

namespace swarm::optim {

struct LrSchedule {
  float peak_lr = 1e-3f;
  int64_t warmup_steps = 0;
  // The step at which the lr reaches peak_lr * final_lr_fraction; it stays there afterwards.
  // 0 means no decay: peak_lr from the end of warm-up on.
  int64_t total_steps = 0;
  float final_lr_fraction = 0.1f;
  enum class Decay { linear, cosine } decay = Decay::cosine;

  // Steps 1..warmup_steps rise linearly from peak/warmup_steps to peak; steps warmup_steps..
  // total_steps fall from peak to peak*final_lr_fraction. A step below 1 is treated as 1.
  // Meaningful only for a schedule that validate() accepts.
  float lr_at(int64_t step) const;

  // Errors (invalid_argument): a negative or non-finite peak, negative step counts, a fraction
  // outside [0, 1], or a total_steps (when set) that does not leave room after warm-up.
  Status validate() const;
};

}  // namespace swarm::optim
