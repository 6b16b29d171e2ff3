// forward_ledger: the forwards a peer served, so that it accepts a backward only
// for one of them: the same caller, the same microbatch, the same input, once,
// while the forward is remembered.
//
// A member trainer once sent a stage backwards for microbatches it never forwarded,
// and each was added into the stage's gradients. A backward re-sends its input, so
// a peer could compute it for anyone; the ledger makes it compute it only for the
// caller that asked for that forward here. Pure: identities, ids, digests and the
// time in, a verdict out; no clock, no I/O.
//
// Bounded: each entry lives `lifetime_seconds`; one caller holds at most
// `per_caller` (a flood of forwards evicts only its own oldest); all callers
// together at most `total` (then the caller holding most loses its oldest).
//
//   ledger.record(from.id, microbatch, digest, now);            // a forward served
//   SWARM_RETURN_IF_ERROR(ledger.check(from.id, microbatch, digest, now));  // a backward
//   ledger.consume(from.id, microbatch);                        // it counted
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <unordered_map>

#include "swarm/core/status.h"

namespace swarm {

struct ForwardLedgerLimits {
  double lifetime_seconds = 120;
  size_t per_caller = 4096;
  size_t total = 65536;
};

struct ForwardLedgerCounts {
  int64_t unbound = 0;          // backwards for no forward of this caller remembered here
  int64_t other_input = 0;      // backwards whose input is not the forward's
  int64_t forgotten = 0;        // forwards evicted by the bounds before their backward
};

class ForwardLedger {
 public:
  explicit ForwardLedger(ForwardLedgerLimits limits = {}) : limits_(limits) {}

  void record(const std::string& caller, uint64_t microbatch, uint64_t input_digest, double now) {
    Forwards& forwards = callers_[caller];
    expire(forwards, now);
    auto [it, inserted] = forwards.entries.try_emplace(microbatch, Entry{input_digest, now});
    if (!inserted) {  // a retried forward: the newest input and time stand
      it->second = Entry{input_digest, now};
      forwards.order.push_back({microbatch, now});
      if (forwards.order.size() > 2 * limits_.per_caller) compact(forwards);
      return;
    }
    forwards.order.push_back({microbatch, now});
    ++size_;
    if (forwards.entries.size() > limits_.per_caller) evict_oldest(forwards);
    while (size_ > limits_.total) {
      auto most = largest();
      evict_oldest(most->second);
      if (most->second.entries.empty()) callers_.erase(most);
    }
  }

  // ok for a backward of a remembered forward of this caller with this input.
  Status check(const std::string& caller, uint64_t microbatch, uint64_t input_digest, double now) {
    auto found = callers_.find(caller);
    const Entry* entry = nullptr;
    if (found != callers_.end()) {
      expire(found->second, now);
      auto it = found->second.entries.find(microbatch);
      if (it != found->second.entries.end()) entry = &it->second;
    }
    if (entry == nullptr) {
      ++counts_.unbound;
      return permission_denied("a backward of microbatch {:016x} without its forward from this caller here", microbatch);
    }
    if (entry->input_digest != input_digest) {
      ++counts_.other_input;
      return permission_denied("a backward of microbatch {:016x} with another input than its forward", microbatch);
    }
    return Status::ok();
  }

  // The backward counted: the forward cannot bind another.
  void consume(const std::string& caller, uint64_t microbatch) {
    auto found = callers_.find(caller);
    if (found == callers_.end()) return;
    if (found->second.entries.erase(microbatch) > 0) --size_;
    if (found->second.entries.empty()) callers_.erase(found);
  }

  size_t size() const { return size_; }
  const ForwardLedgerCounts& counts() const { return counts_; }

 private:
  struct Entry {
    uint64_t input_digest = 0;
    double recorded_at = 0;
  };
  struct Forwards {
    std::unordered_map<uint64_t, Entry> entries;
    // Oldest first; an id recorded again (or consumed) leaves a stale mark,
    // skipped when reached.
    std::deque<std::pair<uint64_t, double>> order;
  };

  bool live(const Forwards& forwards, const std::pair<uint64_t, double>& mark) const {
    auto it = forwards.entries.find(mark.first);
    return it != forwards.entries.end() && it->second.recorded_at == mark.second;
  }

  void expire(Forwards& forwards, double now) {
    while (!forwards.order.empty()) {
      const auto mark = forwards.order.front();
      if (live(forwards, mark) && now - mark.second < limits_.lifetime_seconds) return;
      forwards.order.pop_front();
      if (live(forwards, mark)) {
        forwards.entries.erase(mark.first);
        --size_;
      }
    }
  }

  void evict_oldest(Forwards& forwards) {
    while (!forwards.order.empty()) {
      const auto mark = forwards.order.front();
      forwards.order.pop_front();
      if (!live(forwards, mark)) continue;
      forwards.entries.erase(mark.first);
      --size_;
      ++counts_.forgotten;
      return;
    }
  }

  std::map<std::string, Forwards>::iterator largest() {
    auto most = callers_.begin();
    for (auto it = callers_.begin(); it != callers_.end(); ++it) {
      if (it->second.entries.size() > most->second.entries.size()) most = it;
    }
    return most;
  }

  // Drops stale marks: a caller that re-records one id cannot grow its order.
  static void compact(Forwards& forwards) {
    std::deque<std::pair<uint64_t, double>> live_marks;
    for (const auto& mark : forwards.order) {
      auto it = forwards.entries.find(mark.first);
      if (it != forwards.entries.end() && it->second.recorded_at == mark.second) live_marks.push_back(mark);
    }
    forwards.order.swap(live_marks);
  }

  ForwardLedgerLimits limits_;
  std::map<std::string, Forwards> callers_;
  size_t size_ = 0;
  ForwardLedgerCounts counts_;
};

}  // namespace swarm
