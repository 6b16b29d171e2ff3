// local_training: train a GPT in one process (`swarm train`), on the CPU backend
// or, with --device cuda, on a CUDA one.
//
// The whole model runs as the composition of its stages, so this is the
// swarm's math without the network: the reference that swarm runs are compared
// against, and the quickest way to check that a configuration learns.
//
//   swarm::apps::LocalTrainingOptions options;          // small GPT on fortunes
//   auto report = swarm::apps::train_locally(options, [](std::string_view line) { puts(line.data()); });
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "apps/compute_options.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/gpt/config.h"
#include "models/gpt/gpt_model.h"
#include "swarm/core/status.h"
#include "swarm/optim/optimizer.h"

namespace swarm::apps {

struct LocalTrainingOptions {
  gpt::GptConfig model;                  // defaults: d_model 128, 4 layers, 4 heads, seq 128
  ComputeOptions compute;                // --device, --precision, --attention
  std::string data_path;                 // empty: the fortunes corpus
  bool gpt2_tokens = false;              // data_path is an llm.c .bin token file
  int batch_size = 16;
  int steps = 1200;
  float peak_lr = 2e-3f;
  int warmup_steps = 50;
  std::string optimizer = "adamw";       // or "lamb"
  float weight_decay = 0.01f;
  float clip_norm = 1.0f;
  uint64_t seed = 1;
  int threads = 0;                       // 0: all cores
  int eval_every = 100;
  int eval_windows = 32;                 // validation windows of max_seq_len tokens
  double time_limit_seconds = 0;         // 0: none; stops early, still evaluates and samples
  std::string checkpoint_path;           // written at the end (and every eval) when set
  std::string resume_path;               // continue from this checkpoint
  std::string metrics_path;              // JSON lines, one per eval and per logged step
  int sample_length = 300;
  std::string sample_prompt = "Q: ";
  int log_every = 20;
};

struct TrainingReport {
  int steps_done = 0;
  double first_validation_loss = 0;
  double final_validation_loss = 0;
  double tokens_per_second = 0;
  double seconds = 0;
  std::vector<std::pair<int, double>> validation_curve;  // (step, loss)
  std::string sample;
};

using ProgressSink = std::function<void(std::string_view line)>;

// Fails at once (unavailable, naming CUDA) when --device cuda finds no usable GPU.
Result<TrainingReport> train_locally(const LocalTrainingOptions& options, const ProgressSink& progress);
Result<TrainingReport> train_locally_on_cuda(ComputeBackend backend, const LocalTrainingOptions& options,
                                             const optim::OptimizerConfig& config, optim::Rule rule,
                                             const ProgressSink& progress);

// Samples `length` bytes after `prompt` from a byte-level model (vocab 256).
Result<std::string> sample_text(gpt::GptModel<CpuBackend>& model, std::string_view prompt,
                                int length, float temperature, uint64_t seed);

// Loads a model written by train_locally's checkpoint.
Result<gpt::GptModel<CpuBackend>> load_model(const std::string& checkpoint_path);

// The whole model of a `swarm local` run, assembled from its stage checkpoints
// (RUN_DIR/checkpoints/stage-S.ckpt, shaped by RUN_DIR/config.json), and the
// global step each stage's checkpoint holds: stages checkpoint on their own, so
// the steps may differ by a few.
struct SwarmRunModel {
  gpt::GptModel<CpuBackend> model;
  std::vector<int64_t> stage_steps;
};
Result<SwarmRunModel> load_swarm_run(const std::string& run_dir);

}  // namespace swarm::apps
