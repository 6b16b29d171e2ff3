// The ZeroMQ transport beside bare cppzmq sockets, both on TCP loopback in the
// same run: 4 MiB requests with 4 KiB replies against a PUSH/PULL pair moving
// the same payload, and small-message round trips against a REQ/REP pair.
// Then the transport against itself: echo round trips of 1 KiB and 1 MiB with
// CURVE on and off, for what encryption costs.
#include <atomic>
#include <deque>
#include <thread>

#include <benchmark/benchmark.h>
#include <zmq.hpp>

#include "bench/ratio_report.h"
#include "transports/zmq/curve_keys.h"
#include "transports/zmq/zmq_transport.h"

namespace {

using namespace std::chrono_literals;

constexpr size_t kLarge = 4 << 20;
constexpr size_t kReply = 4 << 10;
constexpr size_t kSmall = 64;
constexpr int kInFlight = 4;

void BM_TransportLarge(benchmark::State& state) {
  auto server = *swarm::ZmqTransport::bind("tcp://127.0.0.1:*", {.worker_threads = 1});
  const std::string reply(kReply, 'r');
  (void)server.serve([&](const swarm::PeerIdentity&, swarm::wire::Frames) {
    return swarm::wire::Frames{{reply}};
  });
  auto client = *swarm::ZmqTransport::connect(server.address(), {});
  const swarm::wire::Frame payload(std::string(kLarge, 'p'));
  std::deque<swarm::Call> window;
  for (auto _ : state) {
    window.push_back(client.call(swarm::wire::Frames{{payload}}, swarm::Clock::now() + 60s));
    if (window.size() >= kInFlight) {
      if (!window.front().get().is_ok()) state.SkipWithError("call failed");
      window.pop_front();
    }
  }
  while (!window.empty()) {
    (void)window.front().get();
    window.pop_front();
  }
  state.SetBytesProcessed(state.iterations() * kLarge);
}

void BM_BarePushPullLarge(benchmark::State& state) {
  // Declared before the context so it outlives it: zero-copy sends read from
  // it until the context has shut its I/O threads down.
  const std::string payload(kLarge, 'p');
  zmq::context_t context;
  zmq::socket_t pull(context, zmq::socket_type::pull);
  pull.set(zmq::sockopt::linger, 0);
  pull.set(zmq::sockopt::rcvhwm, kInFlight);
  pull.bind("tcp://127.0.0.1:*");
  const std::string endpoint = pull.get(zmq::sockopt::last_endpoint);
  zmq::socket_t push(context, zmq::socket_type::push);
  push.set(zmq::sockopt::linger, 0);
  // The same window as the transport's kInFlight calls, so the loop's time is
  // what the receiver really took in, not what piled up in a queue.
  push.set(zmq::sockopt::sndhwm, kInFlight);
  push.connect(endpoint);
  std::atomic<bool> done{false};
  std::thread receiver([&] {
    zmq::message_t message;
    pull.set(zmq::sockopt::rcvtimeo, 100);
    while (!done) (void)pull.recv(message);
  });
  for (auto _ : state) {
    // The same payload each time, sent zero-copy as the transport sends it.
    zmq::message_t message(const_cast<char*>(payload.data()), payload.size(), nullptr, nullptr);
    push.send(message, zmq::send_flags::none);
  }
  done = true;
  receiver.join();
  state.SetBytesProcessed(state.iterations() * kLarge);
}

void BM_TransportSmallRoundTrip(benchmark::State& state) {
  auto server = *swarm::ZmqTransport::bind("tcp://127.0.0.1:*", {.worker_threads = 1});
  (void)server.serve([](const swarm::PeerIdentity&, swarm::wire::Frames f) { return f; });
  auto client = *swarm::ZmqTransport::connect(server.address(), {});
  const std::string payload(kSmall, 's');
  for (auto _ : state) {
    auto reply = client.call(swarm::wire::Frames{{payload}}, swarm::Clock::now() + 10s).get();
    if (!reply.is_ok()) state.SkipWithError("call failed");
  }
}

void BM_BareReqRepSmall(benchmark::State& state) {
  zmq::context_t context;
  zmq::socket_t rep(context, zmq::socket_type::rep);
  rep.bind("tcp://127.0.0.1:*");
  const std::string endpoint = rep.get(zmq::sockopt::last_endpoint);
  std::atomic<bool> done{false};
  std::thread server([&] {
    rep.set(zmq::sockopt::rcvtimeo, 100);
    zmq::message_t message;
    while (!done) {
      if (rep.recv(message)) rep.send(message, zmq::send_flags::none);
    }
  });
  zmq::socket_t req(context, zmq::socket_type::req);
  req.set(zmq::sockopt::linger, 0);
  rep.set(zmq::sockopt::linger, 0);
  req.connect(endpoint);
  const std::string payload(kSmall, 's');
  zmq::message_t reply;
  for (auto _ : state) {
    req.send(zmq::buffer(payload), zmq::send_flags::none);
    (void)req.recv(reply);
  }
  done = true;
  server.join();
}

// Fresh random pairs, and an empty allow-list: what is measured is the
// encryption, not the ZAP check (which runs once per connection anyway).
void secure_with_curve(swarm::ServerOptions& server, swarm::ClientOptions& client) {
  const swarm::CurveKeyPair server_keys = *swarm::zmq_transport::generate_curve_keypair();
  server.security.curve = true;
  server.security.keys = server_keys;
  client.security.curve = true;
  client.security.keys = *swarm::zmq_transport::generate_curve_keypair();
  client.security.server_public_key = server_keys.public_key;
}

void echo_round_trips(benchmark::State& state, bool curve) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  swarm::ServerOptions server_options;
  swarm::ClientOptions client_options;
  if (curve) secure_with_curve(server_options, client_options);
  auto server = *swarm::ZmqTransport::bind("tcp://127.0.0.1:*", server_options);
  (void)server.serve([](const swarm::PeerIdentity&, swarm::wire::Frames f) { return f; });
  auto client = *swarm::ZmqTransport::connect(server.address(), client_options);
  const swarm::wire::Frame payload(std::string(bytes, 'e'));
  // The first call carries the handshake; only steady traffic is timed.
  if (!client.call(swarm::wire::Frames{{payload}}, swarm::Clock::now() + 10s).get().is_ok()) {
    state.SkipWithError("first call failed");
    return;
  }
  for (auto _ : state) {
    auto reply = client.call(swarm::wire::Frames{{payload}}, swarm::Clock::now() + 10s).get();
    if (!reply.is_ok() || reply->parts[0].size() != bytes) state.SkipWithError("call failed");
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(2 * bytes));  // there and back
}

void BM_PlaintextEcho(benchmark::State& state) { echo_round_trips(state, false); }
void BM_CurveEcho(benchmark::State& state) { echo_round_trips(state, true); }

BENCHMARK(BM_TransportLarge)->UseRealTime()->MinTime(2.0);
BENCHMARK(BM_BarePushPullLarge)->UseRealTime()->MinTime(2.0);
BENCHMARK(BM_TransportSmallRoundTrip)->UseRealTime()->MinTime(1.0);
BENCHMARK(BM_BareReqRepSmall)->UseRealTime()->MinTime(1.0);
BENCHMARK(BM_PlaintextEcho)->Arg(1 << 10)->Arg(1 << 20)->UseRealTime()->MinTime(1.0);
BENCHMARK(BM_CurveEcho)->Arg(1 << 10)->Arg(1 << 20)->UseRealTime()->MinTime(1.0);

SWARM_BENCH_RATIO("4 MiB requests/s, transport vs bare PUSH/PULL (target >= 0.85)",
                  "BM_TransportLarge/min_time:2.000/real_time", "BM_BarePushPullLarge/min_time:2.000/real_time");
SWARM_BENCH_RATIO("64 B round trips/s, transport vs bare REQ/REP (target >= 0.667, i.e. latency <= 1.5x)",
                  "BM_TransportSmallRoundTrip/min_time:1.000/real_time", "BM_BareReqRepSmall/min_time:1.000/real_time");

SWARM_BENCH_RATIO("1 KiB echo round trips/s, CURVE vs plaintext",
                  "BM_CurveEcho/1024/min_time:1.000/real_time", "BM_PlaintextEcho/1024/min_time:1.000/real_time");
SWARM_BENCH_RATIO("1 MiB echo round trips/s, CURVE vs plaintext",
                  "BM_CurveEcho/1048576/min_time:1.000/real_time", "BM_PlaintextEcho/1048576/min_time:1.000/real_time");

}  // namespace
