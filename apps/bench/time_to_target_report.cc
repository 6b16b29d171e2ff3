// The report of `swarm bench time-to-target`: one table of time to target, one of
// bytes and tokens/s, the JSON of both and a plot of loss against emulated time.
#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "apps/bench/svg_chart.h"
#include "apps/bench/time_to_target.h"

namespace swarm::apps {
namespace {

namespace fs = std::filesystem;

std::optional<double> seconds_to_target(const ConfigurationScore& s, const ConfigurationScore::Timed& t) {
  if (!s.steps || !t.step_seconds) return std::nullopt;
  return s.steps->mean * *t.step_seconds;
}

std::string steps_cell(const ConfigurationScore& s, int steps) {
  if (!s.steps) {
    int missed = 0;
    for (const auto& by_seed : s.steps_by_seed) missed += by_seed ? 0 : 1;
    return fmt::format("not reached by step {} ({} of {} seeds)", steps, missed, s.steps_by_seed.size());
  }
  return fmt::format("{:.1f} ({:.1f}–{:.1f})", s.steps->mean, s.steps->min, s.steps->max);
}

std::string optional_cell(std::optional<double> value, const char* format) {
  return value ? fmt::format(fmt::runtime(format), *value) : std::string("-");
}

// The seeds' mean validation loss at each evaluation every seed has.
std::vector<LossPoint> mean_curve(const ConfigurationScore& s) {
  std::vector<LossPoint> mean;
  for (const LossPoint& p : s.curves.front()) {
    const std::optional<double> loss = mean_loss_at(s.curves, static_cast<double>(p.step));
    if (loss) mean.push_back({p.step, *loss});
  }
  return mean;
}

// The simulator's step on each timed run's own config.json, held against the real step.
std::string simulator_markdown(const TimeToTargetResult& r) {
  std::string md =
      "\n## The simulator against the timed runs\n\n`swarm sim`'s model of each timed run (its swarm, links, hops, "
      "codecs, emulated device and waits; apps/bench/time_to_target_sim.h) and its steady step, scored the same way: "
      "the configuration's mean steps to target x the step.\n\n"
      "| configuration | mode | real step s | simulated step s (range over 5 seeds) | simulated / real | simulated time to target s | "
      "trainer's link up / down, simulated |\n|---|---|---|---|---|---|---|\n";
  for (const auto& s : r.scores) {
    for (const auto& t : s.timed) {
      if (!t.sim_step_seconds) {
        md += fmt::format("| {} | {} | {} | - ({}) | - | - | - |\n", s.configuration.label, t.mode,
                          optional_cell(t.step_seconds, "{:.3f}"), t.sim_error);
        continue;
      }
      const std::string ratio = t.step_seconds ? fmt::format("{:.2f}", *t.sim_step_seconds / *t.step_seconds) : "-";
      const std::string seconds = s.steps ? fmt::format("{:.1f}", s.steps->mean * *t.sim_step_seconds) : "-";
      md += fmt::format("| {} | {} | {} | {:.3f} ({:.3f}-{:.3f}) | {} | {} | {:.0f} / {:.0f} |\n", s.configuration.label,
                        t.mode, optional_cell(t.step_seconds, "{:.3f}"), *t.sim_step_seconds, t.sim_step_min,
                        t.sim_step_max, ratio, seconds, t.sim_trainer_up_bytes, t.sim_trainer_down_bytes);
    }
  }
  return md;
}

std::string markdown(const TimeToTargetOptions& o, const TimeToTargetResult& r) {
  const ConfigurationScore& base = r.scores.front();
  const std::optional<double> base_hub = [&]() -> std::optional<double> {
    for (const auto& t : base.timed) {
      if (t.mode == "hub") return seconds_to_target(base, t);
    }
    return std::nullopt;
  }();
  std::string md = fmt::format(
      "# Time to target\n\n"
      "Target: under each seed, `{1}`'s validation loss at step {3:g} under that seed ({0:.4f} on average over "
      "seeds {2}), so every configuration is held against the baseline's own weights and data order. Steps to it "
      "come from training with the links off ({4} stages x {5} peers, {6} x {7} microbatches per step, {8} steps, "
      "a validation every {9}); the step time is the median after {10} warm-up steps of {11} timed steps with "
      "every process behind `--link {12}` and peers at `--emulated-device {13:g}`. Time to target = mean steps x "
      "step time.\n\n",
      r.target, base.configuration.label, fmt::join(o.seeds, ", "), o.target_at, o.stages, o.peers_per_stage,
      o.microbatches_per_step, o.microbatch, o.steps, o.eval_every, o.warmup_steps, o.timed_steps, o.link,
      o.device_flops);
  md += "| configuration | steps to target: mean (range) | steps penalty | loss at step " + std::to_string(o.steps) +
        " | mode | step time s | time to target s | faster than uncompressed hub |\n"
        "|---|---|---|---|---|---|---|---|\n";
  for (const auto& s : r.scores) {
    const std::string penalty = s.steps && base.steps ? fmt::format("{:.2f}x", s.steps->mean / base.steps->mean) : "-";
    for (const auto& t : s.timed) {
      const std::optional<double> seconds = seconds_to_target(s, t);
      const std::string faster = seconds && base_hub ? fmt::format("{:.2f}x", *base_hub / *seconds) : "-";
      md += fmt::format("| {} | {} | {} | {:.4f} | {} | {} | {} | {} |\n", s.configuration.label, steps_cell(s, o.steps),
                        penalty, s.final_loss_mean, t.mode, optional_cell(t.step_seconds, "{:.3f}"),
                        optional_cell(seconds, "{:.1f}"), faster);
    }
  }
  for (const auto& s : r.scores) {
    for (const auto& t : s.timed) {
      if (t.step_seconds && t.mean_step_seconds && steps_in_bursts(*t.step_seconds, *t.mean_step_seconds)) {
        md += fmt::format("\n**{} {}: its steps came in bursts**: median {:.3f} s, mean {:.3f} s a step; the "
                          "median is not its rate.\n",
                          s.configuration.label, t.mode, *t.step_seconds, *t.mean_step_seconds);
      }
    }
  }
  md += "\n## Bytes and tokens/s of the timed runs\n\nPer completed microbatch (validation included), from each "
        "process's emulated link; the busiest peer is the one whose link carried the most.\n\n"
        "| configuration | mode | trainer's link up / down | busiest peer's link up / down | tokens/s | p2p / hub |\n"
        "|---|---|---|---|---|---|\n";
  for (const auto& s : r.scores) {
    double hub_rate = 0;
    for (const auto& t : s.timed) hub_rate = t.mode == "hub" ? t.tokens_per_second : hub_rate;
    for (const auto& t : s.timed) {
      const std::string ratio = t.mode == "p2p" && hub_rate > 0 ? fmt::format("{:.2f}x", t.tokens_per_second / hub_rate)
                                                               : std::string("-");
      md += fmt::format("| {} | {} | {:.0f} / {:.0f} | {:.0f} / {:.0f} | {:.0f} | {} |\n", s.configuration.label, t.mode,
                        t.trainer_up_bytes, t.trainer_down_bytes, t.peer_up_bytes, t.peer_down_bytes,
                        t.tokens_per_second, ratio);
    }
  }
  return md + simulator_markdown(r) + "\n![validation loss against emulated time](time_to_target.svg)\n";
}

nlohmann::json to_json(const TimeToTargetOptions& o, const TimeToTargetResult& r) {
  nlohmann::json scores = nlohmann::json::array();
  for (const auto& s : r.scores) {
    nlohmann::json curves = nlohmann::json::array(), by_seed = nlohmann::json::array(), timed = nlohmann::json::array();
    for (const auto& curve : s.curves) {
      nlohmann::json points = nlohmann::json::array();
      for (const auto& p : curve) points.push_back({p.step, p.loss});
      curves.push_back(points);
    }
    for (const auto& steps : s.steps_by_seed) by_seed.push_back(steps ? nlohmann::json(*steps) : nlohmann::json());
    for (const auto& t : s.timed) {
      timed.push_back({{"mode", t.mode},
                       {"step_seconds", t.step_seconds ? nlohmann::json(*t.step_seconds) : nlohmann::json()},
                       {"mean_step_seconds",
                        t.mean_step_seconds ? nlohmann::json(*t.mean_step_seconds) : nlohmann::json()},
                       {"seconds_to_target", seconds_to_target(s, t) ? nlohmann::json(*seconds_to_target(s, t))
                                                                     : nlohmann::json()},
                       {"tokens_per_second", t.tokens_per_second},
                       {"trainer_link_bytes_per_microbatch", {{"up", t.trainer_up_bytes}, {"down", t.trainer_down_bytes}}},
                       {"busiest_peer_link_bytes_per_microbatch", {{"up", t.peer_up_bytes}, {"down", t.peer_down_bytes}}},
                       {"simulated_step_seconds", t.sim_step_seconds ? nlohmann::json(*t.sim_step_seconds) : nlohmann::json()},
                       {"simulated_trainer_link_bytes_per_microbatch",
                        {{"up", t.sim_trainer_up_bytes}, {"down", t.sim_trainer_down_bytes}}},
                       {"simulator_error", t.sim_error}});
    }
    scores.push_back({{"label", s.configuration.label}, {"codec", s.configuration.codec},
                      {"boundary", s.configuration.boundary}, {"flags", s.configuration.flags},
                      {"steps_to_target_by_seed", by_seed},
                      {"steps_to_target_mean", s.steps ? nlohmann::json(s.steps->mean) : nlohmann::json()},
                      {"final_loss_mean", s.final_loss_mean}, {"curves", curves}, {"timed", timed}});
  }
  return {{"target", r.target}, {"targets_by_seed", r.targets}, {"target_at", o.target_at}, {"seeds", o.seeds}, {"steps", o.steps},
          {"link", o.link}, {"device_flops", o.device_flops}, {"scores", scores}};
}

std::string chart(const TimeToTargetOptions& o, const TimeToTargetResult& r) {
  ChartSpec spec{.title = fmt::format("validation loss against time on {} links", o.link),
                 .x_label = "emulated seconds (step x steady step time)",
                 .y_label = "validation loss (mean over seeds)"};
  double longest = 0;
  int color = 0;
  for (const auto& s : r.scores) {
    const std::vector<LossPoint> curve = mean_curve(s);
    for (const auto& t : s.timed) {
      if (!t.step_seconds) continue;
      ChartSeries series{.label = fmt::format("{} {}", s.configuration.label, t.mode),
                         .dashed = t.mode == "hub", .markers = false, .color = color};
      for (const auto& p : curve) series.points.emplace_back(p.step * *t.step_seconds, p.loss);
      if (!series.points.empty()) longest = std::max(longest, series.points.back().first);
      spec.series.push_back(std::move(series));
    }
    ++color;
  }
  spec.series.push_back({.label = fmt::format("mean target {:.4f}", r.target), .points = {{0, r.target}, {longest, r.target}},
                         .dashed = true, .markers = false});
  return render_svg(spec, ChartExtras{.x_ticks = 8});
}

}  // namespace

Status write_time_to_target_report(const TimeToTargetOptions& o, const TimeToTargetResult& result) {
  const fs::path out(o.out);
  std::ofstream(out / "time_to_target.md") << markdown(o, result);
  std::ofstream(out / "time_to_target.json") << to_json(o, result).dump(1) << "\n";
  std::ofstream(out / "time_to_target.svg") << chart(o, result);
  if (!fs::exists(out / "time_to_target.svg")) return internal("could not write the report into {}", out.string());
  return Status::ok();
}

}  // namespace swarm::apps
