#include "apps/bench/bench_command.h"

#include <cstdio>
#include <memory>

#include <fmt/core.h>

#include "apps/bench/square_cube.h"
#include "apps/bench/time_to_target.h"

namespace swarm::apps {
namespace {

void add_square_cube_flags(CLI::App* c, SquareCubeOptions* o) {
  c->add_option("--out", o->out, "Directory for square_cube.json, square_cube.md and the plots")->required();
  c->add_option("--widths", o->widths, "d_model of the width sweep")->delimiter(',')->capture_default_str();
  c->add_option("--latencies-ms", o->latencies_ms, "One-way latencies of the sweep at the largest width")
      ->delimiter(',')
      ->capture_default_str();
  c->add_option("--bandwidth-mbps", o->bandwidth_mbps, "Link bandwidth, each direction")->capture_default_str();
  c->add_option("--latency-ms", o->latency_ms, "One-way latency of the width sweep")->capture_default_str();
  c->add_option("--flops", o->flops_per_second, "Emulated compute rate, FLOP/s (25e12: a T4-class GPU)")
      ->capture_default_str();
  c->add_option("--layers", o->layers, "Transformer layers in the stage")->capture_default_str();
  c->add_option("--seq", o->seq, "Tokens per sequence")->capture_default_str();
  c->add_option("--microbatch", o->microbatch, "Sequences per microbatch")->capture_default_str();
  c->add_option("--bottleneck-k", o->bottleneck_k, "The bottleneck's factor in 8bit+bottleneck (2 or 4)")
      ->capture_default_str();
  c->add_option("--real-widths", o->real_widths, "Widths also run by a real GPT stage on this CPU (empty: none)")
      ->delimiter(',')
      ->capture_default_str();
  c->add_option("--real-layers", o->real_layers, "Layers of the real-compute stage")->capture_default_str();
  c->add_option("--seconds-per-point", o->seconds_per_point, "Measured time per point, after the warm-up")
      ->capture_default_str();
  c->add_option("--max-in-flight", o->max_in_flight, "Cap on microbatches in flight")->capture_default_str();
}

int run_square_cube_command(const SquareCubeOptions& o) {
  if (Status s = validate(o); !s.is_ok()) {
    fmt::print(stderr, "swarm bench square-cube: {}\n", s.message());
    return 2;
  }
  fmt::print(stderr, "swarm bench square-cube: {} points into {}\n", plan_points(o).size(), o.out);
  Status s = run_square_cube(o, [](const std::string& line) { fmt::print(stderr, "{}\n", line); });
  if (!s.is_ok()) {
    fmt::print(stderr, "swarm bench square-cube: {}\n", s.to_string());
    return 1;
  }
  fmt::print("square-cube: wrote {0}/square_cube.json, {0}/square_cube.md and 4 plots\n", o.out);
  return 0;
}

void add_time_to_target_flags(CLI::App* c, TimeToTargetOptions* o) {
  c->add_option("--out", o->out, "Directory for the runs, time_to_target.{md,json,svg}")->required();
  c->add_option("--configurations", o->configurations,
                "label|codec|boundary[|--flag=value ...], the first the baseline (default: the compression ablation's)")
      ->delimiter(',');
  c->add_option("--seeds", o->seeds, "Seeds of the training runs")->delimiter(',')->capture_default_str();
  c->add_option("--modes", o->modes, "Hop modes timed: hub, p2p")->delimiter(',')->capture_default_str();
  c->add_option("--stages", o->stages, "Pipeline stages")->capture_default_str();
  c->add_option("--peers-per-stage", o->peers_per_stage, "Peers serving each stage")->capture_default_str();
  c->add_option("--microbatch", o->microbatch, "Sequences per microbatch")->capture_default_str();
  c->add_option("--microbatches-per-step", o->microbatches_per_step,
                "Microbatches per step, all in flight; one global step per step")
      ->capture_default_str();
  c->add_option("--steps", o->steps, "Steps of each training run")->capture_default_str();
  c->add_option("--eval-every", o->eval_every, "Steps between validations of the training runs")->capture_default_str();
  c->add_option("--eval-windows", o->eval_windows, "Validation windows of each evaluation")->capture_default_str();
  c->add_option("--target-at", o->target_at, "The target: the baseline's mean validation loss at this step")
      ->capture_default_str();
  c->add_option("--link", o->link, "Every process's link in the timed runs: RATE,LATENCY")->capture_default_str();
  c->add_option("--flops", o->device_flops, "The timed runs' emulated device, FLOP/s")->capture_default_str();
  c->add_option("--timed-steps", o->timed_steps, "Steps of each timed run")->capture_default_str();
  c->add_option("--warmup-steps", o->warmup_steps, "Timed steps left out of the step time")->capture_default_str();
  c->add_option("--local-flag", o->local_flags, "A flag for every `swarm local` (repeat; --d-model=64, say)");
}

int run_time_to_target_command(const TimeToTargetOptions& o) {
  if (Status s = validate(o); !s.is_ok()) {
    fmt::print(stderr, "swarm bench time-to-target: {}\n", s.message());
    return 2;
  }
  auto print = [](const std::string& line) { fmt::print(stderr, "{}\n", line); };
  Result<TimeToTargetResult> result = run_time_to_target(o, print);
  if (!result.is_ok()) {
    fmt::print(stderr, "swarm bench time-to-target: {}\n", result.status().to_string());
    return 1;
  }
  if (Status s = write_time_to_target_report(o, *result); !s.is_ok()) {
    fmt::print(stderr, "swarm bench time-to-target: {}\n", s.to_string());
    return 1;
  }
  fmt::print("time-to-target: target {:.4f}; wrote {}/time_to_target.md, .json and .svg\n", result->target, o.out);
  return 0;
}

struct SimulateRunsOptions {
  std::vector<std::string> run_dirs;
  int warmup_steps = 3;
  bool print_commands = false;
};

// Each finished `swarm local` run's steady step beside the simulator's on its config.json.
int run_simulate_runs_command(const SimulateRunsOptions& o) {
  if (o.warmup_steps < 0) {
    fmt::print(stderr, "swarm bench simulate-runs: --warmup-steps must be >= 0\n");
    return 2;
  }
  int failures = 0;
  fmt::print("| run | mode | real step s | simulated step s (range over seeds) | simulated / real |\n|---|---|---|---|---|\n");
  for (const std::string& dir : o.run_dirs) {
    Result<ConfigurationScore::Timed> t = measure_timed_run(dir, o.warmup_steps);
    if (!t.is_ok() || !t->step_seconds || !t->sim_step_seconds) {
      const std::string why = !t.is_ok() ? t.status().message() : !t->step_seconds ? "too few steps" : t->sim_error;
      fmt::print(stderr, "swarm bench simulate-runs: {}: {}\n", dir, why);
      ++failures;
      continue;
    }
    fmt::print("| {} | {} | {:.3f} | {:.3f} ({:.3f}-{:.3f}) | {:.2f} |\n", dir, t->mode, *t->step_seconds,
               *t->sim_step_seconds, t->sim_step_min, t->sim_step_max, *t->sim_step_seconds / *t->step_seconds);
    if (o.print_commands) fmt::print("\n    {}\n\n", t->sim_command);
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

void add_bench_command(CLI::App& app, int* exit_code) {
  CLI::App* bench = app.add_subcommand("bench", "Experiments measured against a model of the system");
  bench->require_subcommand(1);
  auto options = std::make_shared<SquareCubeOptions>();
  CLI::App* square_cube = bench->add_subcommand(
      "square-cube", "One stage over an emulated WAN link: compute utilization against d_model and latency");
  add_square_cube_flags(square_cube, options.get());
  square_cube->callback([options, exit_code] { *exit_code = run_square_cube_command(*options); });
  auto target_options = std::make_shared<TimeToTargetOptions>();
  CLI::App* time_to_target = bench->add_subcommand(
      "time-to-target", "Steps to a target validation loss x the step time on slow links, per compression "
                        "configuration, in hub and peer-to-peer mode");
  add_time_to_target_flags(time_to_target, target_options.get());
  time_to_target->callback([target_options, exit_code] {
    *exit_code = run_time_to_target_command(*target_options);
  });
  auto simulate_options = std::make_shared<SimulateRunsOptions>();
  CLI::App* simulate_runs = bench->add_subcommand(
      "simulate-runs", "Each finished `swarm local` run (with --emulated-device) beside the simulator's model of it");
  simulate_runs->add_option("run_dirs", simulate_options->run_dirs, "The runs' --run-dir directories")->required();
  simulate_runs->add_option("--warmup-steps", simulate_options->warmup_steps, "Steps left out of the real step time")
      ->capture_default_str();
  simulate_runs->add_flag("--print-commands", simulate_options->print_commands,
                          "Print each run's `swarm sim` command line under its row");
  simulate_runs->callback([simulate_options, exit_code] { *exit_code = run_simulate_runs_command(*simulate_options); });
}

}  // namespace swarm::apps
