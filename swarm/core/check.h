// check: SWARM_CHECK for broken invariants (programming errors), never for bad input.
//
// Bad input from a user or a peer gets a Status (status.h). A failed check means
// the program itself is wrong, so it prints file:line and aborts.
//
//   SWARM_CHECK(rank <= kMaxRank, "rank {} exceeds {}", rank, kMaxRank);
#pragma once

#include <fmt/core.h>

#include "swarm/core/status.h"

#define SWARM_CHECK(cond, ...)                                                        \
  do {                                                                                \
    if (!(cond)) [[unlikely]] {                                                       \
      ::swarm::fatal_error(__FILE__, __LINE__,                                        \
                           "check failed: " #cond " " __VA_OPT__(+ fmt::format(__VA_ARGS__))); \
    }                                                                                 \
  } while (0)
