// A stranger's unfinished handshakes against a real CURVE server: raw TCP sockets
// from their own loopback address that never speak. The server keeps at most its
// per-source cap of them, shuts the rest down at once, closes the kept ones after
// the handshake timeout and counts both; a key holder is served throughout.
#include <unistd.h>

#include <poll.h>

#include <chrono>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "tests/transports/zmq/stranger_socket.h"
#include "transports/zmq/curve_keys.h"
#include "transports/zmq/zmq_transport.h"

namespace swarm {
namespace {

using namespace std::chrono_literals;
using test_sockets::ended;
using test_sockets::open_from;

// Blocks in poll(2) on the sockets not yet ended until `needed` of them have, or
// the deadline: each wake-up is an event on one of them.
bool wait_until_ended(const std::vector<int>& sockets, size_t needed, std::chrono::milliseconds within) {
  const auto until = std::chrono::steady_clock::now() + within;
  std::vector<int> pending = sockets;
  while (true) {
    std::erase_if(pending, [](int fd) { return ended(fd); });
    if (sockets.size() - pending.size() >= needed) return true;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    std::vector<pollfd> fds;
    for (int fd : pending) fds.push_back({fd, POLLIN, 0});
    ::poll(fds.data(), fds.size(), static_cast<int>(left.count()));
  }
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
  CHECK(wait_until_ended(sockets, kStranger - 32, 800ms));
  const ConnectionCounts during = server->connection_counts();
  MESSAGE("at least " << kStranger - 32 << " of " << kStranger << " stranger connections ended before the handshake timeout: "
               << during.refused_source << " refused by the guard; " << server->open_connections() << " open");
  CHECK(during.refused_source > 0);
  CHECK(server->open_connections() <= 32);

  ClientOptions client_options;
  client_options.security = *keys;
  auto member = ZmqTransport::connect(server->address(), client_options);
  REQUIRE(member.is_ok());
  CHECK(member->call(wire::Frames{{"hi"}}, Clock::now() + 5s).get().is_ok());

  // The kept ones end with the handshake timeout, counted.
  CHECK(wait_until_ended(sockets, kStranger, 5s));
  CHECK(server->wait_for_open_connections(1, Clock::now() + 2s));  // the member's
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
