// gpt_model: the built-in GPT as a model of the `swarm` program, through the
// same plug-in path as a user's (apps/cli/model.h): its options are the model's
// shape and its data (--d-model ... --boundary, --vocab, --data, --gpt2-tokens);
// its data a byte or GPT-2 token corpus split into training and validation
// windows; its peers serve GptStage on the backend --device chooses.
//
//   int main(int argc, char** argv) { return swarm::cli::main<swarm::apps::GptModel>(argc, argv); }
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "apps/cli/model.h"
#include "apps/peer_serving.h"
#include "models/gpt/config.h"

namespace swarm::apps {

struct GptOptions {
  gpt::GptConfig model;   // defaults: d_model 128, 4 layers, 4 heads, seq 128, bytes
  std::string data_path;  // empty: the fortunes corpus
  bool gpt2_tokens = false;  // data_path is an llm.c .bin file of GPT-2 tokens (vocabulary 50257)
  // > 0: peers do no arithmetic and wait FLOPs / this rate (models/emulated), for link
  // experiments at a faster device's pace; such a run's losses are not a model's.
  double emulated_device_flops = 0;
};
void to_json(nlohmann::json& json, const GptOptions& options);
void from_json(const nlohmann::json& json, GptOptions& options);

struct GptModel {
  using model_concept = cli::model_t;
  using Options = GptOptions;
  static constexpr std::string_view name = "gpt";

  static void add_options(CLI::App& command, Options& options);
  // --gpt2-tokens sets the vocabulary; the shape must split into `stages`.
  static Status prepare(Options& options, int stages);
  // "model" (the GptConfig, which the report and `generate --run` read), "data", "gpt2_tokens".
  static nlohmann::json describe(const Options& options);
  // Validation: the first validation_samples windows of the held-out split, 8 per microbatch.
  static Result<cli::Data<AnyDataSource>> data(const Options& options, const DataPlan& plan);
  static int serve(const PeerServing& serving, const Options& options);
  // The CPU, or a CUDA backend where a GPU is.
  static Status check_device(ComputeBackend backend);
};

static_assert(cli::Model<GptModel>);

// The CPU instantiation and the CUDA ones compile in their own translation
// units (gpt_serving_cpu.cc, gpt_serving_cuda.cc).
int serve_gpt_cpu(const PeerServing& serving, const gpt::GptConfig& model);
int serve_gpt_cuda(ComputeBackend backend, const PeerServing& serving, const gpt::GptConfig& model);
int serve_gpt_emulated(const PeerServing& serving, const gpt::GptConfig& model, double flops_per_second);

}  // namespace swarm::apps
