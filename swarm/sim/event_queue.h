// event_queue: the simulator's one clock, a queue of timed events.
//
// Events pop in (time, sequence number) order: two events at the same time pop in the
// order they were pushed, so a run never depends on how the heap breaks ties.
//
//   swarm::sim::EventQueue<MyEvent> q;
//   q.push(2.5, MyEvent{...});
//   while (!q.empty()) { auto [t, e] = q.pop(); ... }
#pragma once

#include <cstdint>
#include <queue>
#include <utility>
#include <vector>

namespace swarm::sim {

template <typename Payload>
class EventQueue {
 public:
  struct Timed {
    double time;
    Payload payload;
  };

  void push(double time, Payload payload) { heap_.push(Entry{time, next_sequence_++, std::move(payload)}); }

  Timed pop() {
    Entry top = heap_.top();
    heap_.pop();
    return Timed{top.time, std::move(top.payload)};
  }

  double next_time() const { return heap_.top().time; }
  bool empty() const { return heap_.empty(); }
  size_t size() const { return heap_.size(); }
  uint64_t pushed() const { return next_sequence_; }

 private:
  struct Entry {
    double time;
    uint64_t sequence;
    Payload payload;
  };
  // std::priority_queue is a max-heap: "less" here means "pops later".
  struct PopsLater {
    bool operator()(const Entry& a, const Entry& b) const {
      return a.time > b.time || (a.time == b.time && a.sequence > b.sequence);
    }
  };
  std::priority_queue<Entry, std::vector<Entry>, PopsLater> heap_;
  uint64_t next_sequence_ = 0;
};

}  // namespace swarm::sim
