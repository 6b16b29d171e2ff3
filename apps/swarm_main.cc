// The `swarm` command-line program. Each mode is a subcommand:
//   swarm train      train a GPT in one process (the reference for swarm runs)
//   swarm generate   sample text from a checkpoint
// The swarm roles (local, peer, trainer, bootstrap) arrive with the swarm runtime.
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "apps/local_training.h"

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

int run_generate(const std::string& checkpoint, const std::string& prompt, int length,
                 float temperature, uint64_t seed) {
  auto model = swarm::apps::load_model(checkpoint);
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
  CLI::App app{"swarm: SWARM-parallel training of Transformer language models"};
  app.require_subcommand(1);

  swarm::apps::LocalTrainingOptions train;
  CLI::App* train_cmd = app.add_subcommand("train", "Train a GPT in one process on the CPU backend");
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
  train_cmd->add_option("--eval-every", train.eval_every, "Steps between validation passes")->capture_default_str();
  train_cmd->add_option("--eval-windows", train.eval_windows, "Validation windows per pass")->capture_default_str();
  train_cmd->add_option("--log-every", train.log_every, "Steps between progress lines")->capture_default_str();
  train_cmd->add_option("--time-limit", train.time_limit_seconds, "Stop after this many seconds (0: none)")->capture_default_str();
  train_cmd->add_option("--checkpoint", train.checkpoint_path, "Write a checkpoint here");
  train_cmd->add_option("--resume", train.resume_path, "Continue from this checkpoint");
  train_cmd->add_option("--metrics", train.metrics_path, "Append JSON lines of metrics here");
  train_cmd->add_option("--sample-length", train.sample_length, "Bytes to sample at the end")->capture_default_str();

  std::string checkpoint, prompt = "Q: ";
  int length = 300;
  float temperature = 0.8f;
  uint64_t seed = 1;
  CLI::App* generate_cmd = app.add_subcommand("generate", "Sample text from a checkpoint");
  generate_cmd->add_option("checkpoint", checkpoint, "Checkpoint written by swarm train")->required();
  generate_cmd->add_option("--prompt", prompt, "Text to continue")->capture_default_str();
  generate_cmd->add_option("--length", length, "Bytes to generate")->capture_default_str();
  generate_cmd->add_option("--temperature", temperature, "Sampling temperature")->capture_default_str();
  generate_cmd->add_option("--seed", seed, "Sampling seed")->capture_default_str();

  CLI11_PARSE(app, argc, argv);
  if (*train_cmd) return run_train(train);
  if (*generate_cmd) return run_generate(checkpoint, prompt, length, temperature, seed);
  return 1;
}
