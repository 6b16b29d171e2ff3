// A ZeroMQ server facing senders it cannot trust, over real loopback sockets:
// requests over max_message_bytes never reach the handler, a flood that fills
// the worker queue is answered busy at once while memory stays bounded, and
// honest clients are served before, during and after.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <functional>
#include <mutex>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <fmt/core.h>

#include <doctest/doctest.h>

#include "swarm/wire/wire.h"
#include "transports/zmq/zmq_transport.h"

namespace swarm {
namespace {

using namespace std::chrono_literals;

constexpr int64_t kKiB = 1024;

Deadline in(std::chrono::milliseconds ms) { return Clock::now() + ms; }

ServerOptions server_options(int workers, int max_queued_requests = ServerOptions{}.max_queued_requests) {
  ServerOptions options;
  options.worker_threads = workers;
  options.max_queued_requests = max_queued_requests;
  return options;
}

ClientOptions client_options(int64_t max_message_bytes) {
  ClientOptions options;
  options.max_message_bytes = max_message_bytes;
  return options;
}

ZmqServer bind_server(ServerOptions options) {
  auto server = ZmqTransport::bind("tcp://127.0.0.1:*", options);
  REQUIRE_MESSAGE(server.is_ok(), server.status().to_string());
  return std::move(server).value();
}

ZmqClient connect_to(const std::string& address, ClientOptions options = {}) {
  auto client = ZmqTransport::connect(address, options);
  REQUIRE_MESSAGE(client.is_ok(), client.status().to_string());
  return std::move(client).value();
}

// The status an error reply carries; ok for anything else.
Status carried_status(const wire::Frames& reply) {
  auto decoded = wire::decode_message(reply.views(), wire::Limits{});
  if (!decoded.is_ok() || decoded->header.kind != wire::MessageKind::error) return Status::ok();
  return wire::status_from_error_reply(decoded->header);
}

bool is_busy_reply(const Result<wire::Frames>& reply) {
  if (!reply.is_ok()) return false;
  Status status = carried_status(*reply);
  return status.code() == StatusCode::resource_exhausted && status.message().find("busy") != std::string::npos;
}

// A latch handlers block on until the test opens it; the deadline keeps a broken test from hanging.
struct Gate {
  std::promise<void> opener;
  std::shared_future<void> opened = opener.get_future().share();
  void open() { opener.set_value(); }
  void wait() const { (void)opened.wait_until(in(30s)); }
};

bool wait_for(const std::function<bool()>& condition, std::chrono::milliseconds limit = 10s) {
  const Deadline give_up = in(limit);
  while (!condition()) {
    if (Clock::now() >= give_up) return false;
    std::this_thread::yield();
  }
  return true;
}

long resident_bytes() {
  long total_pages = 0, resident_pages = 0;
  FILE* statm = std::fopen("/proc/self/statm", "r");
  if (statm == nullptr) return -1;
  const int read = std::fscanf(statm, "%ld %ld", &total_pages, &resident_pages);
  std::fclose(statm);
  return read == 2 ? resident_pages * ::sysconf(_SC_PAGESIZE) : -1;
}

TEST_CASE("a request over max_message_bytes never reaches the handler; honest clients are still served") {
  std::atomic<int> handled{0};
  ServerOptions options = server_options(2);
  options.max_message_bytes = 64 * kKiB;
  ZmqServer server = bind_server(options);
  REQUIRE(server.serve([&](const PeerIdentity&, wire::Frames f) {
    ++handled;
    return f;
  }).is_ok());
  ZmqClient honest = connect_to(server.address());
  int honest_calls = 0;
  auto honest_call = [&] {
    ++honest_calls;
    auto reply = honest.call(wire::Frames{{std::string("ping")}}, in(10s)).get();
    return reply.is_ok() && reply->parts[0] == "ping";
  };

  // Exactly at the limit is allowed, by libzmq's check and by the server's.
  auto at_limit = honest.call(wire::Frames{{std::string(64 * kKiB, 'a')}}, in(10s)).get();
  REQUIRE_MESSAGE(at_limit.is_ok(), at_limit.status().to_string());
  ++honest_calls;

  // One frame over: libzmq drops the connection on reading the frame's size, so nothing answers.
  ZmqClient big_frame = connect_to(server.address());
  auto dropped = big_frame.call(wire::Frames{{std::string(64 * kKiB + 1, 'x')}}, in(500ms)).get();
  CHECK(dropped.status().code() == StatusCode::deadline_exceeded);

  // Frames each under the limit but over it together: the server drops and counts the request.
  ZmqClient many_frames = connect_to(server.address());
  const std::string third(24 * kKiB, 'y');
  Call too_much = many_frames.call(wire::Frames{{third, third, third}}, in(30s));
  CHECK(wait_for([&] { return server.oversized_requests() >= 1 && honest_call(); }));
  CHECK(server.oversized_requests() == 1);
  CHECK_FALSE(too_much.ready());
  CHECK(many_frames.cancel(too_much.id()).is_ok());

  CHECK(honest_call());
  CHECK(handled == honest_calls);
}

TEST_CASE("a client refuses a reply over its own max_message_bytes") {
  ZmqServer server = bind_server({});
  REQUIRE(server.serve([](const PeerIdentity&, wire::Frames f) { return f; }).is_ok());
  ZmqClient client = connect_to(server.address(), client_options(64 * kKiB));

  const std::string third(24 * kKiB, 'y');
  auto summed = client.call(wire::Frames{{third, third, third}}, in(10s)).get();
  CHECK(summed.status().code() == StatusCode::resource_exhausted);
  // The connection survives a reply refused by its sum.
  auto small = client.call(wire::Frames{{std::string("still here")}}, in(10s)).get();
  REQUIRE_MESSAGE(small.is_ok(), small.status().to_string());
  CHECK(small->parts[0] == "still here");

  // One reply frame over the limit is a protocol error to libzmq: it closes
  // the connection and, unlike after a network error, never reconnects.
  auto one_frame = client.call(wire::Frames{{std::string(64 * kKiB + 1, 'x')}}, in(500ms)).get();
  CHECK(one_frame.status().code() == StatusCode::deadline_exceeded);
  CHECK(client.call(wire::Frames{{std::string("cut off")}}, in(500ms)).get().status().code() ==
        StatusCode::deadline_exceeded);
  // The server is unharmed: a new client reaches it.
  ZmqClient fresh = connect_to(server.address(), client_options(64 * kKiB));
  auto reply = fresh.call(wire::Frames{{std::string("new")}}, in(10s)).get();
  REQUIRE_MESSAGE(reply.is_ok(), reply.status().to_string());
  CHECK(reply->parts[0] == "new");
}

TEST_CASE("a flood that fills the worker queue is answered busy at once; queued calls are served after") {
  constexpr int kWorkers = 2, kQueued = 8, kFlood = 200;
  Gate gate;
  std::atomic<int> entered{0};
  ZmqServer server = bind_server(server_options(kWorkers, kQueued));
  REQUIRE(server.serve([&](const PeerIdentity&, wire::Frames f) {
    ++entered;
    gate.wait();
    return f;
  }).is_ok());
  ZmqClient client = connect_to(server.address());
  auto send = [&](int count) {
    std::vector<Call> calls;
    for (int i = 0; i < count; ++i) calls.push_back(client.call(wire::Frames{{std::to_string(i)}}, in(30s)));
    return calls;
  };

  std::vector<Call> running = send(kWorkers);
  REQUIRE(wait_for([&] { return entered == kWorkers; }));
  // One connection delivers in order, so these fill the queue before the flood arrives.
  std::vector<Call> queued = send(kQueued);
  std::vector<Call> flood = send(kFlood);
  int busy = 0;
  for (Call& call : flood) busy += is_busy_reply(call.get());
  CHECK(busy == kFlood);
  CHECK(server.busy_replies() == kFlood);
  // Answered while every worker is still blocked: the busy replies did not wait for one.
  CHECK(entered == kWorkers);
  for (Call& call : queued) CHECK_FALSE(call.ready());

  gate.open();
  for (auto* calls : {&running, &queued}) {
    for (Call& call : *calls) {
      auto reply = call.get();
      CHECK_MESSAGE(reply.is_ok(), reply.status().to_string());
      CHECK_FALSE(is_busy_reply(reply));
    }
  }
  auto after = client.call(wire::Frames{{std::string("after")}}, in(10s)).get();
  REQUIRE_MESSAGE(after.is_ok(), after.status().to_string());
  CHECK(after->parts[0] == "after");
  CHECK(server.busy_replies() == kFlood);
  CHECK(entered == kWorkers + kQueued + 1);
}

// Before: the server drained its socket into one first-come queue, so another
// caller's request waited behind the whole flood (entered 53rd of 53 here).
TEST_CASE("a caller's flood of queued requests delays another caller by one request, not by the flood") {
  constexpr int kWorkers = 2, kFlood = 50;
  Gate gate;
  std::mutex mu;
  std::vector<std::string> entered;  // the order requests reached the handler
  ZmqServer server = bind_server(server_options(kWorkers));
  REQUIRE(server.serve([&](const PeerIdentity&, wire::Frames f) {
    {
      std::lock_guard lock(mu);
      entered.emplace_back(f.parts[0].view());
    }
    gate.wait();
    return f;
  }).is_ok());
  auto count_entered = [&] {
    std::lock_guard lock(mu);
    return entered.size();
  };
  ZmqClient flooder = connect_to(server.address());
  ZmqClient other = connect_to(server.address());
  std::vector<Call> calls;
  for (int i = 0; i < kWorkers; ++i) calls.push_back(flooder.call(wire::Frames{{fmt::format("flood {}", i)}}, in(30s)));
  REQUIRE(wait_for([&] { return count_entered() == kWorkers; }));
  for (int i = kWorkers; i < kWorkers + kFlood; ++i) {
    calls.push_back(flooder.call(wire::Frames{{fmt::format("flood {}", i)}}, in(30s)));
  }
  // The flood is queued at the server before the other caller's request arrives.
  REQUIRE(wait_for([&] { return server.counters().messages_received.load() == kWorkers + kFlood; }));
  calls.push_back(other.call(wire::Frames{{std::string("other")}}, in(30s)));
  REQUIRE(wait_for([&] { return server.counters().messages_received.load() == kWorkers + kFlood + 1; }));
  gate.open();
  for (Call& call : calls) CHECK(call.get().is_ok());
  std::lock_guard lock(mu);
  REQUIRE(entered.size() == kWorkers + kFlood + 1);
  const auto at = std::find(entered.begin(), entered.end(), "other") - entered.begin();
  MESSAGE("the other caller's request was number " << at + 1 << " of " << entered.size() << " to enter the handler");
  CHECK(at <= kWorkers + 1);  // behind the requests in service and at most one queued flood request
}

TEST_CASE("resident memory stays bounded while 500 MiB of requests flood a blocked server") {
  constexpr int kWorkers = 2, kQueued = 16, kFlood = 2000;
  constexpr size_t kPayload = 256 * kKiB;  // 2000 of them: 500 MiB, were they all kept
  constexpr size_t kWindow = 64;
  constexpr long kBoundBytes = 96L << 20;
  Gate gate;
  std::atomic<int> entered{0};
  ZmqServer server = bind_server(server_options(kWorkers, kQueued));
  REQUIRE(server.serve([&](const PeerIdentity&, wire::Frames) {
    ++entered;
    gate.wait();
    return wire::Frames{{std::string("done")}};
  }).is_ok());
  ZmqClient client = connect_to(server.address());
  // One buffer behind every request: the transport sends it zero-copy, so the
  // client's side of the flood costs no memory and what grows is the server's.
  const wire::Frame payload(std::string(kPayload, 'p'));
  auto send = [&] { return client.call(wire::Frames{{payload}}, in(60s)); };

  // Every worker blocked and the queue full (one connection delivers in order), so all the flood is refused.
  std::vector<Call> held;
  for (int i = 0; i < kWorkers; ++i) held.push_back(send());
  REQUIRE(wait_for([&] { return entered == kWorkers; }));
  for (int i = 0; i < kQueued; ++i) held.push_back(send());

  std::deque<Call> window;
  int busy = 0;
  long baseline = 0, peak = 0;
  auto settle = [&] {
    busy += is_busy_reply(window.front().get());
    window.pop_front();
  };
  for (int i = 0; i < kFlood; ++i) {
    window.push_back(send());
    if (window.size() < kWindow) continue;
    settle();
    // Measured from once allocators and socket buffers have warmed up.
    if (i == 4 * static_cast<int>(kWindow)) baseline = resident_bytes();
    if (baseline > 0) peak = std::max(peak, resident_bytes());
  }
  while (!window.empty()) settle();
  REQUIRE(baseline > 0);
  MESSAGE(fmt::format("RSS {:.1f} MiB early in the flood, peak {:.1f} MiB (bound: +{} MiB)", baseline / 1048576.0,
                      peak / 1048576.0, kBoundBytes >> 20));
  CHECK(peak - baseline < kBoundBytes);
  CHECK(busy == kFlood);
  CHECK(server.busy_replies() == static_cast<uint64_t>(kFlood));

  gate.open();
  for (Call& call : held) {
    auto reply = call.get();
    REQUIRE_MESSAGE(reply.is_ok(), reply.status().to_string());
    CHECK(reply->parts[0] == "done");
  }
  CHECK(entered == kWorkers + kQueued);
}

TEST_CASE("limits that cannot be honoured are refused at bind and connect") {
  ServerOptions no_bytes = server_options(1);
  no_bytes.max_message_bytes = 0;
  CHECK(ZmqTransport::bind("tcp://127.0.0.1:*", no_bytes).status().code() == StatusCode::invalid_argument);
  CHECK(ZmqTransport::bind("tcp://127.0.0.1:*", server_options(2, 0)).status().code() ==
        StatusCode::invalid_argument);
  CHECK(ZmqTransport::connect("tcp://127.0.0.1:1", client_options(-1)).status().code() ==
        StatusCode::invalid_argument);
}

}  // namespace
}  // namespace swarm
