#include "transports/zmq/connection_guard.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

namespace swarm {
namespace {

constexpr int kEvents = ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_CLOSED | ZMQ_EVENT_DISCONNECTED;
constexpr auto kPollInterval = std::chrono::milliseconds(100);

int64_t open_descriptors() {
  int64_t n = 0;
  if (DIR* dir = ::opendir("/proc/self/fd")) {
    while (::readdir(dir) != nullptr) ++n;
    ::closedir(dir);
  }
  return std::max<int64_t>(0, n - 2);  // "." and ".."
}

// The address and port of one end of a TCP socket; empty when fd is no socket now.
struct Endpoint {
  std::string host;
  int port = -1;
};
Endpoint endpoint_of(int fd, bool peer) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  const int got = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length)
                       : ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  if (got != 0) return {};
  char text[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&address);
    ::inet_ntop(AF_INET, &v4->sin_addr, text, sizeof(text));
    return {text, ntohs(v4->sin_port)};
  }
  if (address.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&address);
    ::inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof(text));
    return {text, ntohs(v6->sin6_port)};
  }
  return {};
}

int port_of(const std::string& endpoint) {
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos) return -1;
  try {
    return std::stoi(endpoint.substr(colon + 1));
  } catch (...) {
    return -1;
  }
}

std::string unique_monitor_endpoint() {
  static std::atomic<uint64_t> next{0};
  return fmt::format("inproc://swarm-connection-guard-{}", next.fetch_add(1));
}

}  // namespace

DescriptorBudget& process_descriptor_budget(int reserve) {
  static DescriptorBudget budget([reserve] {
    rlimit limit{};
    int64_t soft = 1 << 20;
    if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
      soft = static_cast<int64_t>(limit.rlim_cur);
    }
    return std::max<int64_t>(16, soft - reserve - open_descriptors());
  }());
  return budget;
}

ConnectionGuard::ConnectionGuard(zmq::context_t& context, zmq::socket_t& router, ConnectionLimits limits)
    : router_(router.handle()),
      events_(context, zmq::socket_type::pair),
      table_(limits, &process_descriptor_budget(limits.descriptor_reserve)) {
  const std::string endpoint = unique_monitor_endpoint();
  if (zmq_socket_monitor(router.handle(), endpoint.c_str(), kEvents) != 0) throw zmq::error_t();
  events_.connect(endpoint);
  thread_ = std::thread([this] { run(); });
}

ConnectionGuard::~ConnectionGuard() { stop(); }

void ConnectionGuard::stop() {
  if (stopped_) return;
  stopped_ = true;
  zmq_socket_monitor(router_, nullptr, 0);
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
  events_.close();
}

void ConnectionGuard::request_arrived(int fd) {
  std::lock_guard lock(mu_);
  table_.request_arrived(fd);
}

ConnectionCounts ConnectionGuard::counts() const {
  std::lock_guard lock(mu_);
  return table_.counts();
}

size_t ConnectionGuard::open_connections() const {
  std::lock_guard lock(mu_);
  return table_.open_connections();
}

bool ConnectionGuard::wait_for_open_connections(size_t count, std::chrono::steady_clock::time_point deadline) const {
  std::unique_lock lock(mu_);
  return closed_.wait_until(lock, deadline, [&] { return table_.open_connections() <= count; });
}

void ConnectionGuard::run() {
  while (!stopping_) {
    zmq::pollitem_t item{events_.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, kPollInterval);
    if (!(item.revents & ZMQ_POLLIN)) continue;
    // Each event: [uint16 event, uint32 value] and the endpoint (zmq_socket_monitor(3)).
    zmq::message_t head, endpoint;
    if (!events_.recv(head, zmq::recv_flags::dontwait)) continue;
    if (!head.more() || !events_.recv(endpoint, zmq::recv_flags::none)) continue;
    if (head.size() < 6) continue;
    uint16_t event = 0;
    uint32_t value = 0;
    std::memcpy(&event, head.data(), sizeof(event));
    std::memcpy(&value, static_cast<const char*>(head.data()) + 2, sizeof(value));
    on_event(event, static_cast<int>(value), endpoint.to_string());
  }
}

void ConnectionGuard::on_event(uint16_t event, int fd, const std::string& endpoint) {
  if (event != ZMQ_EVENT_ACCEPTED) {
    {
      std::lock_guard lock(mu_);
      table_.closed(fd);
    }
    closed_.notify_all();
    return;
  }
  // The event may come after libzmq closed the descriptor and the process reused
  // it: act only on a connection to this server's port.
  if (endpoint_of(fd, /*peer=*/false).port != port_of(endpoint)) return;
  const Endpoint source = endpoint_of(fd, /*peer=*/true);
  if (source.host.empty()) return;
  Admission admission;
  {
    std::lock_guard lock(mu_);
    admission = table_.accepted(fd, source.host);
  }
  if (admission != Admission::admitted) ::shutdown(fd, SHUT_RDWR);
}

}  // namespace swarm
