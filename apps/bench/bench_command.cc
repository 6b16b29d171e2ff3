#include "apps/bench/bench_command.h"

#include <cstdio>
#include <memory>

#include <fmt/core.h>

#include "apps/bench/square_cube.h"

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

}  // namespace

void add_bench_command(CLI::App& app, int* exit_code) {
  CLI::App* bench = app.add_subcommand("bench", "Experiments measured against a model of the system");
  bench->require_subcommand(1);
  auto options = std::make_shared<SquareCubeOptions>();
  CLI::App* square_cube = bench->add_subcommand(
      "square-cube", "One stage over an emulated WAN link: compute utilization against d_model and latency");
  add_square_cube_flags(square_cube, options.get());
  square_cube->callback([options, exit_code] { *exit_code = run_square_cube_command(*options); });
}

}  // namespace swarm::apps
