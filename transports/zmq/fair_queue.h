// fair_queue: requests waiting for a server's workers, taken in turn by caller.
//
// A ROUTER socket reads its connections fairly, but a server that drains it into
// one first-come queue undoes that: a caller that sends 100 requests at once puts
// every other caller's next request behind all 100. Here each caller has its own
// line and the workers take one request from each caller with requests waiting, in
// turn, so a flood delays another caller by at most one request per flooding
// caller. The total stays bounded by the server (max_queued_requests), and a
// caller holds an entry only while it has requests waiting.
//
//   FairQueue<Request> queue;
//   queue.push(caller_id, std::move(request));
//   if (!queue.empty()) serve(queue.pop());
#pragma once

#include <cstddef>
#include <deque>
#include <string>
#include <unordered_map>
#include <utility>

namespace swarm {

template <typename T>
class FairQueue {
 public:
  void push(const std::string& caller, T item) {
    auto line = lines_.try_emplace(caller).first;
    if (line->second.empty()) turns_.push_back(caller);
    line->second.push_back(std::move(item));
    ++size_;
  }

  // The next caller's oldest request. Not on an empty queue.
  T pop() {
    const std::string caller = std::move(turns_.front());
    turns_.pop_front();
    auto line = lines_.find(caller);
    T item = std::move(line->second.front());
    line->second.pop_front();
    if (line->second.empty()) {
      lines_.erase(line);
    } else {
      turns_.push_back(caller);  // its next request waits for everyone else's turn
    }
    --size_;
    return item;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  std::unordered_map<std::string, std::deque<T>> lines_;
  std::deque<std::string> turns_;  // callers with requests waiting, in the order they are served
  size_t size_ = 0;
};

}  // namespace swarm
