// swarm_sim: `swarm sim` on its own, for the simulator's tests and experiments.
#include <CLI/CLI.hpp>

#include "apps/sim/sim_command.h"

int main(int argc, char** argv) {
  CLI::App app{"swarm (simulator only)"};
  app.require_subcommand(1);
  int exit_code = 0;
  swarm::apps::add_sim_command(app, &exit_code);
  CLI11_PARSE(app, argc, argv);
  return exit_code;
}
