// model_plugin: the `swarm` program's roles (local, trainer, peer) ask a model
// for its options, its data and its stages through this one interface, so they
// compile once, as ordinary code, for every model. swarm::cli::main<M>
// (apps/cli/main.h) wraps a user's model type in it; the built-in GPT is one
// such model (apps/gpt_model.h).
//
// A run's model options travel as JSON: into each peer process `swarm local`
// starts (--model-options), and into config.json, from which --resume reads
// them back.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/compute_options.h"
#include "swarm/api/data_source.h"
#include "swarm/core/status.h"
#include "swarm/data/any_data_source.h"

namespace CLI {
class App;
}

namespace swarm::apps {

struct PeerServing;  // apps/peer_serving.h

// What the trainer side asks of a model's data.
struct DataPlan {
  int trainers = 1;          // one source each
  int microbatch = 8;        // samples per microbatch
  uint64_t seed = 1;
  int64_t start_step = 0;    // a resumed run: the step it resumes at, so it draws other batches
  int validation_samples = 32;
};

struct ModelData {
  std::vector<AnyDataSource> sources;  // one per trainer
  std::vector<Microbatch> validation;  // held out, evaluated at the end
  std::string loss_unit = "sample";    // losses are nats per this
  std::string validation_unit = "samples";  // what the validation's progress counts (rows)
  std::string rate_unit = "samples";        // what a microbatch's units count, per second in the rates
};

class ModelPlugin {
 public:
  virtual ~ModelPlugin() = default;

  virtual std::string name() const = 0;
  // The model's own flags, on `local`, `trainer` and `peer` alike.
  virtual void add_options(CLI::App& command) = 0;
  // Once the command line (or a resumed run's config) is in: derives what the
  // options imply and refuses what the stages would, before any process starts.
  virtual Status prepare(int stages) = 0;
  virtual nlohmann::json options_json() const = 0;
  virtual Status set_options_json(const nlohmann::json& options) = 0;
  // Entries of config.json that describe the model to readers of a run (the report).
  virtual nlohmann::json describe() const = 0;
  virtual Result<ModelData> load_data(const DataPlan& plan) = 0;
  // Whether this machine can compute the model's stages on `backend` (--device).
  virtual Status check_device(ComputeBackend backend) = 0;
  // `swarm peer` once it has joined: serves until a stop signal; the exit status.
  virtual int serve(const PeerServing& serving) = 0;
};

// A fresh plug-in for each command that takes model options.
using ModelPluginFactory = std::unique_ptr<ModelPlugin> (*)();

}  // namespace swarm::apps
