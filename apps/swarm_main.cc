// The `swarm` command-line program: the built-in GPT through the model plug-in
// (apps/cli/main.h), with the commands only it has. Each mode is a subcommand:
//   swarm local      the whole swarm on this machine: registry, peer processes, trainers
//   swarm bootstrap  a registry (OpenDHT) node for swarms across machines
//   swarm peer       serve one stage of a model
//   swarm trainer    train through an existing swarm
//   swarm status     show a running swarm as its registry sees it (--json for scripts)
//   swarm train      train a GPT in one process (the reference for swarm runs)
//   swarm generate   sample text from a checkpoint
//   swarm report     write RUN_DIR/report.html: plots and tables of a run directory
//   swarm sim        a deterministic simulated swarm running the production policies
//   swarm bench      experiments measured against a model of the system (square-cube)
#include <cstdio>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "apps/bench/bench_command.h"
#include "apps/cli/main.h"
#include "apps/gpt_model.h"
#include "apps/local_training.h"
#include "apps/program.h"
#include "apps/sim/sim_command.h"

namespace {

int run_train(const swarm::apps::LocalTrainingOptions& options) {
  auto report = swarm::apps::train_locally(options, [](std::string_view line) {
    fmt::print("{}\n", line);
    std::fflush(stdout);
  });
  if (!report.is_ok()) {
    fmt::print(stderr, "swarm train: {}\n", report.status().to_string());
    return 1;
  }
  fmt::print("validation loss: {:.4f} -> {:.4f} nats/token after {} steps, {:.0f} tokens/s, {:.0f} s\n",
             report->first_validation_loss, report->final_validation_loss, report->steps_done,
             report->tokens_per_second, report->seconds);
  if (!report->sample.empty()) {
    fmt::print("sample:\n{}{}\n", options.sample_prompt, report->sample);
  }
  return 0;
}

// From a swarm train checkpoint, or (run_dir) a swarm local run's stage checkpoints.
swarm::Result<swarm::gpt::GptModel<swarm::CpuBackend>> generation_model(const std::string& checkpoint,
                                                                        const std::string& run_dir) {
  if (checkpoint.empty() == run_dir.empty()) {
    return swarm::invalid_argument("give a checkpoint of swarm train, or --run RUN_DIR of swarm local (one of them)");
  }
  if (!checkpoint.empty()) return swarm::apps::load_model(checkpoint);
  SWARM_ASSIGN_OR_RETURN(swarm::apps::SwarmRunModel run, swarm::apps::load_swarm_run(run_dir));
  fmt::print(stderr, "swarm generate: {} stages of {} at global steps {}\n", run.stage_steps.size(), run_dir,
             fmt::join(run.stage_steps, ", "));
  return std::move(run.model);
}

int run_generate(const std::string& checkpoint, const std::string& run_dir, const std::string& prompt, int length,
                 float temperature, uint64_t seed) {
  auto model = generation_model(checkpoint, run_dir);
  if (!model.is_ok()) {
    fmt::print(stderr, "swarm generate: {}\n", model.status().to_string());
    return 1;
  }
  auto text = swarm::apps::sample_text(*model, prompt, length, temperature, seed);
  if (!text.is_ok()) {
    fmt::print(stderr, "swarm generate: {}\n", text.status().to_string());
    return 1;
  }
  fmt::print("{}{}\n", prompt, *text);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // The options of the commands only the built-in GPT has; they live until main returns.
  swarm::apps::LocalTrainingOptions train;
  std::string checkpoint, prompt = "Q: ", generate_run;
  int length = 300;
  float temperature = 0.8f;
  uint64_t seed = 1;
  int sim_exit_code = 0, bench_exit_code = 0;
  CLI::App *train_cmd = nullptr, *generate_cmd = nullptr;
  swarm::apps::ExtraCommands extra;
  extra.add = [&](CLI::App& app) {
    train_cmd = app.add_subcommand("train", "Train a GPT in one process on the CPU backend");
    train_cmd->add_option("--data", train.data_path, "Text file or directory (default: the fortunes corpus)");
    train_cmd->add_flag("--gpt2-tokens", train.gpt2_tokens, "--data is an llm.c .bin file of GPT-2 tokens");
    train_cmd->add_option("--d-model", train.model.d_model, "Model width")->capture_default_str();
    train_cmd->add_option("--layers", train.model.n_layers, "Distinct Transformer blocks")->capture_default_str();
    train_cmd->add_option("--heads", train.model.n_heads, "Attention heads")->capture_default_str();
    train_cmd->add_option("--seq-len", train.model.max_seq_len, "Sequence length")->capture_default_str();
    train_cmd->add_option("--layer-repeat", train.model.layer_repeat, "Apply each block R times (layer sharing)")->capture_default_str();
    train_cmd->add_option("--batch", train.batch_size, "Sequences per step")->capture_default_str();
    train_cmd->add_option("--steps", train.steps, "Optimizer steps")->capture_default_str();
    train_cmd->add_option("--lr", train.peak_lr, "Peak learning rate")->capture_default_str();
    train_cmd->add_option("--warmup", train.warmup_steps, "Linear warm-up steps")->capture_default_str();
    train_cmd->add_option("--optimizer", train.optimizer, "adamw or lamb")->capture_default_str()
        ->check(CLI::IsMember({"adamw", "lamb"}));
    train_cmd->add_option("--weight-decay", train.weight_decay, "Decoupled weight decay")->capture_default_str();
    train_cmd->add_option("--clip", train.clip_norm, "Global gradient-norm clip (0: off)")->capture_default_str();
    train_cmd->add_option("--seed", train.seed, "Seed for weights, data order and sampling")->capture_default_str();
    train_cmd->add_option("--threads", train.threads, "CPU threads (0: all cores)")->capture_default_str();
    swarm::apps::add_compute_options(train_cmd, &train.compute);
    train_cmd->add_option("--eval-every", train.eval_every, "Steps between validation passes")->capture_default_str();
    train_cmd->add_option("--eval-windows", train.eval_windows, "Validation windows per pass")->capture_default_str();
    train_cmd->add_option("--log-every", train.log_every, "Steps between progress lines")->capture_default_str();
    train_cmd->add_option("--time-limit", train.time_limit_seconds, "Stop after this many seconds (0: none)")->capture_default_str();
    train_cmd->add_option("--checkpoint", train.checkpoint_path, "Write a checkpoint here");
    train_cmd->add_option("--resume", train.resume_path, "Continue from this checkpoint");
    train_cmd->add_option("--metrics", train.metrics_path, "Append JSON lines of metrics here");
    train_cmd->add_option("--sample-length", train.sample_length, "Bytes to sample at the end")->capture_default_str();

    generate_cmd = app.add_subcommand("generate", "Sample text from a checkpoint");
    generate_cmd->add_option("checkpoint", checkpoint, "Checkpoint written by swarm train");
    generate_cmd->add_option("--run", generate_run, "A swarm local run directory: its stage checkpoints, as one model");
    generate_cmd->add_option("--prompt", prompt, "Text to continue")->capture_default_str();
    generate_cmd->add_option("--length", length, "Bytes to generate")->capture_default_str();
    generate_cmd->add_option("--temperature", temperature, "Sampling temperature")->capture_default_str();
    generate_cmd->add_option("--seed", seed, "Sampling seed")->capture_default_str();
    swarm::apps::add_sim_command(app, &sim_exit_code);
    swarm::apps::add_bench_command(app, &bench_exit_code);
  };
  extra.run = [&](CLI::App& app) -> std::optional<int> {
    if (app.got_subcommand("sim")) return sim_exit_code;
    if (app.got_subcommand("bench")) return bench_exit_code;
    if (*train_cmd) return run_train(train);
    if (*generate_cmd) return run_generate(checkpoint, generate_run, prompt, length, temperature, seed);
    return std::nullopt;
  };
  return swarm::cli::main<swarm::apps::GptModel>(argc, argv, extra);
}
