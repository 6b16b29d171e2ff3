// The ZeroMQ transport over real sockets on TCP loopback: round trips, many
// calls in flight, deadlines, cancellation, reconnection after a restart,
// CURVE authentication and encryption, and malformed traffic.
#include "transports/zmq/zmq_transport.h"

#include <zmq.hpp>

#include <atomic>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "tests/transports/zmq/tcp_relay.h"
#include "transports/zmq/curve_keys.h"

namespace swarm {
namespace {

using namespace std::chrono_literals;
using zmq_transport::derive_curve_keypair;
using zmq_transport::generate_curve_keypair;
using zmq_transport::shared_secret_security;

Deadline in(std::chrono::milliseconds ms) { return Clock::now() + ms; }

RequestHandler echo() {
  return [](const PeerIdentity&, wire::Frames frames) { return frames; };
}

ZmqServer serve_echo(ServerOptions options = {}) {
  auto server = ZmqTransport::bind("tcp://127.0.0.1:*", options);
  REQUIRE_MESSAGE(server.is_ok(), server.status().to_string());
  REQUIRE(server->serve(echo()).is_ok());
  return std::move(server).value();
}

ZmqClient connect_to(const std::string& address, ClientOptions options = {}) {
  auto client = ZmqTransport::connect(address, options);
  REQUIRE_MESSAGE(client.is_ok(), client.status().to_string());
  return std::move(client).value();
}

uint16_t port_of(const std::string& address) {
  return static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1)));
}

static_assert(Transport<ZmqTransport>);

TEST_CASE("a request with large tensor frames round-trips over TCP, counted on both sides") {
  ZmqServer server = serve_echo();
  ZmqClient client = connect_to(server.address());
  CHECK(server.address().starts_with("tcp://127.0.0.1:"));
  std::string tensor(4 << 20, '\0');
  for (size_t i = 0; i < tensor.size(); ++i) tensor[i] = static_cast<char>(i * 31);
  wire::Frames request{{std::string("header"), tensor, std::string(3, 'x')}};
  auto reply = client.call(std::move(request), in(10s)).get();
  REQUIRE_MESSAGE(reply.is_ok(), reply.status().to_string());
  REQUIRE(reply->parts.size() == 3);
  CHECK(reply->parts[0] == "header");
  CHECK(reply->parts[1] == tensor);
  CHECK(reply->parts[2] == "xxx");
  const uint64_t bytes = 6 + tensor.size() + 3;
  CHECK(client.counters().bytes_sent == bytes);
  CHECK(client.counters().bytes_received == bytes);
  CHECK(server.counters().bytes_received == bytes);
  CHECK(server.counters().messages_sent == 1);
}

TEST_CASE("a client that asks for an emulated link is refused: ZeroMQ runs over real ones") {
  ClientOptions options;
  options.link = EmulatedLink{.bandwidth_bytes_per_s = 1e6, .latency = std::chrono::milliseconds(50)};
  auto client = ZmqTransport::connect("tcp://127.0.0.1:1", options);
  CHECK(client.status().code() == StatusCode::invalid_argument);
  CHECK(client.status().message().find("NetemTransport<ZmqTransport>") != std::string::npos);
}

TEST_CASE("hundreds of calls in flight on one connection each get their own reply") {
  auto server = ZmqTransport::bind("tcp://127.0.0.1:*", {.worker_threads = 3});
  REQUIRE(server.is_ok());
  REQUIRE(server->serve([](const PeerIdentity&, wire::Frames f) {
    f.parts[0] = "re:" + f.parts[0];
    return f;
  }).is_ok());
  ZmqClient client = connect_to(server->address());
  std::atomic<int> matched{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::pair<std::string, Call>> calls;
      for (int i = 0; i < 50; ++i) {
        std::string id = std::to_string(t * 1000 + i);
        calls.emplace_back(id, client.call(wire::Frames{{id}}, in(20s)));
      }
      for (auto& [id, call] : calls) {
        auto reply = call.get();
        if (reply.is_ok() && reply->parts[0] == "re:" + id) ++matched;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(matched == 200);
}

TEST_CASE("a missed deadline completes the call, and the connection keeps working") {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  auto server = ZmqTransport::bind("tcp://127.0.0.1:*", {.worker_threads = 2});
  REQUIRE(server.is_ok());
  REQUIRE(server->serve([released](const PeerIdentity&, wire::Frames f) {
    if (f.parts[0] == "block") released.wait();
    return f;
  }).is_ok());
  ZmqClient client = connect_to(server->address());
  const auto deadline = in(200ms);
  auto blocked = client.call(wire::Frames{{"block"}}, deadline).get();
  CHECK(blocked.status().code() == StatusCode::deadline_exceeded);
  CHECK(Clock::now() >= deadline);
  release.set_value();
  auto later = client.call(wire::Frames{{"after"}}, in(10s)).get();
  REQUIRE(later.is_ok());
  CHECK(later->parts[0] == "after");
}

TEST_CASE("cancel completes a pending call with cancelled") {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  auto server = ZmqTransport::bind("tcp://127.0.0.1:*", {});
  REQUIRE(server.is_ok());
  REQUIRE(server->serve([released](const PeerIdentity&, wire::Frames f) {
    released.wait();
    return f;
  }).is_ok());
  ZmqClient client = connect_to(server->address());
  Call call = client.call(wire::Frames{{"wait"}}, in(30s));
  CHECK(client.cancel(call.id()).is_ok());
  CHECK(call.get().status().code() == StatusCode::cancelled);
  CHECK(client.cancel(call.id()).code() == StatusCode::not_found);
  release.set_value();
}

TEST_CASE("a client reaches a server restarted at the same address without reconnecting") {
  std::string address;
  ZmqClient* client_ptr = nullptr;
  std::optional<ZmqClient> client;
  {
    ZmqServer first = serve_echo();
    address = first.address();
    client.emplace(connect_to(address));
    client_ptr = &*client;
    auto reply = client_ptr->call(wire::Frames{{"one"}}, in(10s)).get();
    REQUIRE(reply.is_ok());
    first.stop();
  }
  auto second = ZmqTransport::bind(address, {});
  REQUIRE_MESSAGE(second.is_ok(), second.status().to_string());
  REQUIRE(second->serve(echo()).is_ok());
  auto reply = client_ptr->call(wire::Frames{{"two"}}, in(10s)).get();
  REQUIRE_MESSAGE(reply.is_ok(), reply.status().to_string());
  CHECK(reply->parts[0] == "two");
}

TEST_CASE("CURVE with a shared swarm secret: key holders are served, others are not") {
  auto security = shared_secret_security("a swarm-wide secret");
  REQUIRE(security.is_ok());
  std::atomic<int> served{0};
  std::string seen_identity;
  std::mutex mu;
  auto server = ZmqTransport::bind("tcp://127.0.0.1:*", {.worker_threads = 1, .security = *security});
  REQUIRE(server.is_ok());
  REQUIRE(server->serve([&](const PeerIdentity& from, wire::Frames f) {
    ++served;
    std::lock_guard lock(mu);
    seen_identity = from.id;
    return f;
  }).is_ok());

  ZmqClient member = connect_to(server->address(), {.security = *security});
  auto reply = member.call(wire::Frames{{"hello"}}, in(10s)).get();
  REQUIRE_MESSAGE(reply.is_ok(), reply.status().to_string());
  CHECK(served == 1);
  {
    std::lock_guard lock(mu);
    CHECK(seen_identity == "curve:" + security->keys.public_key);
  }

  // No keys at all: the plaintext handshake never completes.
  ZmqClient stranger = connect_to(server->address());
  CHECK(stranger.call(wire::Frames{{"let me in"}}, in(500ms)).get().status().code() ==
        StatusCode::deadline_exceeded);
  // Its own key pair and the server's public key: the allow-list refuses it.
  auto own = generate_curve_keypair();
  REQUIRE(own.is_ok());
  SecurityOptions impostor;
  impostor.curve = true;
  impostor.keys = *own;
  impostor.server_public_key = security->server_public_key;
  ZmqClient outsider = connect_to(server->address(), {.security = impostor});
  CHECK(outsider.call(wire::Frames{{"let me in"}}, in(500ms)).get().status().code() ==
        StatusCode::deadline_exceeded);
  // A different secret derives a different pair.
  auto wrong = shared_secret_security("another secret");
  ZmqClient guesser = connect_to(server->address(), {.security = *wrong});
  CHECK(guesser.call(wire::Frames{{"let me in"}}, in(500ms)).get().status().code() ==
        StatusCode::deadline_exceeded);

  CHECK(served == 1);
  CHECK(server->refused_handshakes() >= 1);
  // The member is still served after the failed attempts.
  CHECK(member.call(wire::Frames{{"again"}}, in(10s)).get().is_ok());
}

TEST_CASE("CURVE with per-peer key pairs and an allow-list") {
  auto server_keys = *generate_curve_keypair();
  auto alice = *generate_curve_keypair();
  auto mallory = *generate_curve_keypair();
  ServerOptions options;
  options.security.curve = true;
  options.security.keys = server_keys;
  options.security.allowed_client_keys = {alice.public_key};
  ZmqServer server = serve_echo(options);
  auto client_options = [&](const CurveKeyPair& keys) {
    ClientOptions o;
    o.security.curve = true;
    o.security.keys = keys;
    o.security.server_public_key = server_keys.public_key;
    return o;
  };
  ZmqClient allowed = connect_to(server.address(), client_options(alice));
  ZmqClient refused = connect_to(server.address(), client_options(mallory));
  CHECK(allowed.call(wire::Frames{{"hi"}}, in(10s)).get().is_ok());
  CHECK(refused.call(wire::Frames{{"hi"}}, in(500ms)).get().status().code() == StatusCode::deadline_exceeded);
  CHECK(server.refused_handshakes() >= 1);
  CHECK(derive_curve_keypair("").status().code() == StatusCode::invalid_argument);
  CHECK(derive_curve_keypair("s")->public_key == derive_curve_keypair("s")->public_key);
  CHECK(derive_curve_keypair("s", "a")->public_key != derive_curve_keypair("s", "b")->public_key);
}

TEST_CASE("with CURVE on, a payload never crosses the wire in plaintext") {
  const std::string marker = "PLAINTEXT-MARKER-0123456789";
  std::string payload;
  for (int i = 0; i < 200; ++i) payload += marker;
  auto captured_with = [&](bool curve) {
    ServerOptions server_options;
    ClientOptions client_options;
    if (curve) {
      auto security = *shared_secret_security("wire secret");
      server_options.security = security;
      client_options.security = security;
    }
    ZmqServer server = serve_echo(server_options);
    testing::TcpRelay relay(port_of(server.address()));
    ZmqClient client = connect_to("tcp://127.0.0.1:" + std::to_string(relay.port()), client_options);
    auto reply = client.call(wire::Frames{{payload}}, in(10s)).get();
    REQUIRE_MESSAGE(reply.is_ok(), reply.status().to_string());
    CHECK(reply->parts[0] == payload);
    return relay.captured();
  };
  std::string plain = captured_with(false);
  std::string encrypted = captured_with(true);
  CHECK(plain.find(marker) != std::string::npos);  // the relay does see plaintext traffic
  CHECK(encrypted.size() >= payload.size());
  CHECK(encrypted.find(marker) == std::string::npos);
  CHECK(encrypted.find("PLAINTEXT") == std::string::npos);
}

TEST_CASE("messages without a call id are counted and dropped; valid clients are still served") {
  ZmqServer server = serve_echo();
  zmq::context_t context;
  zmq::socket_t raw(context, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 0);
  raw.connect(server.address());
  raw.send(zmq::buffer(std::string("no call id here")), zmq::send_flags::none);
  raw.send(zmq::buffer(std::string("123")), zmq::send_flags::sndmore);
  raw.send(zmq::buffer(std::string("short id")), zmq::send_flags::none);
  ZmqClient client = connect_to(server.address());
  // Wait, with a deadline, until the server has seen both bad messages.
  const auto deadline = in(10s);
  while (server.malformed_messages() < 2 && Clock::now() < deadline) {
    CHECK(client.call(wire::Frames{{"probe"}}, in(10s)).get().is_ok());
  }
  CHECK(server.malformed_messages() == 2);
  CHECK(client.call(wire::Frames{{"still here"}}, in(10s)).get().is_ok());
}

TEST_CASE("bad addresses and options are errors") {
  CHECK(ZmqTransport::bind("nonsense", {}).status().code() == StatusCode::unavailable);
  CHECK(ZmqTransport::bind("tcp://127.0.0.1:*", {.worker_threads = 0}).status().code() ==
        StatusCode::invalid_argument);
  ServerOptions no_keys;
  no_keys.security.curve = true;
  CHECK(ZmqTransport::bind("tcp://127.0.0.1:*", no_keys).status().code() == StatusCode::invalid_argument);
  ZmqServer server = serve_echo();
  CHECK(ZmqTransport::bind(server.address(), {}).status().code() == StatusCode::unavailable);
  ClientOptions half;
  half.security.curve = true;
  CHECK(ZmqTransport::connect(server.address(), half).status().code() == StatusCode::invalid_argument);
}

}  // namespace
}  // namespace swarm
