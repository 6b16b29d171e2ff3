// time_to_target: `swarm bench time-to-target`, pipeline training over slow links
// scored by the wall time to a target validation loss (Protocol NanoGPT's T):
//
//   T = steps to the target, from real training with the links off
//     x the steady step time, from a run with every process behind a
//       --link (200 Mb/s, 50 ms) and peers at an emulated device's pace.
//
// For each configuration of the compression ablation (codec, boundary layers) it
// trains `swarm local` under every seed with validations along the way, then times
// steps in hub and peer-to-peer mode. Under each seed the target is the
// uncompressed baseline's validation loss at --target-at steps under that seed:
// seeds fix the weights and the data order, and their losses differ by more than a
// codec's penalty, so a target shared by all seeds would measure the seeds. A
// configuration that costs steps shows the cost against the same seed. Every run is a child `swarm local` in its own directory under
// --out; one whose directory is marked done is not run again, so an interrupted
// benchmark continues where it stopped.
//
//   TimeToTargetOptions o;
//   o.out = "ttt";
//   Status s = run_time_to_target(o, [](const std::string& line) { fmt::print("{}\n", line); });
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "apps/bench/time_to_target_score.h"
#include "swarm/core/status.h"

namespace swarm::apps {

// One configuration: "label|codec|boundary", optionally "|--flag=value ..." for
// more `swarm local` flags. The first configuration is the baseline.
struct TrainingConfiguration {
  std::string label;
  std::string codec;
  std::string boundary;
  std::vector<std::string> flags;
};
Result<TrainingConfiguration> parse_configuration(const std::string& text);

struct TimeToTargetOptions {
  std::string out;
  std::vector<std::string> configurations = {
      "none|none|none",           "fp16|fp16|none",          "8bit|8bit|none",
      "4bit|4bit|none",           "maxout2+8bit|8bit|maxout:2", "maxout4+8bit|8bit|maxout:4",
      "maxout2+4bit|4bit|maxout:2", "maxout4+4bit|4bit|maxout:4", "bottleneck4+4bit|4bit|bottleneck:4",
      "maxout4+4bit-act+8bit-grad|4bit|maxout:4|--gradient-codec=8bit"};
  std::vector<int> seeds = {1, 2, 3};
  std::vector<std::string> modes = {"hub", "p2p"};
  // The swarm and the batch, the same in the training and the timed runs.
  int stages = 2;
  int peers_per_stage = 2;
  int microbatch = 8;
  int microbatches_per_step = 32;  // one global step per step, all of it in flight
  // Training (links off).
  int steps = 150;
  int eval_every = 10;
  int eval_windows = 64;
  double target_at = 100;  // the baseline's validation loss at this step (same seed) is the target
  // Timing (links on).
  std::string link = "200mbit,50ms";
  double device_flops = 25e12;  // --emulated-device: a T4-class GPU
  int timed_steps = 12;
  int warmup_steps = 3;
  std::vector<std::string> local_flags;  // more flags for every run (--d-model 64, say)
};

Status validate(const TimeToTargetOptions& o);

// What one configuration scored.
struct ConfigurationScore {
  TrainingConfiguration configuration;
  std::vector<std::optional<double>> steps_by_seed;  // to the target; none where not reached
  std::vector<std::vector<LossPoint>> curves;         // by seed
  std::optional<Spread> steps;                        // over the seeds that reached it
  double final_loss_mean = 0;                         // at --steps, over seeds
  struct Timed {
    std::string mode;
    std::optional<double> step_seconds;       // the median after the warm-up
    std::optional<double> mean_step_seconds;  // the mean of the same steps
    double trainer_up_bytes = 0, trainer_down_bytes = 0;  // per completed microbatch
    double peer_up_bytes = 0, peer_down_bytes = 0;        // the busiest peer's link, per microbatch
    double tokens_per_second = 0;                         // the timed run's steady rate
    // The simulator's steady step and trainer bytes per microbatch on the same run
    // (time_to_target_sim.h), or why it has none.
    std::optional<double> sim_step_seconds;  // mean over the simulator's seeds
    double sim_step_min = 0, sim_step_max = 0;
    double sim_trainer_up_bytes = 0, sim_trainer_down_bytes = 0;
    std::string sim_error;
    std::string sim_command;  // the `swarm sim` command line of its scenario
  };
  std::vector<Timed> timed;  // by mode
};

struct TimeToTargetResult {
  std::vector<double> targets;  // by seed
  double target = 0;            // their mean, for the report
  std::vector<ConfigurationScore> scores;
};

using BenchSink = std::function<void(const std::string&)>;

// One timed run's steady step (the median after `warmup_steps`), its links' bytes and
// the simulator's step on its config.json. Also `swarm bench simulate-runs`.
Result<ConfigurationScore::Timed> measure_timed_run(const std::string& run_dir, int warmup_steps);

Result<TimeToTargetResult> run_time_to_target(const TimeToTargetOptions& o, const BenchSink& print);

// time_to_target.md, time_to_target.json and time_to_target.svg under o.out.
Status write_time_to_target_report(const TimeToTargetOptions& o, const TimeToTargetResult& result);

}  // namespace swarm::apps
