#include "apps/bench/time_to_target.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "apps/bench/time_to_target_sim.h"
#include "apps/child_process.h"

namespace swarm::apps {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, separator);) parts.push_back(part);
  return parts;
}

// The flags every run of one configuration shares.
std::vector<std::string> common_args(const TimeToTargetOptions& o, const TrainingConfiguration& c,
                                     const fs::path& dir) {
  std::vector<std::string> args = {"local",
                                   "--run-dir", dir.string(),
                                   "--stages", std::to_string(o.stages),
                                   "--peers-per-stage", std::to_string(o.peers_per_stage),
                                   "--microbatch", std::to_string(o.microbatch),
                                   "--microbatches-per-step", std::to_string(o.microbatches_per_step),
                                   "--in-flight", std::to_string(o.microbatches_per_step),
                                   "--global-batch", "-1",
                                   "--rebalance-period", "0",
                                   "--codec", c.codec,
                                   "--boundary", c.boundary};
  args.insert(args.end(), c.flags.begin(), c.flags.end());
  args.insert(args.end(), o.local_flags.begin(), o.local_flags.end());
  return args;
}

std::string tail_of(const fs::path& log, size_t lines) {
  std::ifstream in(log);
  std::vector<std::string> all;
  for (std::string line; std::getline(in, line);) all.push_back(line);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) out += all[i] + "\n";
  return out;
}

// Runs `swarm local` into `dir` unless a finished run is there already.
Status run_once(const std::vector<std::string>& args, const fs::path& dir, const BenchSink& print) {
  if (fs::exists(dir / "done")) {
    print(fmt::format("time-to-target: {} already measured", dir.string()));
    return Status::ok();
  }
  std::error_code ignored;
  fs::remove_all(dir, ignored);
  fs::create_directories(dir.parent_path());
  const fs::path log = dir.string() + ".log";
  print(fmt::format("time-to-target: swarm {}", fmt::join(args, " ")));
  const auto started = std::chrono::steady_clock::now();
  SWARM_ASSIGN_OR_RETURN(ChildProcess child, ChildProcess::spawn(args, log.string()));
  const int code = child.wait_for_exit();
  if (code != 0) {
    return internal("swarm local into {} exited with {}; the end of {}:\n{}", dir.string(), code, log.string(),
                    tail_of(log, 8));
  }
  std::ofstream(dir / "done") << "";
  print(fmt::format("time-to-target: {} done in {:.0f} s", dir.filename().string(),
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()));
  return Status::ok();
}

Result<std::vector<nlohmann::json>> read_records(const fs::path& dir) {
  std::ifstream in(dir / "metrics.jsonl");
  if (!in) return not_found("{}: no metrics.jsonl", dir.string());
  std::vector<nlohmann::json> records;
  for (std::string line; std::getline(in, line);) {
    auto record = nlohmann::json::parse(line, nullptr, false);
    if (!record.is_discarded() && record.is_object() && record.contains("kind")) records.push_back(std::move(record));
  }
  return records;
}

bool is_final(const nlohmann::json& r) { return r.contains("validation_loss"); }

// A number field of a record, or `otherwise` where it is missing or not a number.
double number_or(const nlohmann::json& r, const char* key, double otherwise) {
  const auto it = r.find(key);
  return it != r.end() && it->is_number() ? it->get<double>() : otherwise;
}

// The validations along a training run, and its final one at its last step.
Result<std::vector<LossPoint>> loss_curve(const fs::path& dir) {
  SWARM_ASSIGN_OR_RETURN(auto records, read_records(dir));
  std::vector<LossPoint> curve;
  for (const auto& r : records) {
    if (!(r["kind"] == "validation" || (r["kind"] == "step" && is_final(r)))) continue;
    if (!r["validation_loss"].is_number() || !r["step"].is_number_integer()) continue;
    curve.push_back({r["step"].get<int64_t>(), r["validation_loss"].get<double>()});
  }
  std::sort(curve.begin(), curve.end(), [](const LossPoint& a, const LossPoint& b) { return a.step < b.step; });
  if (curve.size() < 2) return not_found("{}: fewer than 2 validations in metrics.jsonl", dir.string());
  return curve;
}

}  // namespace

Result<ConfigurationScore::Timed> measure_timed_run(const std::string& run_dir, int warmup_steps) {
  const fs::path dir(run_dir);
  SWARM_ASSIGN_OR_RETURN(auto records, read_records(dir));
  std::ifstream config_in(dir / "config.json");
  const auto config = nlohmann::json::parse(config_in, nullptr, false);
  if (!config.is_object()) return invalid_argument("{} has no readable config.json", dir.string());
  ConfigurationScore::Timed timed;
  // value() would throw on a "hops" of another type; a run's file is read, never trusted.
  timed.mode = config.contains("hops") && config["hops"].is_string() ? config["hops"].get<std::string>() : "hub";
  std::vector<double> ends;
  const nlohmann::json* final = nullptr;
  for (const auto& r : records) {
    if (r["kind"] != "step") continue;
    if (is_final(r)) final = &r;
    else if (const double t = number_or(r, "time", -1); t >= 0) ends.push_back(t);
  }
  timed.step_seconds = steady_step_seconds(ends, warmup_steps);
  timed.mean_step_seconds = mean_step_seconds(ends, warmup_steps);
  const double seq = config.contains("model") && config["model"].is_object() ? number_or(config["model"], "max_seq_len", 0) : 0;
  const double samples_per_step = number_or(config, "microbatches_per_step", 0) * number_or(config, "microbatch", 0);
  if (timed.step_seconds && *timed.step_seconds > 0) timed.tokens_per_second = samples_per_step * seq / *timed.step_seconds;
  if (final != nullptr && final->contains("link_bytes") && (*final)["link_bytes"].is_object()) {
    const double microbatches = std::max(1.0, number_or(*final, "microbatches_completed", 1));
    for (const auto& [name, link] : (*final)["link_bytes"].items()) {
      if (!link.is_object()) continue;
      const double up = number_or(link, "up", 0) / microbatches, down = number_or(link, "down", 0) / microbatches;
      if (name == "trainers") {
        timed.trainer_up_bytes = up;
        timed.trainer_down_bytes = down;
      } else if (up + down > timed.peer_up_bytes + timed.peer_down_bytes) {
        timed.peer_up_bytes = up;
        timed.peer_down_bytes = down;
      }
    }
  }
  // The simulator on the same run; a run it cannot stand for keeps the reason, not the benchmark's failure.
  if (auto simulated = simulated_step(config); simulated.is_ok()) {
    timed.sim_step_seconds = simulated->step_seconds;
    timed.sim_step_min = simulated->step_min;
    timed.sim_step_max = simulated->step_max;
    timed.sim_command = simulated->command;
    timed.sim_trainer_up_bytes = simulated->trainer_up_bytes;
    timed.sim_trainer_down_bytes = simulated->trainer_down_bytes;
  } else {
    timed.sim_error = simulated.status().message();
  }
  return timed;
}

Result<TrainingConfiguration> parse_configuration(const std::string& text) {
  const std::vector<std::string> parts = split(text, '|');
  if (parts.size() < 3 || parts.size() > 4 || parts[0].empty() || parts[1].empty() || parts[2].empty()) {
    return invalid_argument("a configuration is label|codec|boundary[|--flag=value ...], not '{}'", text);
  }
  for (char c : parts[0]) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '+' && c != '-' && c != '_' && c != '.') {
      return invalid_argument("a configuration's label names a directory: letters, digits and +-_. only, not '{}'",
                              parts[0]);
    }
  }
  TrainingConfiguration c{parts[0], parts[1], parts[2], {}};
  if (parts.size() == 4) {
    for (const std::string& flag : split(parts[3], ' ')) {
      if (flag.empty()) continue;
      if (flag.rfind("--", 0) != 0) return invalid_argument("'{}' in '{}' is not a --flag", flag, text);
      c.flags.push_back(flag);
    }
  }
  return c;
}

Status validate(const TimeToTargetOptions& o) {
  if (o.out.empty()) return invalid_argument("--out is required");
  if (o.configurations.empty()) return invalid_argument("--configurations needs at least the baseline");
  std::set<std::string> labels;
  for (const auto& text : o.configurations) {
    SWARM_ASSIGN_OR_RETURN(TrainingConfiguration c, parse_configuration(text));
    if (!labels.insert(c.label).second) return invalid_argument("configuration label '{}' appears twice", c.label);
  }
  if (o.seeds.empty()) return invalid_argument("--seeds needs at least one seed");
  for (const auto& mode : o.modes) {
    if (mode != "hub" && mode != "p2p") return invalid_argument("--modes are hub and p2p, not '{}'", mode);
  }
  if (o.stages < 1 || o.peers_per_stage < 1 || o.microbatch < 1 || o.microbatches_per_step < 1) {
    return invalid_argument("stages, peers per stage and batch sizes must be >= 1");
  }
  if (o.steps < 2 || o.eval_every < 1 || o.eval_every >= o.steps || o.eval_windows < 1) {
    return invalid_argument("--steps >= 2 with --eval-every in [1, steps) and --eval-windows >= 1");
  }
  if (!(o.target_at > 0) || o.target_at > o.steps) return invalid_argument("--target-at must be in (0, --steps]");
  if (!(o.device_flops > 0) || !std::isfinite(o.device_flops)) return invalid_argument("--flops must be > 0");
  if (o.timed_steps < o.warmup_steps + 3 || o.warmup_steps < 0) {
    return invalid_argument("--timed-steps must leave at least 3 steps after --warmup-steps");
  }
  return Status::ok();
}

Result<TimeToTargetResult> run_time_to_target(const TimeToTargetOptions& o, const BenchSink& print) {
  SWARM_RETURN_IF_ERROR(validate(o));
  const fs::path out(o.out);
  std::vector<TrainingConfiguration> configurations;
  for (const auto& text : o.configurations) configurations.push_back(*parse_configuration(text));
  TimeToTargetResult result;
  for (const auto& c : configurations) {
    ConfigurationScore score;
    score.configuration = c;
    for (int seed : o.seeds) {
      const fs::path dir = out / "train" / fmt::format("{}-seed{}", c.label, seed);
      std::vector<std::string> args = common_args(o, c, dir);
      args.insert(args.end(), {"--steps", std::to_string(o.steps), "--eval-every", std::to_string(o.eval_every),
                               "--eval-windows", std::to_string(o.eval_windows), "--hops", "hub", "--seed",
                               std::to_string(seed)});
      SWARM_RETURN_IF_ERROR(run_once(args, dir, print));
      SWARM_ASSIGN_OR_RETURN(std::vector<LossPoint> curve, loss_curve(dir));
      score.curves.push_back(std::move(curve));
    }
    for (const std::string& mode : o.modes) {
      const fs::path dir = out / "time" / fmt::format("{}-{}", c.label, mode);
      std::vector<std::string> args = common_args(o, c, dir);
      args.insert(args.end(), {"--steps", std::to_string(o.timed_steps), "--eval-windows", "8", "--hops", mode,
                               "--link", o.link, "--emulated-device", fmt::format("{:g}", o.device_flops)});
      SWARM_RETURN_IF_ERROR(run_once(args, dir, print));
      SWARM_ASSIGN_OR_RETURN(ConfigurationScore::Timed timed, measure_timed_run(dir.string(), o.warmup_steps));
      score.timed.push_back(timed);
    }
    result.scores.push_back(std::move(score));
  }
  for (const auto& curve : result.scores.front().curves) {
    const std::optional<double> target = loss_at(curve, o.target_at);
    if (!target) return not_found("a baseline run does not reach step {} (--target-at)", o.target_at);
    result.targets.push_back(*target);
    result.target += *target / static_cast<double>(o.seeds.size());
  }
  for (auto& score : result.scores) {
    std::vector<double> reached;
    double final_sum = 0;
    for (size_t seed = 0; seed < score.curves.size(); ++seed) {
      const auto& curve = score.curves[seed];
      score.steps_by_seed.push_back(steps_to_target(curve, result.targets[seed]));
      if (score.steps_by_seed.back()) reached.push_back(*score.steps_by_seed.back());
      final_sum += curve.back().loss;
    }
    score.final_loss_mean = final_sum / static_cast<double>(score.curves.size());
    if (reached.size() == score.curves.size()) score.steps = spread_of(reached);
  }
  return result;
}

}  // namespace swarm::apps
