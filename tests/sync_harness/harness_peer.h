// harness_peer: one peer process of the harness (internal to sync_harness*.cc).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tests/sync_harness/sync_harness.h"

namespace swarm::sync {

struct Harness::Peer {
  int index = 0;
  std::string id, address;
  uint64_t incarnation = 0;  // a restart is a new process: replies to the old one are lost
  bool alive = true;
  double stopped_until = -1;
  std::unique_ptr<StubReplica> replica;
  std::unique_ptr<StageRounds> rounds;
  ReaderFaults faults;
  std::map<std::string, ProgressRecord> known;  // its driver's records, newest per peer
  double next_publish = 0, next_read = 0;
  double rate = 0;  // samples per second fed to it lately
  int64_t fed_this_tick = 0;
  // A download: the donor is picked and its state taken at `pick_at`, loaded at `load_at`.
  std::optional<double> pick_at, load_at;
  std::optional<StubState> downloaded;
  std::vector<RoundEvent> events;
  std::function<void(ProgressRecord&)> lie;
};

}  // namespace swarm::sync
