#pragma once

#include <optional>

#include "swarm/trainer/training_loop.h"

namespace swarm {

// The train loss a run reports, from its first step to its last. A step that a
// stop cut short holds one to per_step - 1 microbatches, so its loss is a
// noisier sample than any full step's; the run's end is told by its last full
// step, and by a cut one only if no step was full.
class TrainLossSpan {
 public:
  explicit TrainLossSpan(int microbatches_per_step) : per_step_(microbatches_per_step) {}

  void add(const StepReport& step) {
    if (!step.loss) return;
    if (!first_) first_ = step.loss;
    if (step.microbatches >= per_step_) {
      last_full_ = step.loss;
    } else {
      last_cut_ = step.loss;
    }
  }

  std::optional<double> first() const { return first_; }
  std::optional<double> last() const { return last_full_ ? last_full_ : last_cut_; }

 private:
  int per_step_;
  std::optional<double> first_;
  std::optional<double> last_full_;
  std::optional<double> last_cut_;
};

}  // namespace swarm
