// A stranger's unfinished handshakes against a real CURVE server: raw TCP sockets
// from their own loopback address that never speak. The server keeps at most its
// per-source cap of them, shuts the rest down at once, closes the kept ones after
// the handshake timeout and counts both; a key holder is served throughout.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "transports/zmq/curve_keys.h"
#include "transports/zmq/zmq_transport.h"

namespace swarm {
namespace {

using namespace std::chrono_literals;

// A connected TCP socket from `source` to 127.0.0.1:port, or -1.
int open_from(const char* source, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in local{};
  local.sin_family = AF_INET;
  ::inet_pton(AF_INET, source, &local.sin_addr);
  sockaddr_in remote{};
  remote.sin_family = AF_INET;
  remote.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &remote.sin_addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof(local)) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&remote), sizeof(remote)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Whether the server ended this connection (end of stream or reset), without blocking.
bool ended(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  char byte;
  return ::recv(fd, &byte, 1, MSG_DONTWAIT) <= 0;
}

bool eventually(const std::function<bool()>& done, std::chrono::milliseconds within) {
  const auto until = std::chrono::steady_clock::now() + within;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

TEST_CASE("a stranger's unfinished handshakes are capped per source and timed out; a key holder is served") {
  auto keys = zmq_transport::shared_secret_security("guard test secret");
  REQUIRE(keys.is_ok());
  ServerOptions options;
  options.security = *keys;
  options.connections.handshake_timeout_ms = 1000;
  options.connections.max_unfinished_per_source = 32;
  auto server = ZmqTransport::bind("tcp://127.0.0.1:*", options);
  REQUIRE(server.is_ok());
  REQUIRE(server->serve([](const PeerIdentity&, wire::Frames f) { return f; }).is_ok());
  const int port = std::stoi(server->address().substr(server->address().rfind(':') + 1));

  constexpr int kStranger = 300;
  std::vector<int> sockets;
  for (int i = 0; i < kStranger; ++i) {
    const int fd = open_from("127.0.0.2", port);
    REQUIRE(fd >= 0);
    sockets.push_back(fd);
  }
  // All but the cap are shut down at once (well before the handshake timeout).
  const auto count_ended = [&] {
    int n = 0;
    for (int fd : sockets) n += ended(fd) ? 1 : 0;
    return n;
  };
  int shut = 0;
  CHECK(eventually([&] { return (shut = count_ended()) >= kStranger - 32; }, 800ms));
  const ConnectionCounts during = server->connection_counts();
  MESSAGE(shut << " of " << kStranger << " stranger connections ended before the handshake timeout: "
               << during.refused_source << " refused by the guard; " << server->open_connections() << " open");
  CHECK(during.refused_source > 0);
  CHECK(server->open_connections() <= 32);

  ClientOptions client_options;
  client_options.security = *keys;
  auto member = ZmqTransport::connect(server->address(), client_options);
  REQUIRE(member.is_ok());
  CHECK(member->call(wire::Frames{{"hi"}}, Clock::now() + 5s).get().is_ok());

  // The kept ones end with the handshake timeout, counted.
  CHECK(eventually([&] { return count_ended() == kStranger; }, 5s));
  CHECK(eventually([&] { return server->open_connections() == 1; }, 2s));  // the member's
  const ConnectionCounts after = server->connection_counts();
  MESSAGE("in the end: " << after.refused_source << " refused, " << after.unfinished_closed << " closed unfinished");
  CHECK(after.unfinished_closed > 0);
  CHECK(after.refused_source + after.unfinished_closed <= static_cast<uint64_t>(kStranger));
  CHECK(member->call(wire::Frames{{"again"}}, Clock::now() + 5s).get().is_ok());
  for (int fd : sockets) ::close(fd);
}

TEST_CASE("connection limits that cannot be honoured are refused at bind") {
  ServerOptions options;
  options.connections.handshake_timeout_ms = 0;
  CHECK(ZmqTransport::bind("tcp://127.0.0.1:*", options).status().code() == StatusCode::invalid_argument);
  options = {};
  options.connections.max_unfinished_per_source = 0;
  CHECK(ZmqTransport::bind("tcp://127.0.0.1:*", options).status().code() == StatusCode::invalid_argument);
}

}  // namespace
}  // namespace swarm
