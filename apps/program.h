// program: the `swarm` program's commands over one model (apps/model_plugin.h):
// local, trainer, peer, bootstrap, status, report, keygen and admit, with every
// flag of theirs and the model's own. A program with more commands (the built-in
// GPT's train, generate, sim and bench) adds them through ExtraCommands.
// Users reach it through swarm::cli::main<M> (apps/cli/main.h).
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "apps/compute_options.h"
#include "apps/model_plugin.h"

namespace swarm::apps {

struct ExtraCommands {
  std::function<void(CLI::App& app)> add;
  // After parsing: the exit status of the extra command that ran, if one did.
  std::function<std::optional<int>(CLI::App& app)> run;
};

// Returns the process's exit status.
int run_program(int argc, char** argv, ModelPluginFactory make_model, const std::string& description,
                const ExtraCommands& extra = {});

// --device, --precision and --attention on a command.
void add_compute_options(CLI::App* command, ComputeOptions* compute);

}  // namespace swarm::apps
