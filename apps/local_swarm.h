// local_swarm: `swarm local` and `swarm trainer`. Trains a GPT with SWARM
// parallelism: S stages x P peer processes over ZeroMQ on loopback, found
// through an OpenDHT registry, driven by trainers that route every hop with
// stochastic wiring. Writes a run directory (config.json, metrics.jsonl, peer
// logs) and shows a live progress line.
//
//   swarm::apps::LocalSwarmOptions options;   // 2 stages x 2 peers, fortunes
//   auto report = swarm::apps::run_local_swarm(options, print_line);
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "apps/swarm_roles.h"
#include "models/gpt/config.h"
#include "swarm/core/status.h"

namespace swarm::apps {

struct LocalSwarmOptions {
  std::string run_dir = "swarm-run";
  gpt::GptConfig model;  // defaults: d_model 128, 4 layers, 4 heads, seq 128
  int stages = 2;
  int peers_per_stage = 1;
  int trainers = 1;
  int steps = 500;
  int microbatch = 8;             // sequences per microbatch
  int microbatches_per_step = 4;  // a step: this many microbatches per trainer
  int in_flight = 4;              // microbatches each trainer keeps in flight
  uint64_t seed = 1;
  std::string chaos;              // see apps/chaos.h
  std::string data_path;          // empty: the fortunes corpus
  float learning_rate = 2e-3f;
  int warmup_steps = 20;          // of each peer's local optimizer steps
  int step_every_samples = 16;
  int max_batch = 1;              // peers batch up to this many concurrent forwards
  int eval_windows = 32;
  double forward_timeout_seconds = 10;
  double backward_timeout_seconds = 20;
  // Stop training after this many seconds even if steps remain (0: no limit).
  double time_limit_seconds = 0;
  // "STAGE:FACTOR": the first peer of STAGE runs FACTOR times slower (an
  // emulated slow machine, for routing experiments).
  std::string slow_peer;
  // Adds this many seconds per sample to every peer's work (x2.5 for backward),
  // so routing experiments measure the emulated speeds rather than CPU noise.
  double emulated_seconds_per_sample = 0;
  // `swarm trainer`: join an existing swarm through this DHT node instead of
  // starting one.
  std::string bootstrap;
};

struct LocalSwarmReport {
  int steps = 0;
  double seconds = 0;
  double first_loss = 0;
  double last_loss = 0;
  double validation_loss = 0;
  double tokens_per_second = 0;
  int64_t microbatches_started = 0;
  int64_t microbatches_completed = 0;
  int64_t microbatches_abandoned = 0;
  int64_t retries = 0;
};

using LineSink = std::function<void(std::string_view line, bool transient)>;

Result<LocalSwarmReport> run_local_swarm(const LocalSwarmOptions& options, const LineSink& print);

}  // namespace swarm::apps
