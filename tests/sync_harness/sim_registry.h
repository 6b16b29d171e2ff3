// sim_registry: the stage's progress records as each reader sees them.
//
// Records keep their registry timestamps and expire after a TTL; a reader sees
// the registry as it was `delay` seconds ago (its own, changeable during a run),
// so one peer can lag its stage-mates or see nothing at all. Every record goes
// through to_json/from_json on the way in, as it would through a real registry.
#pragma once

#include <deque>
#include <map>
#include <string>
#include <vector>

#include "swarm/averaging/progress.h"
#include "swarm/core/random.h"

namespace swarm::sync {

// How one reader's gets go wrong.
struct ReaderFaults {
  double delay = 0;        // sees the registry as of now - delay
  bool blind = false;      // every get answers with no records at all
  double lost = 0;         // probability a get fails (the reader keeps what it knew)
  double slow = 0;         // probability a get answers from `slow_extra` further back
  double slow_extra = 1.0;
};

class SimRegistry {
 public:
  explicit SimRegistry(double ttl, double history_seconds) : ttl_(ttl), history_(history_seconds) {}

  // Stores `record` as published at `now`; false if it does not survive the JSON round trip.
  bool publish(ProgressRecord record, double now);
  // The newest unexpired record per peer as of `as_of`.
  std::vector<ProgressRecord> read(double as_of) const;
  // Forgets records no reader can see any more.
  void prune(double now);

 private:
  double ttl_;
  double history_;
  std::map<std::string, std::deque<ProgressRecord>> by_peer_;  // oldest first
};

}  // namespace swarm::sync
