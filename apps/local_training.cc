#include "apps/local_training.h"

#include "apps/local_training_impl.h"

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

}  // namespace swarm::apps
