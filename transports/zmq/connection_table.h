// connection_table: which of a server's TCP connections a stranger may hold, decided
// without I/O or threads, so a test steps it by hand.
//
// A stranger that opens connections and never finishes the CURVE handshake costs a
// peer a descriptor and libzmq's buffers each: 20,000 of them filled one peer's
// descriptor table and its checkpoints failed. libzmq has no cap of its own (a
// ROUTER cannot drop one connection; ZMQ_HANDSHAKE_IVL only ends each one late), so
// the server's connection guard asks this table at every accept and shuts down the
// connections it refuses:
//   - per source address, at most `max_unfinished_per_source` connections that have
//     not yet delivered a request (an unfinished handshake looks like that);
//   - in all, a descriptor budget shared by every server of the process, so room is
//     left for checkpoints, logs and the process's own clients.
// A connection is finished once a request arrived on it, and then counts only
// against the budget. Processes on one host share its address, so the per-source
// cap must exceed the connections one host's honest processes open at once.
//
//   ConnectionTable table(limits, &budget);
//   if (table.accepted(fd, "127.0.0.2") != Admission::admitted) shutdown(fd, SHUT_RDWR);
//   table.request_arrived(fd);        // the I/O thread, per request
//   table.closed(fd);                 // counts one closed unfinished
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>

#include "swarm/api/transport.h"

namespace swarm {

// Descriptors a process may spend on accepted connections, across its servers.
class DescriptorBudget {
 public:
  explicit DescriptorBudget(int64_t limit) : limit_(limit) {}
  bool try_take() {
    int64_t used = used_.load();
    while (used < limit_) {
      if (used_.compare_exchange_weak(used, used + 1)) return true;
    }
    return false;
  }
  void give_back() { used_.fetch_sub(1); }
  int64_t used() const { return used_.load(); }
  int64_t limit() const { return limit_; }

 private:
  const int64_t limit_;
  std::atomic<int64_t> used_{0};
};

enum class Admission { admitted, refused_source, refused_budget };

struct ConnectionCounts {
  uint64_t refused_source = 0;        // over max_unfinished_per_source
  uint64_t refused_budget = 0;        // over the process's descriptor budget
  // Closed before delivering a request: handshakes that timed out or failed, and
  // clients that gave up. (The guard learns of an accept late, so it cannot tell a
  // timeout from an early close by the clock.)
  uint64_t unfinished_closed = 0;
};

class ConnectionTable {
 public:
  ConnectionTable(ConnectionLimits limits, DescriptorBudget* budget) : limits_(limits), budget_(budget) {}
  ~ConnectionTable() {
    for (size_t i = 0; i < open_.size(); ++i) budget_->give_back();
  }
  ConnectionTable(const ConnectionTable&) = delete;
  ConnectionTable& operator=(const ConnectionTable&) = delete;

  Admission accepted(int fd, const std::string& source) {
    closed(fd);  // an fd libzmq reused before its close reached us
    if (unfinished_by_source_[source] >= limits_.max_unfinished_per_source) {
      ++counts_.refused_source;
      return Admission::refused_source;
    }
    if (!budget_->try_take()) {
      ++counts_.refused_budget;
      return Admission::refused_budget;
    }
    open_[fd] = Connection{source, false};
    ++unfinished_by_source_[source];
    return Admission::admitted;
  }

  void request_arrived(int fd) {
    auto it = open_.find(fd);
    if (it == open_.end() || it->second.finished) return;
    it->second.finished = true;
    release_unfinished(it->second.source);
  }

  void closed(int fd) {
    auto it = open_.find(fd);
    if (it == open_.end()) return;
    if (!it->second.finished) {
      ++counts_.unfinished_closed;
      release_unfinished(it->second.source);
    }
    open_.erase(it);
    budget_->give_back();
  }

  size_t open_connections() const { return open_.size(); }
  int64_t unfinished_from(const std::string& source) const {
    auto it = unfinished_by_source_.find(source);
    return it == unfinished_by_source_.end() ? 0 : it->second;
  }
  const ConnectionCounts& counts() const { return counts_; }

 private:
  struct Connection {
    std::string source;
    bool finished = false;
  };

  void release_unfinished(const std::string& source) {
    auto it = unfinished_by_source_.find(source);
    if (it != unfinished_by_source_.end() && --it->second <= 0) unfinished_by_source_.erase(it);
  }

  const ConnectionLimits limits_;
  DescriptorBudget* budget_;
  std::unordered_map<int, Connection> open_;
  std::map<std::string, int64_t> unfinished_by_source_;
  ConnectionCounts counts_;
};

}  // namespace swarm
