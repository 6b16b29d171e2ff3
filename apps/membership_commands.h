// membership_commands: `swarm keygen` and `swarm admit`, how a swarm's owner admits
// members (swarm/security/certificate.h), and the options every role takes to
// join a swarm with an owner.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "apps/swarm_access.h"

namespace swarm::apps {

// --owner-key, --identity, --certificate.
void add_membership_options(CLI::App* command, MembershipOptions* membership);

void add_keygen_command(CLI::App& app, int* exit_code);
void add_admit_command(CLI::App& app, int* exit_code);

}  // namespace swarm::apps
