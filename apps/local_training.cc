#include "apps/local_training.h"

#include "apps/compute_device.h"

#include "apps/local_training_impl.h"

#include <filesystem>

#include "swarm/peer/stage_state.h"

namespace swarm::apps {

Result<TrainingReport> train_locally(const LocalTrainingOptions& options, const ProgressSink& progress) {
  if (options.steps <= 0) return invalid_argument("steps must be positive, got {}", options.steps);
  if (options.batch_size <= 0) return invalid_argument("batch size must be positive");
  if (options.eval_every <= 0 || options.log_every <= 0) {
    return invalid_argument("eval and log intervals must be positive");
  }
  optim::OptimizerConfig config;
  config.weight_decay = options.weight_decay;
  config.clip_norm = options.clip_norm;
  SWARM_RETURN_IF_ERROR(config.validate());
  optim::Rule rule;
  if (options.optimizer == "adamw") {
    rule = optim::Rule::adamw;
  } else if (options.optimizer == "lamb") {
    rule = optim::Rule::lamb;
  } else {
    return invalid_argument("unknown optimizer \"{}\" (adamw or lamb)", options.optimizer);
  }
  SWARM_ASSIGN_OR_RETURN(ComputeBackend backend, parse_compute(options.compute));
  SWARM_RETURN_IF_ERROR(ensure_compute_device(backend));
  if (is_cuda(backend)) return train_locally_on_cuda(backend, options, config, rule, progress);
  return training_detail::run<CpuBackend>(options, config, rule, progress);
}

Result<std::string> sample_text(gpt::GptModel<CpuBackend>& model, std::string_view prompt, int length,
                                float temperature, uint64_t seed) {
  return training_detail::sample_from(model, prompt, length, temperature, seed);
}

Result<gpt::GptModel<CpuBackend>> load_model(const std::string& checkpoint_path) {
  SWARM_ASSIGN_OR_RETURN(Checkpoint checkpoint, load_checkpoint(checkpoint_path));
  auto it = checkpoint.metadata.find("model_config");
  if (it == checkpoint.metadata.end()) return data_loss("{} has no model configuration", checkpoint_path);
  SWARM_ASSIGN_OR_RETURN(gpt::GptConfig config, gpt::GptConfig::from_json(it->second));
  SWARM_ASSIGN_OR_RETURN(auto model, gpt::GptModel<CpuBackend>::create(config, 1, 0));
  SWARM_RETURN_IF_ERROR(training_detail::restore_parameters(model, checkpoint).status());
  return model;
}

Result<SwarmRunModel> load_swarm_run(const std::string& run_dir) {
  namespace fs = std::filesystem;
  std::ifstream in(fs::path(run_dir) / "config.json");
  if (!in) return not_found("{} holds no config.json: not a swarm local run directory", run_dir);
  const auto config = nlohmann::json::parse(in, nullptr, false);
  if (config.is_discarded() || !config.is_object() || !config.contains("model") || !config.contains("stages") ||
      !config.at("stages").is_number_integer()) {
    return data_loss("{}/config.json lacks the model or the stage count", run_dir);
  }
  SWARM_ASSIGN_OR_RETURN(gpt::GptConfig model_config, gpt::GptConfig::from_json(config.at("model").dump()));
  // Read as int64 first: get<int> of a larger number would wrap. partition_layers
  // then bounds it by the layer count.
  const int64_t stage_count = config.at("stages").get<int64_t>();
  if (stage_count < 1 || stage_count > model_config.n_layers) {
    return data_loss("{}/config.json: {} stages for {} layers", run_dir, stage_count, model_config.n_layers);
  }
  const int stages = static_cast<int>(stage_count);
  // The run's own split, so each stage's boundary layers sit where they trained.
  SWARM_ASSIGN_OR_RETURN(auto model, gpt::GptModel<CpuBackend>::create(model_config, stages, 0));
  SwarmRunModel run{std::move(model), {}};
  for (int s = 0; s < stages; ++s) {
    const std::string path = (fs::path(run_dir) / "checkpoints" / fmt::format("stage-{}.ckpt", s)).string();
    auto checkpoint = load_checkpoint(path);
    if (!checkpoint.is_ok()) {
      return not_found("stage {} of {} has no usable checkpoint {} ({}); runs write one every --checkpoint-every "
                       "global steps",
                       s, run_dir, path, checkpoint.status().message());
    }
    std::map<std::string, const Tensor*> by_name;
    for (const auto& entry : checkpoint->tensors) {
      if (entry.name.starts_with(kParamPrefix)) by_name[entry.name.substr(kParamPrefix.size())] = &entry.tensor;
    }
    for (gpt::Parameter& p : run.model.stages()[s].parameters()) {
      auto it = by_name.find(p.name);
      if (it == by_name.end()) return data_loss("{} lacks parameter {}", path, p.name);
      SWARM_RETURN_IF_ERROR(p.value.copy_from(*it->second).with_context(fmt::format("{}: {}", path, p.name)));
    }
    run.stage_steps.push_back(checkpoint->step);
  }
  return run;
}

}  // namespace swarm::apps
