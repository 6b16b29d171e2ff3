// main: a program for one's own model, with every role and command of `swarm`.
//
//   #include "apps/cli/main.h"
//   int main(int argc, char** argv) { return swarm::cli::main<Classifier>(argc, argv); }
//
//   classifier local --steps 200                # the whole swarm on this machine
//   classifier peer --bootstrap HOST:PORT       # one peer of a swarm across machines
//
// The model is a swarm::cli::Model (apps/cli/model.h). The program starts its
// own binary for the peers of `local`, so the model must be the same in each.
#pragma once

#include <filesystem>
#include <string>

#include "apps/cli/model.h"
#include "apps/program.h"

namespace swarm::cli {

// `extra`: commands beside the roles (the built-in GPT's train, generate, sim, bench).
template <Model M>
int main(int argc, char** argv, const apps::ExtraCommands& extra = {}) {
  const std::string program = argc > 0 ? std::filesystem::path(argv[0]).filename().string() : "swarm";
  return apps::run_program(argc, argv, &make_plugin<M>,
                           fmt::format("{}: SWARM-parallel training of the {} model", program, M::name), extra);
}

}  // namespace swarm::cli
