// time_to_target_score: how `swarm bench time-to-target` scores a configuration,
// as Protocol NanoGPT scores pipeline training over slow links: the steps real
// training takes to reach a target validation loss, times the steady step time
// measured with the links on. Pure arithmetic on what the runs recorded.
//
//   const double target = *mean_loss_at(baseline_curves, 100);
//   std::optional<double> steps = steps_to_target(curve, target);
//   std::optional<double> step_s = steady_step_seconds(step_end_times, 3);
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace swarm::apps {

// A validation loss after `step` optimizer steps.
struct LossPoint {
  int64_t step = 0;
  double loss = 0;
};

// The validation loss at `step` (a fraction of a step allowed), linear between
// the evaluations around it; nullopt outside the curve. The curve is in step order.
std::optional<double> loss_at(std::span<const LossPoint> curve, double step);

// The mean over runs of loss_at; nullopt if any run does not cover `step`.
std::optional<double> mean_loss_at(std::span<const std::vector<LossPoint>> curves, double step);

// Steps until the loss first reaches `target` (<=), linear between the two
// evaluations around the crossing; nullopt if it never does.
std::optional<double> steps_to_target(std::span<const LossPoint> curve, double target);

// The median interval between consecutive step ends, leaving out the first
// `warmup` steps (the pipeline filling, connections opening); nullopt with fewer
// than 2 intervals left. The median, because one step that waits out a
// straggling round would pull a mean with it.
std::optional<double> steady_step_seconds(std::span<const double> step_end_times, int warmup);
// The mean of the same intervals. Far from the median, the steps came in bursts
// (several end at once after a stall), which the median alone would hide.
std::optional<double> mean_step_seconds(std::span<const double> step_end_times, int warmup);
// Whether a timed run's steps came in bursts: its mean and median step differ by more than 15%.
bool steps_in_bursts(double median_seconds, double mean_seconds);

// Several seeds of one configuration: their mean and range.
struct Spread {
  double mean = 0;
  double min = 0;
  double max = 0;
};
std::optional<Spread> spread_of(std::span<const double> values);

}  // namespace swarm::apps
