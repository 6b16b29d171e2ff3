#include "apps/bench/time_to_target_score.h"

#include <algorithm>
#include <cmath>

namespace swarm::apps {

std::optional<double> loss_at(std::span<const LossPoint> curve, double step) {
  for (size_t i = 0; i < curve.size(); ++i) {
    if (static_cast<double>(curve[i].step) == step) return curve[i].loss;
    if (i > 0 && curve[i - 1].step < step && step < curve[i].step) {
      const double t = (step - curve[i - 1].step) / static_cast<double>(curve[i].step - curve[i - 1].step);
      return curve[i - 1].loss + t * (curve[i].loss - curve[i - 1].loss);
    }
  }
  return std::nullopt;
}

std::optional<double> mean_loss_at(std::span<const std::vector<LossPoint>> curves, double step) {
  if (curves.empty()) return std::nullopt;
  double sum = 0;
  for (const auto& curve : curves) {
    const std::optional<double> loss = loss_at(curve, step);
    if (!loss) return std::nullopt;
    sum += *loss;
  }
  return sum / static_cast<double>(curves.size());
}

std::optional<double> steps_to_target(std::span<const LossPoint> curve, double target) {
  for (size_t i = 0; i < curve.size(); ++i) {
    if (!(curve[i].loss <= target)) continue;
    if (i == 0 || !std::isfinite(curve[i - 1].loss)) return static_cast<double>(curve[i].step);
    const LossPoint& before = curve[i - 1];
    const double t = (before.loss - target) / (before.loss - curve[i].loss);
    return static_cast<double>(before.step) + t * static_cast<double>(curve[i].step - before.step);
  }
  return std::nullopt;
}

std::optional<double> steady_step_seconds(std::span<const double> step_end_times, int warmup) {
  std::vector<double> intervals;
  for (size_t i = static_cast<size_t>(std::max(warmup, 0)) + 1; i < step_end_times.size(); ++i) {
    intervals.push_back(step_end_times[i] - step_end_times[i - 1]);
  }
  if (intervals.size() < 2) return std::nullopt;
  std::sort(intervals.begin(), intervals.end());
  const size_t n = intervals.size();
  return n % 2 == 1 ? intervals[n / 2] : (intervals[n / 2 - 1] + intervals[n / 2]) / 2;
}

std::optional<double> mean_step_seconds(std::span<const double> step_end_times, int warmup) {
  const size_t first = static_cast<size_t>(std::max(warmup, 0));
  if (step_end_times.size() < first + 3) return std::nullopt;
  const size_t intervals = step_end_times.size() - first - 1;
  return (step_end_times.back() - step_end_times[first]) / static_cast<double>(intervals);
}

bool steps_in_bursts(double median_seconds, double mean_seconds) {
  return median_seconds > 0 && std::abs(mean_seconds / median_seconds - 1.0) > 0.15;
}

std::optional<Spread> spread_of(std::span<const double> values) {
  if (values.empty()) return std::nullopt;
  Spread s{0, values.front(), values.front()};
  for (double v : values) {
    s.mean += v;
    s.min = std::min(s.min, v);
    s.max = std::max(s.max, v);
  }
  s.mean /= static_cast<double>(values.size());
  return s;
}

}  // namespace swarm::apps
