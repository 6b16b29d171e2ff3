// connection_guard: a ZeroMQ server's watch over its TCP connections. A socket
// monitor reports each accepted and closed connection on the guard's own thread,
// which asks a ConnectionTable and shuts down (shutdown(2), never close: the
// descriptor stays libzmq's, which then sees the end of the stream and closes
// it) each connection the table refuses. The server's I/O thread tells it which
// connections delivered a request.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <zmq.hpp>

#include "swarm/api/transport.h"
#include "transports/zmq/connection_table.h"

namespace swarm {

// The process's budget for accepted connections: its open-files limit, less
// `reserve`, less what was open when the first server asked.
DescriptorBudget& process_descriptor_budget(int reserve);

class ConnectionGuard {
 public:
  // Watches `router` from before it binds; `context` is the router's.
  ConnectionGuard(zmq::context_t& context, zmq::socket_t& router, ConnectionLimits limits);
  ~ConnectionGuard();
  ConnectionGuard(const ConnectionGuard&) = delete;
  ConnectionGuard& operator=(const ConnectionGuard&) = delete;

  // A request arrived on this descriptor (ZMQ_SRCFD of one of its frames).
  void request_arrived(int fd);
  ConnectionCounts counts() const;
  size_t open_connections() const;
  // Whether at most `count` are open by `deadline` (woken by each close).
  bool wait_for_open_connections(size_t count, std::chrono::steady_clock::time_point deadline) const;
  // Before the router closes.
  void stop();

 private:
  void run();
  void on_event(uint16_t event, int fd, const std::string& endpoint);

  void* router_;
  zmq::socket_t events_;
  bool stopped_ = false;
  mutable std::mutex mu_;
  mutable std::condition_variable closed_;
  ConnectionTable table_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace swarm
