// model: what a model gives the `swarm` program, so that a user's own main()
//
//   int main(int argc, char** argv) { return swarm::cli::main<Classifier>(argc, argv); }
//
// gets every role and command the built-in GPT has (local, peer, trainer,
// bootstrap, status, report, keygen, admit) with their flags: --secret, --host,
// chaos, rebalancing, codecs, the live view, metrics.jsonl, checkpoints and
// --resume. A model opts in with a tag and names, as static members:
//
//   struct Classifier {
//     using model_concept = swarm::cli::model_t;
//     static constexpr std::string_view name = "classifier";
//     using Stage = swarm::VariantStage<Trunk, Head>;          // one type, or a variant of several
//     static swarm::Result<Stage> make_stage(const Options&, int stage, uint64_t seed);
//     static swarm::Result<swarm::cli::Data<Points>> data(const Options&, const swarm::cli::DataPlan&);
//   };
//
// Refinements, each optional:
//   struct Options {...};                                     its options (default: none), JSON-serializable
//                                                             (nlohmann: to_json/from_json), and
//   static void add_options(CLI::App&, Options&);             their flags on local, trainer and peer
//                                                             (include <CLI/CLI.hpp> for them: this
//                                                             header leaves it out, to compile faster)
//   static Status prepare(Options&, int stages);              derive and check before any process starts
//   static nlohmann::json describe(const Options&);           config.json entries (default: "model": options)
//   static int serve(const apps::PeerServing&, const Options&);  serve its own way (the GPT: per --device)
//   static Status check_device(apps::ComputeBackend);          the devices it computes on (default: CPU fp32)
//
// A model without serve() computes on the CPU backend: its stages' own code. Its
// metrics besides the loss (accuracy, say) are its loss stage's: io_spec().metrics
// names them (swarm/api/stage.h), and metrics.jsonl, the final line and the report show them.
#pragma once

#include <concepts>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "apps/any_stage_serving.h"
#include "apps/compute_options.h"
#include "apps/model_plugin.h"
#include "swarm/api/data_source.h"
#include "swarm/api/stage.h"
#include "swarm/stages/any_stage.h"

namespace swarm::cli {

struct model_t {};

using apps::DataPlan;

// A model's data for one run: a source per trainer (plan.trainers of them) and
// the held-out microbatches evaluated at the end.
template <DataSource D>
struct Data {
  std::vector<D> sources;
  std::vector<Microbatch> validation;
  std::string loss_unit = "sample";         // losses are nats per this
  std::string validation_unit = "samples";  // what validation progress counts (rows)
  std::string rate_unit = "samples";        // what a Microbatch's units count (the rates' "samples/s")
};

// The options of a model that declares none.
struct NoOptions {
  friend void to_json(nlohmann::json& j, const NoOptions&) { j = nlohmann::json::object(); }
  friend void from_json(const nlohmann::json&, NoOptions&) {}
};

namespace model_detail {
template <typename M>
struct options_of {
  using type = NoOptions;
};
template <typename M>
  requires requires { typename M::Options; }
struct options_of<M> {
  using type = typename M::Options;
};
}  // namespace model_detail

template <typename M>
using OptionsOf = typename model_detail::options_of<M>::type;

template <typename M>
concept ServesItself = requires(const apps::PeerServing& serving, const OptionsOf<M>& options) {
  { M::serve(serving, options) } -> std::same_as<int>;
};

template <typename M>
concept MakesStages = requires(const OptionsOf<M>& options, int stage, uint64_t seed) {
  typename M::Stage;
  requires Stage<typename M::Stage>;
  { M::make_stage(options, stage, seed) } -> std::same_as<Result<typename M::Stage>>;
};

template <typename M>
concept Model = std::same_as<typename M::model_concept, model_t> &&
                std::convertible_to<decltype(M::name), std::string_view> &&
                std::default_initializable<OptionsOf<M>> &&
                requires(const OptionsOf<M>& options, const DataPlan& plan, nlohmann::json& json) {
                  json = options;
                  { M::data(options, plan) };
                } &&
                (ServesItself<M> || MakesStages<M>);

// The plug-in the program's roles drive, made from a Model type.
template <Model M>
class ModelPluginOf final : public apps::ModelPlugin {
 public:
  using Options = OptionsOf<M>;

  std::string name() const override { return std::string(M::name); }

  void add_options(CLI::App& command) override {
    if constexpr (requires { M::add_options(command, options_); }) M::add_options(command, options_);
  }

  Status prepare(int stages) override {
    if constexpr (requires { { M::prepare(options_, stages) } -> std::same_as<Status>; }) {
      return M::prepare(options_, stages);
    }
    return Status::ok();
  }

  nlohmann::json options_json() const override { return options_; }

  Status set_options_json(const nlohmann::json& options) override {
    try {
      options_ = options.get<Options>();
    } catch (const nlohmann::json::exception& e) {
      return invalid_argument("model options of {}: {}", M::name, e.what());
    }
    return Status::ok();
  }

  nlohmann::json describe() const override {
    if constexpr (requires { { M::describe(options_) } -> std::convertible_to<nlohmann::json>; }) {
      return M::describe(options_);
    }
    return {{"model", options_json()}};
  }

  Result<apps::ModelData> load_data(const DataPlan& plan) override {
    auto data = M::data(options_, plan);
    if (!data.is_ok()) return data.status();
    if (static_cast<int>(data->sources.size()) != plan.trainers) {
      return internal("model {} gave {} data sources for {} trainers", M::name, data->sources.size(), plan.trainers);
    }
    apps::ModelData erased;
    for (auto& source : data->sources) erased.sources.emplace_back(std::move(source));
    erased.validation = std::move(data->validation);
    erased.loss_unit = std::move(data->loss_unit);
    erased.validation_unit = std::move(data->validation_unit);
    erased.rate_unit = std::move(data->rate_unit);
    return erased;
  }

  Status check_device(apps::ComputeBackend backend) override {
    if constexpr (requires { { M::check_device(backend) } -> std::same_as<Status>; }) {
      return M::check_device(backend);
    }
    if (backend == apps::ComputeBackend::cpu_fp32) return Status::ok();
    return invalid_argument("model {} computes on the CPU (fp32) only, not {}", M::name, apps::describe(backend));
  }

  int serve(const apps::PeerServing& serving) override {
    if constexpr (ServesItself<M>) {
      return M::serve(serving, options_);
    } else {
      auto make = [options = options_](int stage, uint64_t seed) -> Result<AnyStage> {
        Result<typename M::Stage> made = M::make_stage(options, stage, seed);
        if (!made.is_ok()) return made.status();
        return AnyStage(std::move(made).value());
      };
      return apps::serve_cpu_stages(serving, name(), std::move(make));
    }
  }

 private:
  Options options_;
};

template <Model M>
std::unique_ptr<apps::ModelPlugin> make_plugin() {
  return std::make_unique<ModelPluginOf<M>>();
}

}  // namespace swarm::cli
