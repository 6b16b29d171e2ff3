// The in-process transport: round trips, concurrency, deadlines, cancel, stop,
// binding rules, peer identity, and the size and queue limits it shares with ZeroMQ.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transports/inproc/inproc_transport.h"
#include "swarm/api/transport.h"
#include "swarm/wire/wire.h"

namespace swarm {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Far enough that only a bug reaches it; keeps a broken test from hanging.
Deadline generous() { return Clock::now() + seconds(20); }

// Holds handlers until the test opens it, with a deadline so nothing waits forever.
struct Gate {
  std::promise<void> open_promise;
  std::shared_future<void> opened = open_promise.get_future().share();
  void open() { open_promise.set_value(); }
  bool wait() const { return opened.wait_until(generous()) == std::future_status::ready; }
};

std::string float_bytes(const std::vector<float>& values) {
  std::string bytes(values.size() * sizeof(float), '\0');
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

InprocServer bind_or_die(const std::string& address, ServerOptions options = {}) {
  auto server = InprocTransport::bind(address, options);
  REQUIRE_MESSAGE(server.is_ok(), server.status().to_string());
  return std::move(server).value();
}

InprocClient connect_or_die(const std::string& address) {
  auto client = InprocTransport::connect(address, {});
  REQUIRE_MESSAGE(client.is_ok(), client.status().to_string());
  return std::move(client).value();
}

RequestHandler echo() {
  return [](const PeerIdentity&, wire::Frames request) { return request; };
}

TEST_CASE("an echo round trip returns both tensor frames unchanged, moved not copied") {
  InprocServer server = bind_or_die("inproc://echo");
  const char* seen_by_handler = nullptr;
  REQUIRE(server.serve([&](const PeerIdentity&, wire::Frames request) {
    seen_by_handler = request.parts[1].data();
    return request;
  }).is_ok());
  InprocClient client = connect_or_die(server.address());

  std::vector<float> a(1000), b(333);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.5f * static_cast<float>(i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = -1.0f - static_cast<float>(i);
  wire::Frames request{{"header", float_bytes(a), float_bytes(b)}};
  const wire::Frames expected = request;
  const char* sent_buffer = request.parts[1].data();

  Call call = client.call(std::move(request), generous());
  auto reply = call.get();
  REQUIRE_MESSAGE(reply.is_ok(), reply.status().to_string());
  CHECK(reply->parts == expected.parts);
  // Zero-copy: the handler and the caller see the very buffer that was sent.
  CHECK(seen_by_handler == sent_buffer);
  CHECK(reply->parts[1].data() == sent_buffer);

  const uint64_t bytes = 6 + 4000 + 1332;
  CHECK(client.counters().bytes_sent == bytes);
  CHECK(client.counters().bytes_received == bytes);
  CHECK(client.counters().messages_sent == 1);
  CHECK(client.counters().messages_received == 1);
  CHECK(server.counters().bytes_received == client.counters().bytes_sent.load());
  CHECK(server.counters().bytes_sent == client.counters().bytes_received.load());
  CHECK(server.counters().messages_received == 1);
  CHECK(server.counters().messages_sent == 1);
}

TEST_CASE("100 calls in flight from 4 threads on one client each get their own reply") {
  InprocServer server = bind_or_die("inproc://many", ServerOptions{.worker_threads = 3});
  Gate all_sent;
  REQUIRE(server.serve([&](const PeerIdentity&, wire::Frames request) {
    // No handler answers before all 100 are sent, so all are in flight at once.
    all_sent.wait();
    request.parts[0] = "reply-to-" + request.parts[0];
    return request;
  }).is_ok());
  InprocClient client = connect_or_die(server.address());

  constexpr int kThreads = 4, kPerThread = 25;
  std::mutex mu;
  std::vector<std::pair<int, Call>> calls;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        int request_id = t * kPerThread + i;
        Call call = client.call(wire::Frames{{std::to_string(request_id)}}, generous());
        std::lock_guard lock(mu);
        calls.emplace_back(request_id, std::move(call));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  REQUIRE(calls.size() == 100);
  for (auto& [id, call] : calls) CHECK_FALSE(call.ready());
  all_sent.open();

  int matched = 0;
  for (auto& [request_id, call] : calls) {
    auto reply = call.get();
    REQUIRE_MESSAGE(reply.is_ok(), reply.status().to_string());
    matched += reply->parts.at(0) == "reply-to-" + std::to_string(request_id);
  }
  CHECK(matched == 100);
  CHECK(client.counters().messages_sent == 100);
  CHECK(client.counters().messages_received == 100);
  CHECK(server.counters().messages_received == 100);
}

TEST_CASE("a call to a blocked handler misses its deadline; a later call succeeds") {
  InprocServer server = bind_or_die("inproc://deadline");
  Gate release;
  REQUIRE(server.serve([&](const PeerIdentity&, wire::Frames request) {
    if (request.parts[0] == "block") release.wait();
    return request;
  }).is_ok());
  InprocClient client = connect_or_die(server.address());

  Deadline short_deadline = Clock::now() + milliseconds(50);
  Call blocked = client.call(wire::Frames{{"block"}}, short_deadline);
  auto missed = blocked.get();
  CHECK(Clock::now() >= short_deadline);
  REQUIRE_FALSE(missed.is_ok());
  CHECK(missed.status().code() == StatusCode::deadline_exceeded);

  release.open();
  auto later = client.call(wire::Frames{{"after"}}, generous()).get();
  REQUIRE_MESSAGE(later.is_ok(), later.status().to_string());
  CHECK(later->parts[0] == "after");
}

TEST_CASE("a deadline already past fails the call without running the handler") {
  InprocServer server = bind_or_die("inproc://past");
  std::atomic<int> handled{0};
  InprocClient client = connect_or_die(server.address());
  // Queued before serve(), so the worker finds it expired.
  Call call = client.call(wire::Frames{{"late"}}, Clock::now() - milliseconds(1));
  REQUIRE(server.serve([&](const PeerIdentity&, wire::Frames f) {
    ++handled;
    return f;
  }).is_ok());
  auto result = call.get();
  CHECK(result.status().code() == StatusCode::deadline_exceeded);
  // The next call runs the handler, so the worker has passed the expired one.
  REQUIRE(client.call(wire::Frames{{"x"}}, generous()).get().is_ok());
  CHECK(handled == 1);
}

TEST_CASE("cancel completes a pending call with cancelled, once") {
  InprocServer server = bind_or_die("inproc://cancel");
  Gate release;
  REQUIRE(server.serve([&](const PeerIdentity&, wire::Frames request) {
    release.wait();
    return request;
  }).is_ok());
  InprocClient client = connect_or_die(server.address());

  Call call = client.call(wire::Frames{{"slow"}}, generous());
  CHECK_FALSE(call.ready());
  REQUIRE(client.cancel(call.id()).is_ok());
  CHECK(call.ready());
  auto result = call.get();
  CHECK(result.status().code() == StatusCode::cancelled);
  CHECK(client.cancel(call.id()).code() == StatusCode::not_found);
  CHECK(client.cancel(987654).code() == StatusCode::not_found);
  CHECK(call.get().status().code() == StatusCode::failed_precondition);

  release.open();
  auto later = client.call(wire::Frames{{"next"}}, generous()).get();
  REQUIRE(later.is_ok());
  CHECK(later->parts[0] == "next");
}

TEST_CASE("stopping a server fails its pending calls with unavailable, and later calls cleanly") {
  InprocServer server = bind_or_die("inproc://stop");
  Gate release;
  std::promise<void> entered;
  REQUIRE(server.serve([&](const PeerIdentity&, wire::Frames request) {
    if (request.parts[0] == "first") entered.set_value();
    release.wait();
    return request;
  }).is_ok());
  InprocClient client = connect_or_die(server.address());

  Call running = client.call(wire::Frames{{"first"}}, generous());
  Call queued = client.call(wire::Frames{{"second"}}, generous());
  REQUIRE(entered.get_future().wait_until(generous()) == std::future_status::ready);

  // stop() waits for the running handler, so it runs beside the test.
  auto stopping = std::async(std::launch::async, [&] { server.stop(); });
  CHECK(running.get().status().code() == StatusCode::unavailable);
  CHECK(queued.get().status().code() == StatusCode::unavailable);
  release.open();
  REQUIRE(stopping.wait_until(generous()) == std::future_status::ready);

  Call after = client.call(wire::Frames{{"third"}}, generous());
  CHECK(after.ready());
  CHECK(after.get().status().code() == StatusCode::unavailable);
  CHECK(InprocTransport::connect("inproc://stop", {}).status().code() == StatusCode::unavailable);
  CHECK(server.serve(echo()).code() == StatusCode::failed_precondition);
  server.stop();  // idempotent
}

TEST_CASE("binding rules: one server per address, names checked, unknown addresses unavailable") {
  {
    InprocServer first = bind_or_die("inproc://dup");
    auto second = InprocTransport::bind("inproc://dup", {});
    CHECK(second.status().code() == StatusCode::already_exists);
  }
  // The first server's destructor freed the name.
  CHECK(InprocTransport::bind("inproc://dup", {}).is_ok());

  CHECK(InprocTransport::bind("tcp://dup", {}).status().code() == StatusCode::invalid_argument);
  CHECK(InprocTransport::bind("inproc://", {}).status().code() == StatusCode::invalid_argument);
  CHECK(InprocTransport::bind("inproc://zero", ServerOptions{.worker_threads = 0}).status().code() ==
        StatusCode::invalid_argument);
  CHECK(InprocTransport::connect("inproc://nobody", {}).status().code() == StatusCode::unavailable);
}

TEST_CASE("a peer's identity is stable per client and differs between clients") {
  InprocServer server = bind_or_die("inproc://identity");
  REQUIRE(server.serve([](const PeerIdentity& from, wire::Frames) {
    return wire::Frames{{from.id}};
  }).is_ok());
  InprocClient one = connect_or_die(server.address());
  InprocClient two = connect_or_die(server.address());

  auto seen = [](InprocClient& client) {
    auto reply = client.call(wire::Frames{{"who"}}, generous()).get();
    REQUIRE(reply.is_ok());
    return reply->parts.at(0).str();
  };
  std::string one_first = seen(one), one_second = seen(one), two_first = seen(two);
  CHECK_FALSE(one_first.empty());
  CHECK(one_first == one_second);
  CHECK(one_first == one.identity().id);
  CHECK(one_first != two_first);
  CHECK(two_first == two.identity().id);
}

TEST_CASE("a throwing handler answers internal and the server keeps serving") {
  InprocServer server = bind_or_die("inproc://throws");
  REQUIRE(server.serve([](const PeerIdentity&, wire::Frames request) -> wire::Frames {
    if (request.parts[0] == "bad") throw std::runtime_error("boom");
    return request;
  }).is_ok());
  InprocClient client = connect_or_die(server.address());
  auto bad = client.call(wire::Frames{{"bad"}}, generous()).get();
  CHECK(bad.status().code() == StatusCode::internal);
  CHECK(client.call(wire::Frames{{"good"}}, generous()).get().is_ok());
}

TEST_CASE("destroying a client cancels its pending calls") {
  InprocServer server = bind_or_die("inproc://client-gone");
  Gate release;
  REQUIRE(server.serve([&](const PeerIdentity&, wire::Frames request) {
    release.wait();
    return request;
  }).is_ok());
  std::optional<Call> call;
  {
    InprocClient client = connect_or_die(server.address());
    call.emplace(client.call(wire::Frames{{"orphan"}}, generous()));
  }
  CHECK(call->get().status().code() == StatusCode::cancelled);
  release.open();
}

ServerOptions limited(int64_t max_message_bytes, int max_queued_requests = ServerOptions{}.max_queued_requests) {
  ServerOptions options;
  options.max_message_bytes = max_message_bytes;
  options.max_queued_requests = max_queued_requests;
  return options;
}

// The status an error reply carries, as the ZeroMQ server sends it; ok for anything else.
Status carried_status(const Result<wire::Frames>& reply) {
  if (!reply.is_ok()) return reply.status();
  auto decoded = wire::decode_message(reply->views(), wire::Limits{});
  if (!decoded.is_ok() || decoded->header.kind != wire::MessageKind::error) return Status::ok();
  return wire::status_from_error_reply(decoded->header);
}

TEST_CASE("a request over max_message_bytes is refused before the handler; others are served") {
  InprocServer server = bind_or_die("inproc://oversized", limited(1024));
  std::atomic<int> handled{0};
  REQUIRE(server.serve([&](const PeerIdentity&, wire::Frames request) {
    ++handled;
    return request;
  }).is_ok());
  InprocClient client = connect_or_die(server.address());

  Call too_big = client.call(wire::Frames{{std::string(600, 'a'), std::string(600, 'b')}}, generous());
  CHECK(too_big.ready());  // refused on the caller's thread, with no wait for a deadline
  CHECK(too_big.get().status().code() == StatusCode::resource_exhausted);
  CHECK(server.oversized_requests() == 1);
  CHECK(server.counters().messages_received == 0);

  auto at_limit = client.call(wire::Frames{{std::string(1024, 'c')}}, generous()).get();
  REQUIRE_MESSAGE(at_limit.is_ok(), at_limit.status().to_string());
  CHECK(handled == 1);
}

TEST_CASE("a full queue answers busy at once, with the ZeroMQ server's error reply") {
  constexpr int kQueued = 2, kFlood = 5;
  InprocServer server = bind_or_die("inproc://busy", limited(ServerOptions{}.max_message_bytes, kQueued));
  Gate release;
  std::promise<void> entered;
  REQUIRE(server.serve([&](const PeerIdentity&, wire::Frames request) {
    if (request.parts[0] == "first") entered.set_value();
    release.wait();
    return request;
  }).is_ok());
  InprocClient client = connect_or_die(server.address());

  Call running = client.call(wire::Frames{{"first"}}, generous());
  REQUIRE(entered.get_future().wait_until(generous()) == std::future_status::ready);
  std::vector<Call> queued;
  for (int i = 0; i < kQueued; ++i) queued.push_back(client.call(wire::Frames{{"queued"}}, generous()));
  int busy = 0;
  for (int i = 0; i < kFlood; ++i) {
    Call call = client.call(wire::Frames{{"flood"}}, generous());
    CHECK(call.ready());
    Status status = carried_status(call.get());
    busy += status.code() == StatusCode::resource_exhausted && status.message().find("busy") != std::string::npos;
  }
  CHECK(busy == kFlood);
  CHECK(server.busy_replies() == kFlood);
  for (Call& call : queued) CHECK_FALSE(call.ready());

  release.open();
  CHECK(running.get().is_ok());
  for (Call& call : queued) CHECK(carried_status(call.get()).is_ok());
  CHECK(client.call(wire::Frames{{"after"}}, generous()).get().is_ok());
  CHECK(server.busy_replies() == kFlood);
}

TEST_CASE("a client refuses a reply over its own max_message_bytes") {
  InprocServer server = bind_or_die("inproc://big-reply");
  REQUIRE(server.serve([](const PeerIdentity&, wire::Frames request) {
    return wire::Frames{{std::string(std::stoul(request.parts[0].str()), 'r')}};
  }).is_ok());
  ClientOptions options;
  options.max_message_bytes = 1024;
  auto client = InprocTransport::connect(server.address(), options);
  REQUIRE(client.is_ok());
  CHECK(client->call(wire::Frames{{"1025"}}, generous()).get().status().code() == StatusCode::resource_exhausted);
  auto fits = client->call(wire::Frames{{"1024"}}, generous()).get();
  REQUIRE_MESSAGE(fits.is_ok(), fits.status().to_string());
  CHECK(fits->parts[0].size() == 1024);
}

TEST_CASE("limits that cannot be honoured are refused at bind and connect") {
  CHECK(InprocTransport::bind("inproc://no-bytes", limited(0)).status().code() == StatusCode::invalid_argument);
  CHECK(InprocTransport::bind("inproc://no-queue", limited(1024, 0)).status().code() ==
        StatusCode::invalid_argument);
  InprocServer server = bind_or_die("inproc://limits-ok");
  ClientOptions options;
  options.max_message_bytes = -1;
  CHECK(InprocTransport::connect(server.address(), options).status().code() == StatusCode::invalid_argument);
}

}  // namespace
}  // namespace swarm
