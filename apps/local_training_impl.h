// local_training_impl: swarm train as a template over the backend; included by
// the translation units that instantiate it (local_training.cc for the CPU,
// local_training_cuda.cc for CUDA).
#pragma once

#include <chrono>
#include <cmath>
#include <fstream>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "apps/compute_options.h"
#include "apps/local_training.h"
#include "kernels/cpu/ops.h"
#include "swarm/checkpoint/checkpoint.h"
#include "swarm/data/batch_sampler.h"
#include "swarm/data/split.h"
#include "swarm/data/token_dataset.h"
#include "swarm/optim/lr_schedule.h"
#include "swarm/optim/optimizer.h"
#include "swarm/peer/replica.h"

namespace swarm::apps::training_detail {

// Samples `length` bytes after `prompt` from a byte-level model.
template <typename Model>
Result<std::string> sample_from(Model& model, std::string_view prompt, int length, float temperature, uint64_t seed) {
  const gpt::GptConfig& config = model.config();
  if (config.vocab_size != 256) return failed_precondition("sampling text needs a byte-level model");
  if (temperature <= 0) return invalid_argument("temperature must be positive");
  std::string text(prompt);
  if (text.empty()) text = "\n";
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  auto uniform = [&] {  // xorshift64*: portable and plenty for sampling
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return static_cast<double>((state * 0x2545f4914f6cdd1dull) >> 11) * (1.0 / 9007199254740992.0);
  };
  const int seq = config.max_seq_len;
  std::string generated;
  for (int i = 0; i < length; ++i) {
    const size_t context_start = text.size() > static_cast<size_t>(seq) ? text.size() - seq : 0;
    const int context = static_cast<int>(text.size() - context_start);
    Tensor tokens = *Tensor::empty(Shape{1, context}, DType::i32);
    for (int t = 0; t < context; ++t) {
      tokens.data<int32_t>()[t] = static_cast<unsigned char>(text[context_start + t]);
    }
    SWARM_ASSIGN_OR_RETURN(Tensor logits, model.logits(tokens));
    const float* last = logits.data<float>() + int64_t{context - 1} * config.vocab_size;
    float max_logit = last[0];
    for (int v = 1; v < config.vocab_size; ++v) max_logit = std::max(max_logit, last[v]);
    std::vector<double> weights(config.vocab_size);
    double total = 0;
    for (int v = 0; v < config.vocab_size; ++v) {
      weights[v] = std::exp((last[v] - max_logit) / temperature);
      total += weights[v];
    }
    double pick = uniform() * total;
    int chosen = config.vocab_size - 1;
    for (int v = 0; v < config.vocab_size; ++v) {
      pick -= weights[v];
      if (pick <= 0) {
        chosen = v;
        break;
      }
    }
    text.push_back(static_cast<char>(chosen));
    generated.push_back(static_cast<char>(chosen));
  }
  return generated;
}


using Clock = std::chrono::steady_clock;

template <typename Model>
std::vector<StageParameterView> parameter_views(Model& model) {
  std::vector<StageParameterView> views;
  for (gpt::Parameter* p : model.parameters()) views.push_back({p->name, p->value, p->grad, p->apply_weight_decay});
  return views;
}

template <typename Model>
Result<double> validation_loss(Model& model, const std::vector<TokenWindow>& windows, int seq_len) {
  if (windows.empty()) return invalid_argument("no validation windows");
  double total = 0;
  // Batches of up to 8 windows: fewer calls, same mean.
  constexpr int kEvalBatch = 8;
  for (size_t start = 0; start < windows.size(); start += kEvalBatch) {
    const int rows = static_cast<int>(std::min<size_t>(kEvalBatch, windows.size() - start));
    Tensor inputs = *Tensor::empty(Shape{rows, seq_len}, DType::i32);
    Tensor targets = *Tensor::empty(Shape{rows, seq_len}, DType::i32);
    for (int r = 0; r < rows; ++r) {
      std::copy(windows[start + r].inputs.begin(), windows[start + r].inputs.end(),
                inputs.data<int32_t>() + int64_t{r} * seq_len);
      std::copy(windows[start + r].targets.begin(), windows[start + r].targets.end(),
                targets.data<int32_t>() + int64_t{r} * seq_len);
    }
    SWARM_ASSIGN_OR_RETURN(float loss, model.loss(inputs, targets));
    total += static_cast<double>(loss) * rows;
  }
  return total / static_cast<double>(windows.size());
}

template <typename Model, typename Updater>
Status save(const std::string& path, Model& model, const Updater& optimizer, int step,
            const LocalTrainingOptions& options) {
  Checkpoint checkpoint;
  checkpoint.step = step;
  checkpoint.metadata["model_config"] = model.config().to_json();
  checkpoint.metadata["optimizer"] = options.optimizer;
  checkpoint.metadata["seed"] = std::to_string(options.seed);
  for (gpt::Parameter* p : model.parameters()) {
    SWARM_ASSIGN_OR_RETURN(Tensor host, Tensor::copy_of(p->value, Device::cpu));
    checkpoint.tensors.push_back({p->name, std::move(host)});
  }
  SWARM_ASSIGN_OR_RETURN(OptimizerState state, optimizer.export_state());
  for (auto& [name, tensor] : state) checkpoint.tensors.push_back({name, tensor});
  return save_checkpoint(path, checkpoint).with_context("saving checkpoint " + path);
}

// Copies parameter values by name; optimizer entries are returned for import.
template <typename Model>
Result<std::vector<std::pair<std::string, Tensor>>> restore_parameters(Model& model,
                                                                       const Checkpoint& checkpoint) {
  std::map<std::string, const Tensor*> by_name;
  for (const auto& entry : checkpoint.tensors) by_name[entry.name] = &entry.tensor;
  for (gpt::Parameter* p : model.parameters()) {
    auto it = by_name.find(p->name);
    if (it == by_name.end()) return data_loss("checkpoint lacks parameter {}", p->name);
    SWARM_RETURN_IF_ERROR(p->value.copy_from(*it->second).with_context(p->name));
    by_name.erase(it);
  }
  std::vector<std::pair<std::string, Tensor>> rest;
  for (const auto& entry : checkpoint.tensors) {
    if (by_name.count(entry.name)) rest.emplace_back(entry.name, entry.tensor);
  }
  return rest;
}

// swarm train on backend B, its parameters stepped by B's updater (the
// device's, or HostUpdater) under `rule`.
template <Backend B>
Result<TrainingReport> run(const LocalTrainingOptions& options, const optim::OptimizerConfig& optimizer_config,
                           optim::Rule rule, const ProgressSink& progress) {
  using Model = gpt::GptModel<B>;
  stage_updater_t<gpt::GptStage<B>> optimizer(optimizer_config, rule);
  const auto started = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - started).count(); };
  cpu::set_num_threads(options.threads);

  const std::string path = options.data_path.empty() ? std::string(kDefaultCorpus) : options.data_path;
  SWARM_ASSIGN_OR_RETURN(TokenDataset dataset,
                         options.gpt2_tokens ? load_gpt2_bin(path) : load_text_bytes(path));
  gpt::GptConfig config = options.model;
  config.vocab_size = dataset.vocab_size;
  SWARM_RETURN_IF_ERROR(config.validate());
  const int seq = config.max_seq_len;
  SWARM_ASSIGN_OR_RETURN(DataSplit split,
                         split_train_validation(dataset, 0.05, int64_t{16} * (seq + 1), options.seed));
  SWARM_ASSIGN_OR_RETURN(auto windows, validation_windows(split.validation, seq, options.eval_windows));
  SWARM_ASSIGN_OR_RETURN(BatchSampler sampler,
                         BatchSampler::create(&split.train, options.batch_size, seq, options.seed));
  progress(fmt::format("data: {} ({} tokens: {} train, {} validation), vocab {}", dataset.source,
                       dataset.tokens.size(), split.train.size(), split.validation.size(),
                       dataset.vocab_size));

  SWARM_ASSIGN_OR_RETURN(Model model, Model::create(config, 1, options.seed));
  progress(fmt::format("model: {} parameters, d_model {}, {} layers x{}, {} heads, seq {}; {}{}",
                       config.parameter_count(), config.d_model, config.n_layers, config.layer_repeat,
                       config.n_heads, seq, describe(*parse_compute(options.compute)),
                       B::device == Device::cpu ? fmt::format(", {} threads", cpu::num_threads()) : ""));

  int start_step = 0;
  if (!options.resume_path.empty()) {
    SWARM_ASSIGN_OR_RETURN(Checkpoint checkpoint, load_checkpoint(options.resume_path));
    auto saved_config = gpt::GptConfig::from_json(checkpoint.metadata["model_config"]);
    if (!saved_config.is_ok() || !(*saved_config == config)) {
      return invalid_argument("checkpoint {} holds a different model configuration", options.resume_path);
    }
    SWARM_ASSIGN_OR_RETURN(auto optimizer_state, restore_parameters(model, checkpoint));
    SWARM_RETURN_IF_ERROR(optimizer.import_state(optimizer_state).with_context("optimizer state"));
    start_step = static_cast<int>(checkpoint.step);
    // Skip the batches already seen, so a resumed run sees what an unbroken one would.
    std::vector<int32_t> skip(size_t(options.batch_size) * seq), skip_targets(skip.size());
    for (int s = 0; s < start_step; ++s) sampler.next(skip.data(), skip_targets.data());
    progress(fmt::format("resumed from {} at step {}", options.resume_path, start_step));
  }

  optim::LrSchedule schedule;
  schedule.peak_lr = options.peak_lr;
  schedule.warmup_steps = std::min(options.warmup_steps, std::max(0, options.steps - 1));
  schedule.total_steps = options.steps;
  SWARM_RETURN_IF_ERROR(schedule.validate());

  std::ofstream metrics;
  if (!options.metrics_path.empty()) {
    metrics.open(options.metrics_path, std::ios::app);
    if (!metrics) return permission_denied("cannot write metrics to {}", options.metrics_path);
  }
  auto write_metric = [&](nlohmann::json record) {
    if (!metrics.is_open()) return;
    record["time"] = elapsed();
    metrics << record.dump() << '\n';
    metrics.flush();
  };

  TrainingReport report;
  SWARM_ASSIGN_OR_RETURN(double first_val, validation_loss(model, windows, seq));
  report.first_validation_loss = first_val;
  report.validation_curve.emplace_back(start_step, first_val);
  progress(fmt::format("step {:5d} | validation loss {:.4f}", start_step, first_val));
  write_metric({{"kind", "eval"}, {"step", start_step}, {"validation_loss", first_val}});

  Tensor inputs = *Tensor::empty(Shape{options.batch_size, seq}, DType::i32);
  Tensor targets = *Tensor::empty(Shape{options.batch_size, seq}, DType::i32);
  const auto views = parameter_views(model);
  int64_t tokens_done = 0;
  double train_seconds = 0;
  int step = start_step;
  double window_loss = 0;
  int window_steps = 0;
  while (step < options.steps) {
    if (options.time_limit_seconds > 0 && elapsed() > options.time_limit_seconds) {
      progress(fmt::format("time limit of {:.0f} s reached at step {}", options.time_limit_seconds, step));
      break;
    }
    const auto step_start = Clock::now();
    sampler.next(inputs.data<int32_t>(), targets.data<int32_t>());
    SWARM_RETURN_IF_ERROR(model.zero_grad());
    SWARM_ASSIGN_OR_RETURN(float loss, model.forward_backward(inputs, targets));
    const float lr = schedule.lr_at(step + 1);
    SWARM_RETURN_IF_ERROR(optimizer.step(views, lr).with_context(fmt::format("step {}", step)));
    ++step;
    train_seconds += std::chrono::duration<double>(Clock::now() - step_start).count();
    tokens_done += int64_t{options.batch_size} * seq;
    window_loss += loss;
    ++window_steps;
    if (step % options.log_every == 0 || step == options.steps) {
      const double tokens_per_s = tokens_done / train_seconds;
      progress(fmt::format("step {:5d}/{} | loss {:.4f} | lr {:.2e} | {:.0f} tok/s | {:.0f} s", step,
                           options.steps, window_loss / window_steps, lr, tokens_per_s, elapsed()));
      write_metric({{"kind", "train"}, {"step", step}, {"loss", window_loss / window_steps},
                    {"lr", lr}, {"tokens_per_s", tokens_per_s}});
      window_loss = 0;
      window_steps = 0;
    }
    if (step % options.eval_every == 0 && step != options.steps) {
      SWARM_ASSIGN_OR_RETURN(double val, validation_loss(model, windows, seq));
      report.validation_curve.emplace_back(step, val);
      progress(fmt::format("step {:5d} | validation loss {:.4f}", step, val));
      write_metric({{"kind", "eval"}, {"step", step}, {"validation_loss", val}});
      if (!options.checkpoint_path.empty()) {
        SWARM_RETURN_IF_ERROR(save(options.checkpoint_path, model, optimizer, step, options));
        progress(fmt::format("checkpoint: {} (step {})", options.checkpoint_path, step));
      }
    }
  }
  SWARM_ASSIGN_OR_RETURN(double final_val, validation_loss(model, windows, seq));
  report.final_validation_loss = final_val;
  report.validation_curve.emplace_back(step, final_val);
  report.steps_done = step;
  report.tokens_per_second = train_seconds > 0 ? tokens_done / train_seconds : 0;
  progress(fmt::format("step {:5d} | validation loss {:.4f} (final)", step, final_val));
  write_metric({{"kind", "eval"}, {"step", step}, {"validation_loss", final_val}});
  if (!options.checkpoint_path.empty()) {
    SWARM_RETURN_IF_ERROR(save(options.checkpoint_path, model, optimizer, step, options));
    progress(fmt::format("checkpoint: {} (step {})", options.checkpoint_path, step));
  }
  if (options.sample_length > 0 && config.vocab_size == 256) {
    SWARM_ASSIGN_OR_RETURN(report.sample, sample_from(model, options.sample_prompt,
                                                      options.sample_length, 0.8f, options.seed));
  }
  report.seconds = elapsed();
  return report;
}

}  // namespace swarm::apps::training_detail
