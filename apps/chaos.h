// chaos: scheduled faults for `swarm local --chaos`, parsed into a plan.
//
//   kill-peer:STAGE:AT_SECONDS              SIGKILL one live peer of STAGE at AT
//   stop-peer:STAGE:AT_SECONDS:FOR_SECONDS  SIGSTOP it at AT, SIGCONT it FOR later
//   restart-peer:STAGE:AT_SECONDS           start a new peer for STAGE at AT
// Several faults are separated by commas.
//
//   auto plan = swarm::apps::parse_chaos("kill-peer:1:20,restart-peer:1:40", /*stages=*/2);
#pragma once

#include <string>
#include <vector>

#include "swarm/core/status.h"

namespace swarm::apps {

struct ChaosAction {
  enum class Kind { kill_peer, stop_peer, continue_peer, restart_peer };
  Kind kind;
  int stage = 0;
  double at_seconds = 0;
  int group = 0;  // a stop and its continue share a group, so the same process is resumed
};

// Sorted by time. Errors name the bad item and say what was expected.
Result<std::vector<ChaosAction>> parse_chaos(const std::string& spec, int num_stages);

const char* chaos_kind_name(ChaosAction::Kind kind);

}  // namespace swarm::apps
