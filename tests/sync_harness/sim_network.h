// sim_network: the messages in flight between the peers of a stage, in time order.
//
// Passive: the harness pushes flights and pops the due ones; what a delivery
// means (decode, receive, reply) is the harness's. Ties in time go by push order,
// so one seed gives one order of events.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <queue>
#include <set>
#include <vector>

#include "swarm/averaging/round_group.h"
#include "swarm/core/random.h"
#include "swarm/core/status.h"

namespace swarm::sync {

// A fault on the messages it matches, while start <= now < end.
struct FaultRule {
  std::optional<RoundOp> op;  // any op when unset
  int phase = -1;             // PART phase 0 or 1; -1 any
  int from = -1, to = -1;     // peer index; -1 any
  double start = 0, end = 1e300;
  double drop = 0;       // probability the message never arrives
  double duplicate = 0;  // probability it arrives twice
  double delay = 0;      // extra seconds, uniform in [delay, delay + jitter]
  double jitter = 0;
};

// What the rules make of one message.
struct FaultVerdict {
  bool drop = false;
  bool duplicate = false;
  double extra_delay = 0;
};

struct Flight {
  enum class Kind { deliver, reply, timeout };
  double due = 0;
  uint64_t seq = 0;
  Kind kind = Kind::deliver;
  int from = -1;  // -1: an outsider (injected); it gets no reply
  uint64_t from_incarnation = 0;
  int to = -1;
  std::shared_ptr<const Outgoing> out;
  double sent_at = 0;
  uint64_t call = 0;  // the call a reply or timeout ends; 0: nobody waits (a duplicate, an injection)
  Status status;      // reply
};

class SimNetwork {
 public:
  void push(Flight f);
  // The earliest flight due at or before `now`, if any.
  std::optional<Flight> pop_due(double now);
  uint64_t new_call() { return ++calls_; }
  // True the first time for `call`: a reply or a timeout, whichever comes first, ends it.
  bool resolve(uint64_t call) { return resolved_.insert(call).second; }
  size_t in_flight() const { return queue_.size(); }

  int add_rule(FaultRule rule);
  void clear_rules() { rules_.clear(); }
  bool needs_phase() const;
  FaultVerdict judge(RoundOp op, int phase, int from, int to, double now, SplitMix64& rng) const;

 private:
  struct Later {
    bool operator()(const Flight& a, const Flight& b) const {
      return a.due != b.due ? a.due > b.due : a.seq > b.seq;
    }
  };
  std::priority_queue<Flight, std::vector<Flight>, Later> queue_;
  uint64_t seq_ = 0;
  uint64_t calls_ = 0;
  std::set<uint64_t> resolved_;
  std::vector<FaultRule> rules_;
};

}  // namespace swarm::sync
