#include "apps/gpt_model.h"

#include <cmath>
#include <memory>

#include <CLI/CLI.hpp>

#include "apps/compute_device.h"

#include "swarm/data/batch_sampler.h"
#include "swarm/data/split.h"
#include "swarm/data/token_dataset.h"

namespace swarm::apps {

void to_json(nlohmann::json& json, const GptOptions& options) {
  json = {{"model", nlohmann::json::parse(options.model.to_json())},
          {"data", options.data_path},
          {"gpt2_tokens", options.gpt2_tokens}};
  if (options.emulated_device_flops > 0) json["emulated_device_flops"] = options.emulated_device_flops;
}

void from_json(const nlohmann::json& json, GptOptions& options) {
  auto model = gpt::GptConfig::from_json(json.at("model").dump());
  if (!model.is_ok()) throw nlohmann::json::other_error::create(501, model.status().message(), &json);
  options.model = *model;
  options.data_path = json.value("data", std::string());
  options.gpt2_tokens = json.value("gpt2_tokens", false);
  options.emulated_device_flops = json.value("emulated_device_flops", 0.0);
}

void GptModel::add_options(CLI::App& command, Options& options) {
  gpt::GptConfig& model = options.model;
  command.add_option("--d-model", model.d_model, "Model width")->capture_default_str();
  command.add_option("--layers", model.n_layers, "Distinct Transformer blocks")->capture_default_str();
  command.add_option("--heads", model.n_heads, "Attention heads")->capture_default_str();
  command.add_option("--seq-len", model.max_seq_len, "Sequence length")->capture_default_str();
  command.add_option("--layer-repeat", model.layer_repeat, "Apply each block R times (layer sharing)")
      ->capture_default_str();
  command.add_option("--vocab", model.vocab_size, "Vocabulary size")->capture_default_str();
  command.add_option_function<std::string>(
      "--boundary",
      [&model](const std::string& text) {
        auto layers = gpt::parse_boundary_layers(text);
        if (!layers.is_ok()) throw CLI::ValidationError("--boundary", layers.status().message());
        model.boundaries = std::move(*layers);
      },
      "Boundary layers between stages: none, bottleneck:K or maxout:K (K 2 or 4), one for all boundaries or one "
      "per boundary, comma-separated");
  command.add_option("--data", options.data_path, "Text file or directory (default: the fortunes corpus)");
  command.add_flag("--gpt2-tokens", options.gpt2_tokens,
                   "--data is an llm.c .bin file of GPT-2 tokens; the model's vocabulary becomes 50257");
  command.add_option("--emulated-device", options.emulated_device_flops,
                     "FLOP/s of an emulated device (e.g. 25e12, a T4): peers compute nothing and wait each "
                     "stage's FLOPs at this rate, sending real tensors of the true shapes, so that links, not "
                     "this CPU, set the pace. For link experiments: the run's losses are not a model's");
}

Status GptModel::prepare(Options& options, int stages) {
  if (options.gpt2_tokens) {
    if (options.data_path.empty()) {
      return invalid_argument("--gpt2-tokens needs --data FILE, an llm.c .bin file of GPT-2 tokens");
    }
    options.model.vocab_size = kGpt2VocabSize;
  }
  if (!(options.emulated_device_flops >= 0) || !std::isfinite(options.emulated_device_flops)) {
    return invalid_argument("--emulated-device must be a finite FLOP/s rate >= 0, got {}",
                            options.emulated_device_flops);
  }
  SWARM_RETURN_IF_ERROR(options.model.validate());
  return gpt::partition_layers(options.model, stages).status();
}

nlohmann::json GptModel::describe(const Options& options) {
  nlohmann::json described = {{"model", nlohmann::json::parse(options.model.to_json())},
                              {"data", options.data_path.empty() ? std::string(kDefaultCorpus) : options.data_path},
                              {"gpt2_tokens", options.gpt2_tokens}};
  if (options.emulated_device_flops > 0) described["emulated_device_flops"] = options.emulated_device_flops;
  return described;
}

namespace {

// A trainer's sampler over the training split the trainers share.
class SplitSampler {
 public:
  using data_source_concept = data_source_t;
  SplitSampler(std::shared_ptr<const DataSplit> split, BatchSampler sampler)
      : split_(std::move(split)), sampler_(std::move(sampler)) {}
  Result<Microbatch> next() { return sampler_.next(); }

 private:
  std::shared_ptr<const DataSplit> split_;  // the sampler reads its tokens
  BatchSampler sampler_;
};

}  // namespace

Result<cli::Data<AnyDataSource>> GptModel::data(const Options& options, const DataPlan& plan) {
  const std::string path = options.data_path.empty() ? std::string(kDefaultCorpus) : options.data_path;
  SWARM_ASSIGN_OR_RETURN(TokenDataset dataset, options.gpt2_tokens ? load_gpt2_bin(path) : load_text_bytes(path));
  if (dataset.vocab_size != options.model.vocab_size) {
    return invalid_argument("the data has vocabulary {}, the model {}", dataset.vocab_size, options.model.vocab_size);
  }
  const int seq = options.model.max_seq_len;
  SWARM_ASSIGN_OR_RETURN(DataSplit split, split_train_validation(dataset, 0.05, int64_t{16} * (seq + 1), plan.seed));
  auto shared = std::make_shared<const DataSplit>(std::move(split));
  cli::Data<AnyDataSource> data;
  SWARM_ASSIGN_OR_RETURN(auto windows, validation_windows(shared->validation, seq, plan.validation_samples));
  SWARM_ASSIGN_OR_RETURN(data.validation, window_microbatches(windows, 8));
  for (int t = 0; t < plan.trainers; ++t) {
    SWARM_ASSIGN_OR_RETURN(BatchSampler sampler,
                           BatchSampler::create(&shared->train, plan.microbatch, seq,
                                                plan.seed * 7919 + t + static_cast<uint64_t>(plan.start_step) * 104729));
    data.sources.emplace_back(SplitSampler(shared, std::move(sampler)));
  }
  data.loss_unit = options.gpt2_tokens ? "token" : "byte";
  data.validation_unit = "windows";
  data.rate_unit = "tokens";
  return data;
}

Status GptModel::check_device(ComputeBackend backend) { return ensure_compute_device(backend); }

int GptModel::serve(const PeerServing& serving, const Options& options) {
  const Result<ComputeBackend> backend = parse_compute(serving.options.compute);
  if (!backend.is_ok()) {
    fmt::print(stderr, "swarm peer: {}\n", backend.status().message());
    return 2;
  }
  if (options.emulated_device_flops > 0) {
    if (is_cuda(*backend)) {
      fmt::print(stderr, "swarm peer: --emulated-device computes nothing, so it takes no --device {}\n",
                 serving.options.compute.device);
      return 2;
    }
    return serve_gpt_emulated(serving, options.model, options.emulated_device_flops);
  }
  return is_cuda(*backend) ? serve_gpt_cuda(*backend, serving, options.model) : serve_gpt_cpu(serving, options.model);
}

}  // namespace swarm::apps
