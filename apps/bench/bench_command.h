// bench_command: `swarm bench`, experiments that measure the system against a
// model of it: `swarm bench square-cube --out DIR` and
// `swarm bench time-to-target --out DIR`.
//
//   CLI::App app{"swarm"};
//   int exit_code = 0;
//   swarm::apps::add_bench_command(app, &exit_code);
//   CLI11_PARSE(app, argc, argv);
//   return exit_code;
#pragma once

#include <CLI/CLI.hpp>

namespace swarm::apps {

// Adds `bench` and its subcommands; when one runs, *exit_code receives its
// result (0, 2 for bad flags, 1 for a failed run).
void add_bench_command(CLI::App& app, int* exit_code);

}  // namespace swarm::apps
