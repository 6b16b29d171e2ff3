// metric_means: the means of a loss stage's metrics (accuracy, say) over the
// microbatches of a step or a validation, each weighted as its loss is.
//
// The values come from the last stage's peers, so they are checked here: a
// microbatch whose metrics are not `count` finite values adds nothing and is
// counted. They only report: no value of them reaches a gradient.
//
//   MetricMeans means(spec.io.metrics.size());
//   means.add(outcome.metrics, units);
//   std::vector<double> accuracy_and_more = means.means();  // empty until one was added
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace swarm {

class MetricMeans {
 public:
  explicit MetricMeans(size_t count = 0) : sums_(count, 0.0) {}

  void add(const std::vector<float>& values, double weight) {
    if (sums_.empty()) return;
    bool usable = values.size() == sums_.size() && std::isfinite(weight) && weight > 0;
    for (size_t i = 0; usable && i < values.size(); ++i) usable = std::isfinite(values[i]);
    if (!usable) {
      ++refused_;
      return;
    }
    for (size_t i = 0; i < values.size(); ++i) sums_[i] += weight * values[i];
    weight_ += weight;
  }

  // One mean per metric; empty when there are none or nothing usable was added.
  std::vector<double> means() const {
    if (weight_ <= 0) return {};
    std::vector<double> out(sums_.size());
    for (size_t i = 0; i < sums_.size(); ++i) out[i] = sums_[i] / weight_;
    return out;
  }

  // Microbatches whose metrics were missing, of another count or not finite.
  int64_t refused() const { return refused_; }

 private:
  std::vector<double> sums_;
  double weight_ = 0;
  int64_t refused_ = 0;
};

}  // namespace swarm
