// hop_table: what a peer decides about the microbatches that pass through it
// peer to peer (docs/ARCHITECTURE.md, "Peer-to-peer hops"): which to take, whom
// its output went to, whom its input gradient goes back to, when to give one
// up and whom to blame, and what to answer when a trainer retries one.
//
// A forward arrives from a predecessor (a peer of the stage before, or the
// trainer at stage 0) and is answered at once. The peer keeps its input for
// the backward, computes, and offers the output to a peer of the next stage;
// that peer sends the output's gradient back here, and only that peer may.
// The backward's input gradient goes to the predecessor. A finished
// microbatch's input gradient is kept a while: a trainer that retries it
// (its path broke upstream of here) gets it again without this stage
// accumulating the samples twice. A retry of one still in progress here
// rebinds its backward to the new predecessor. A retry that comes after the
// replay window is a new microbatch here: the trainer's retries must end within
// it (replay_seconds is well past a microbatch's deadline).
//
// Pure: keys, peer names and the time (seconds) in, verdicts out; no clock, no
// I/O. The driver holds the tensors under the keys this table names.
//
//   HopTable table(/*last_stage=*/false, {});
//   if (table.offer_forward(key, "s0p1", deadline, now) == HopVerdict::accepted) { /* compute */ }
//   table.successor_accepted(key, "s2p0");                 // the next stage took the output
//   table.offer_backward(key, "s2p0", now);                // accepted: compute the backward
//   std::string to = table.backward_done(key, now);        // send the input gradient there
#pragma once

#include <algorithm>
#include <compare>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace swarm {

// A microbatch is its trainer's: ids are unique per trainer, not across them.
struct HopKey {
  std::string trainer;
  uint64_t microbatch = 0;
  auto operator<=>(const HopKey&) const = default;
};

struct HopLimits {
  // Microbatches in progress here, each holding its input for the backward;
  // a forward beyond them is answered busy.
  size_t max_held = 16;
  // Finished microbatches whose input gradient is kept for a retry.
  size_t max_finished = 64;
  double replay_seconds = 30;
  // Peers of the next stage offered one output before this peer drops it.
  int max_successor_tries = 3;
};

enum class HopVerdict {
  accepted,      // new here: compute it
  rebound,       // in progress here: its backward now returns to the new predecessor
  replay,        // finished here: send the kept input gradient to the new predecessor
  busy,          // no room: the sender tries another peer of this stage
  expired,       // its deadline has passed
  wrong_sender,  // a backward from a peer this one never sent the microbatch to
  unknown,       // a backward for no microbatch waiting for one here
};

struct HopCounts {
  int64_t accepted = 0;
  int64_t rebound = 0;
  int64_t replayed = 0;
  int64_t busy = 0;
  int64_t expired = 0;
  int64_t wrong_sender = 0;
  int64_t unknown = 0;
  int64_t no_successor = 0;      // dropped: every successor tried refused it
  int64_t silent_successor = 0;  // dropped: the successor took it and no backward came by the deadline
};

// What expire() tells the driver to do.
struct HopEvent {
  enum class Kind {
    dropped,    // past its deadline before its backward: free its input
    blame,      // as dropped, and `peer` (the successor) took it and never answered: ban it
    forgotten,  // a finished one's replay window closed: free its input gradient
  };
  Kind kind;
  HopKey key;
  std::string peer;
};

class HopTable {
 public:
  HopTable(bool last_stage, HopLimits limits) : last_stage_(last_stage), limits_(limits) {}

  HopVerdict offer_forward(const HopKey& key, const std::string& from, double deadline, double now) {
    if (!(deadline > now)) return count(HopVerdict::expired);
    if (auto it = entries_.find(key); it != entries_.end()) {
      Entry& entry = it->second;
      entry.predecessor = from;
      entry.deadline = std::max(entry.deadline, deadline);
      if (entry.state == State::finished) {
        entry.finished_at = now;  // the window restarts for this path
        return count(HopVerdict::replay);
      }
      return count(HopVerdict::rebound);
    }
    if (held_ >= limits_.max_held) return count(HopVerdict::busy);
    entries_.emplace(key, Entry{State::computing_forward, from, {}, {}, deadline, 0});
    ++held_;
    return count(HopVerdict::accepted);
  }

  // The next stage's peer `successor` accepted the output: the backward must come from it.
  bool successor_accepted(const HopKey& key, const std::string& successor) {
    Entry* entry = find(key, State::computing_forward);
    if (entry == nullptr || last_stage_) return false;
    entry->successor = successor;
    entry->tried.push_back(successor);
    entry->state = State::awaiting_backward;
    return true;
  }

  enum class AfterRefusal { try_another, dropped, not_offering };
  // `successor` refused the output or could not be reached: try another (not
  // one in tried()), or the microbatch is dropped; not_offering when it was
  // not being offered.
  AfterRefusal successor_refused(const HopKey& key, const std::string& successor) {
    Entry* entry = find(key, State::computing_forward);
    if (entry == nullptr || last_stage_) return AfterRefusal::not_offering;
    entry->tried.push_back(successor);
    if (static_cast<int>(entry->tried.size()) < limits_.max_successor_tries) return AfterRefusal::try_another;
    ++counts_.no_successor;
    release(key);
    return AfterRefusal::dropped;
  }

  // The successors already offered this output, for the router to exclude.
  std::vector<std::string> tried(const HopKey& key) const {
    auto it = entries_.find(key);
    return it == entries_.end() ? std::vector<std::string>{} : it->second.tried;
  }

  HopVerdict offer_backward(const HopKey& key, const std::string& from, double now) {
    auto it = entries_.find(key);
    if (it == entries_.end() || it->second.state != State::awaiting_backward) return count(HopVerdict::unknown);
    if (it->second.successor != from) return count(HopVerdict::wrong_sender);
    if (!(it->second.deadline > now)) {  // late, not silent: dropped without blame
      release(key);
      return count(HopVerdict::expired);
    }
    it->second.state = State::computing_backward;
    return HopVerdict::accepted;
  }

  // The backward ran (at the last stage: the fused forward and backward) and
  // was accumulated: returns whom its input gradient goes to; empty when the
  // microbatch is no longer here (it expired meanwhile).
  std::string backward_done(const HopKey& key, double now) {
    auto it = entries_.find(key);
    if (it == entries_.end()) return {};
    Entry& entry = it->second;
    const bool ready = entry.state == State::computing_backward ||
                       (last_stage_ && entry.state == State::computing_forward);
    if (!ready) return {};
    entry.state = State::finished;
    entry.finished_at = now;
    --held_;
    ++finished_;
    return entry.predecessor;
  }

  // The predecessor a finished microbatch's input gradient goes to now (after a replay).
  std::string predecessor(const HopKey& key) const {
    auto it = entries_.find(key);
    return it == entries_.end() ? std::string{} : it->second.predecessor;
  }

  // Drops what is past its deadline, forgets finished ones past their window
  // or beyond max_finished (oldest first), and says which to free.
  std::vector<HopEvent> expire(double now) {
    std::vector<HopEvent> events;
    for (auto it = entries_.begin(); it != entries_.end();) {
      Entry& entry = it->second;
      const bool in_progress = entry.state != State::finished;
      if (in_progress && !(entry.deadline > now)) {
        const bool silent = entry.state == State::awaiting_backward;
        events.push_back({silent ? HopEvent::Kind::blame : HopEvent::Kind::dropped, it->first,
                          silent ? entry.successor : std::string{}});
        if (silent) ++counts_.silent_successor;
        --held_;
        it = entries_.erase(it);
      } else if (!in_progress && !(entry.finished_at + limits_.replay_seconds > now)) {
        events.push_back({HopEvent::Kind::forgotten, it->first, {}});
        --finished_;
        it = entries_.erase(it);
      } else {
        ++it;
      }
    }
    while (finished_ > limits_.max_finished) {
      auto oldest = entries_.end();
      for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        if (it->second.state != State::finished) continue;
        if (oldest == entries_.end() || it->second.finished_at < oldest->second.finished_at) oldest = it;
      }
      events.push_back({HopEvent::Kind::forgotten, oldest->first, {}});
      --finished_;
      entries_.erase(oldest);
    }
    return events;
  }

  size_t held() const { return held_; }
  size_t finished() const { return finished_; }
  const HopCounts& counts() const { return counts_; }

 private:
  enum class State { computing_forward, awaiting_backward, computing_backward, finished };
  struct Entry {
    State state;
    std::string predecessor;
    std::string successor;
    std::vector<std::string> tried;
    double deadline;
    double finished_at;
  };

  Entry* find(const HopKey& key, State state) {
    auto it = entries_.find(key);
    return it == entries_.end() || it->second.state != state ? nullptr : &it->second;
  }

  void release(const HopKey& key) {
    if (entries_.erase(key) > 0) --held_;
  }

  HopVerdict count(HopVerdict verdict) {
    switch (verdict) {
      case HopVerdict::accepted: ++counts_.accepted; break;
      case HopVerdict::rebound: ++counts_.rebound; break;
      case HopVerdict::replay: ++counts_.replayed; break;
      case HopVerdict::busy: ++counts_.busy; break;
      case HopVerdict::expired: ++counts_.expired; break;
      case HopVerdict::wrong_sender: ++counts_.wrong_sender; break;
      case HopVerdict::unknown: ++counts_.unknown; break;
    }
    return verdict;
  }

  bool last_stage_;
  HopLimits limits_;
  std::map<HopKey, Entry> entries_;
  size_t held_ = 0;
  size_t finished_ = 0;
  HopCounts counts_;
};

}  // namespace swarm
