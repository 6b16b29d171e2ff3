// The network emulator over the in-process transport: the concept, timing
// accuracy against the link model, scheduled faults, loss, cancel and close.
#include <doctest/doctest.h>

#include <fmt/core.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <string>
#include <string_view>

#include "transports/inproc/inproc_transport.h"
#include "transports/netem/netem_transport.h"
#include "swarm/api/transport.h"

namespace swarm {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Netem = NetemTransport<InprocTransport>;

static_assert(Transport<Netem>);
// Stacks: an emulated link over an emulated link is still a transport.
static_assert(Transport<NetemTransport<Netem>>);
static_assert(std::same_as<Netem::server_type, InprocServer>);
static_assert(std::same_as<Netem::address_type, std::string>);
// Only a transport can be wrapped.
template <typename T>
concept Wrappable = requires { typename NetemTransport<T>; };
static_assert(Wrappable<InprocTransport>);
static_assert(!Wrappable<int>);
static_assert(!Wrappable<wire::Frames>);

// Far enough that only a bug reaches it; keeps a broken test from hanging.
Deadline generous() { return Clock::now() + seconds(20); }

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string_view text(const wire::Frames& frames, size_t i) {
  return std::string_view(frames.parts[i].data(), frames.parts[i].size());
}

InprocServer serve_or_die(const std::string& address, RequestHandler handler) {
  auto server = Netem::bind(address, {});
  REQUIRE_MESSAGE(server.is_ok(), server.status().to_string());
  REQUIRE(server->serve(std::move(handler)).is_ok());
  return std::move(server).value();
}

RequestHandler echo() {
  return [](const PeerIdentity&, wire::Frames request) { return request; };
}

NetemClient<InprocTransport> connect_or_die(const std::string& address, NetemOptions options) {
  auto client = Netem::connect(address, NetemClientOptions(std::move(options)));
  REQUIRE_MESSAGE(client.is_ok(), client.status().to_string());
  return std::move(client).value();
}

template <Transport T>
Result<wire::Frames> ping(typename T::client_type& client, Deadline deadline) {
  return client.call(wire::Frames{{std::string("ping")}}, deadline).get();
}

TEST_CASE("code written against the concept runs over a perfect emulated link") {
  InprocServer server = serve_or_die("inproc://netem-ping", [](const PeerIdentity&, wire::Frames f) {
    f.parts.push_back(std::string("pong"));
    return f;
  });
  auto client = Netem::connect(server.address(), ClientOptions{});
  REQUIRE_MESSAGE(client.is_ok(), client.status().to_string());
  auto reply = ping<Netem>(*client, generous());
  REQUIRE_MESSAGE(reply.is_ok(), reply.status().to_string());
  REQUIRE(reply->parts.size() == 2);
  CHECK(text(*reply, 0) == "ping");
  CHECK(text(*reply, 1) == "pong");
  CHECK(client->counters().messages_sent == 1);
  CHECK(client->counters().bytes_sent == 4);
  CHECK(client->counters().messages_received == 1);
  CHECK(client->counters().bytes_received == 8);
  CHECK(client->inner().counters().bytes_received == 8);
  CHECK(client->identity().id == client->inner().identity().id);
}

// Threads of this process, from /proc: the scheduler is one per emulating client.
int threads_now() {
  int n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// A program that runs over netem only when told to (the `swarm` program's
// trainers, with and without --link) pays nothing for it otherwise: no scheduler
// thread, and no poll between a reply and its caller.
TEST_CASE("a perfect link without faults passes calls straight to the transport underneath") {
  InprocServer server = serve_or_die("inproc://netem-direct", echo());
  const int before = threads_now();
  auto perfect = connect_or_die(server.address(), NetemOptions{});
  CHECK(perfect.direct());
  CHECK(threads_now() == before);
  auto reply = ping<Netem>(perfect, generous());
  REQUIRE_MESSAGE(reply.is_ok(), reply.status().to_string());
  CHECK(perfect.counters().messages_sent == 1);
  CHECK(perfect.counters().bytes_received == 4);

  auto slow = connect_or_die(server.address(), NetemOptions{.up = {.latency = milliseconds(1)}});
  CHECK_FALSE(slow.direct());
  CHECK(threads_now() == before + 1);
  netem::FaultSchedule faults;
  faults.drop_between("", Clock::now() + seconds(60), Clock::now() + seconds(61));
  auto faulty = connect_or_die(server.address(), NetemOptions{.faults = faults});
  CHECK_FALSE(faulty.direct());
}

TEST_CASE("a link parsed from text, set in the concept's ClientOptions, is emulated; a real transport refuses it") {
  auto link = netem::parse_link("8mbit,50ms");
  REQUIRE_MESSAGE(link.is_ok(), link.status().to_string());
  CHECK(link->bandwidth_bytes_per_s == 1e6);
  CHECK(link->latency == milliseconds(50));
  InprocServer server = serve_or_die("inproc://netem-options", echo());
  ClientOptions options;  // what a runtime's config holds
  options.link = *link;
  auto client = Netem::connect(server.address(), options);
  REQUIRE_MESSAGE(client.is_ok(), client.status().to_string());
  const Clock::time_point start = Clock::now();
  auto reply = ping<Netem>(*client, generous());
  const double measured = seconds_since(start);
  REQUIRE_MESSAGE(reply.is_ok(), reply.status().to_string());
  CHECK(measured >= 0.1);  // 50 ms each way
  CHECK(measured < 0.2);
  // Without the emulator the same options are an error, not a perfect link.
  auto real = InprocTransport::connect(server.address(), options);
  CHECK(real.status().code() == StatusCode::invalid_argument);
  CHECK(real.status().message().find("NetemTransport") != std::string::npos);
}

TEST_CASE("link text: tc's units, and errors that say what is wrong") {
  CHECK(netem::parse_link("200mbit,50ms")->bandwidth_bytes_per_s == 25e6);
  CHECK(netem::parse_link("1gbit,250us")->latency == std::chrono::microseconds(250));
  CHECK(netem::parse_link("512kbit,1s")->bandwidth_bytes_per_s == 64e3);
  CHECK(netem::parse_link("0,20ms")->bandwidth_bytes_per_s == 0);  // unlimited
  CHECK(netem::parse_link("100mbit,0")->latency == std::chrono::microseconds(0));
  for (const char* bad : {"", "200mbit", "200mbit,50ms,1", "fast,50ms", "200mb,50ms", "-1mbit,50ms", "200mbit,50",
                          "200mbit,inf s", "nanmbit,1ms", "1e400mbit,1ms"}) {
    CAPTURE(bad);
    CHECK(netem::parse_link(bad).status().code() == StatusCode::invalid_argument);
  }
  CHECK(netem::parse_link("fast,50ms").status().message().find("bandwidth 'fast'") != std::string::npos);
}

TEST_CASE("netem accuracy: 25 MB over 200 Mb/s with 50 ms each way takes 1.0 s plus 100 ms") {
  InprocServer server = serve_or_die("inproc://netem-bulk", [](const PeerIdentity&, wire::Frames f) {
    return wire::Frames{{std::string("ok")}};
  });
  const netem::LinkSpec link{.bandwidth_bytes_per_s = 25e6, .latency = milliseconds(50)};
  auto client = connect_or_die(server.address(), NetemOptions{.up = link, .down = link, .seed = 11});

  wire::Frames request{{std::string(25'000'000, 'x')}};
  const Clock::time_point start = Clock::now();
  auto reply = client.call(std::move(request), generous()).get();
  const double measured = seconds_since(start);
  REQUIRE_MESSAGE(reply.is_ok(), reply.status().to_string());
  CHECK(text(*reply, 0) == "ok");

  const double transfer = 1.0, latency = 0.1;
  const double ratio = (measured - latency) / transfer;
  fmt::print("netem accuracy: 25 MB request over 25e6 bytes/s + 2 x 50 ms: measured {:.4f} s, "
             "expected {:.4f} s; transfer part {:.4f} s, ratio to expected {:.4f}\n",
             measured, transfer + latency, measured - latency, ratio);
  CHECK(ratio >= 0.9);
  CHECK(ratio <= 1.1);
  CHECK(client.counters().bytes_sent == 25'000'000);
  CHECK(server.counters().bytes_received == 25'000'000);
}

TEST_CASE("a small message takes one latency each way: about 100 ms round trip") {
  InprocServer server = serve_or_die("inproc://netem-small", echo());
  const netem::LinkSpec link{.bandwidth_bytes_per_s = 25e6, .latency = milliseconds(50)};
  auto client = connect_or_die(server.address(), NetemOptions{.up = link, .down = link});

  const Clock::time_point start = Clock::now();
  auto reply = client.call(wire::Frames{{std::string("hello")}}, generous()).get();
  const double measured = seconds_since(start);
  REQUIRE_MESSAGE(reply.is_ok(), reply.status().to_string());
  CHECK(text(*reply, 0) == "hello");
  fmt::print("netem accuracy: 5-byte round trip over 2 x 50 ms: measured {:.4f} s, ratio {:.4f}\n",
             measured, measured / 0.1);
  CHECK(measured >= 0.1);
  CHECK(measured < 0.2);
}

TEST_CASE("a scheduled drop_all fault fails calls after t and spares calls before it and after t2") {
  InprocServer server = serve_or_die("inproc://netem-fault", echo());
  const Clock::time_point start = Clock::now();
  const Clock::time_point t = start + milliseconds(200), t2 = start + milliseconds(500);
  NetemOptions options{
      // A slow reply path lets a completed call itself mark that t has passed.
      .up = {.latency = milliseconds(10)},
      .down = {.latency = milliseconds(250)},
      .peer_name = "peer-a",
  };
  options.faults.drop_between("peer-a", t, t2);
  // Cut off from the start, but another peer: must not touch this link.
  options.faults.add(netem::Fault{netem::Fault::drop_all, start, "peer-b"});
  auto client = connect_or_die(server.address(), options);

  auto before = client.call(wire::Frames{{std::string("before")}}, generous()).get();
  REQUIRE_MESSAGE(before.is_ok(), before.status().to_string());
  CHECK(text(*before, 0) == "before");
  REQUIRE(Clock::now() >= t);

  auto during = client.call(wire::Frames{{std::string("during")}}, Clock::now() + milliseconds(300)).get();
  CHECK(during.status().code() == StatusCode::deadline_exceeded);
  // Lost on the way there: the server never saw it.
  CHECK(server.counters().messages_received == 1);
  REQUIRE(Clock::now() >= t2);

  auto after = client.call(wire::Frames{{std::string("after")}}, generous()).get();
  REQUIRE_MESSAGE(after.is_ok(), after.status().to_string());
  CHECK(text(*after, 0) == "after");
  CHECK(server.counters().messages_received == 2);
  CHECK(client.counters().messages_sent == 3);
  CHECK(client.counters().messages_received == 2);
}

TEST_CASE("loss 1.0 ends every call in deadline_exceeded, in either direction") {
  InprocServer server = serve_or_die("inproc://netem-loss", echo());

  SUBCASE("requests lost on the way up never reach the server") {
    auto client = connect_or_die(server.address(), NetemOptions{.up = {.loss_probability = 1.0}});
    const Clock::time_point start = Clock::now();
    auto reply = client.call(wire::Frames{{std::string("lost")}}, start + milliseconds(100)).get();
    CHECK(reply.status().code() == StatusCode::deadline_exceeded);
    CHECK(seconds_since(start) >= 0.1);
    CHECK(server.counters().messages_received == 0);
    // The application sent it; the link never carried it.
    CHECK(client.counters().messages_sent == 1);
    CHECK(client.inner().counters().messages_sent == 0);
    CHECK(client.counters().messages_received == 0);
  }
  SUBCASE("replies lost on the way down leave the server's work unseen") {
    auto client = connect_or_die(server.address(), NetemOptions{.down = {.loss_probability = 1.0}});
    auto reply = client.call(wire::Frames{{std::string("lost")}}, Clock::now() + milliseconds(100)).get();
    CHECK(reply.status().code() == StatusCode::deadline_exceeded);
    CHECK(server.counters().messages_received == 1);
    CHECK(client.counters().messages_received == 0);
  }
}

TEST_CASE("cancel ends a call still on the link and one the server is working on") {
  std::promise<void> entered, release;
  std::shared_future<void> released = release.get_future().share();
  bool entered_once = false;
  InprocServer server = serve_or_die("inproc://netem-cancel", [&](const PeerIdentity&, wire::Frames f) {
    if (!entered_once && text(f, 0) == "slow") {
      entered_once = true;
      entered.set_value();
      released.wait_until(generous());
    }
    return f;
  });

  SUBCASE("on the link") {
    auto client = connect_or_die(server.address(), NetemOptions{.up = {.latency = seconds(10)}});
    Call call = client.call(wire::Frames{{std::string("far")}}, generous());
    CHECK_FALSE(call.ready());
    CHECK(client.cancel(call.id()).is_ok());
    CHECK(call.get().status().code() == StatusCode::cancelled);
    CHECK(client.cancel(call.id()).code() == StatusCode::not_found);
    CHECK(server.counters().messages_received == 0);
  }
  SUBCASE("in the server's handler") {
    auto client = connect_or_die(server.address(), NetemOptions{.up = {.latency = milliseconds(5)}});
    Call call = client.call(wire::Frames{{std::string("slow")}}, generous());
    REQUIRE(entered.get_future().wait_until(generous()) == std::future_status::ready);
    CHECK(client.cancel(call.id()).is_ok());
    CHECK(call.get().status().code() == StatusCode::cancelled);
    release.set_value();
    // The client still works after a cancel.
    auto reply = client.call(wire::Frames{{std::string("next")}}, generous()).get();
    REQUIRE_MESSAGE(reply.is_ok(), reply.status().to_string());
    CHECK(text(*reply, 0) == "next");
  }
  SUBCASE("unknown ids are not_found") {
    auto client = connect_or_die(server.address(), NetemOptions{});
    CHECK(client.cancel(12345).code() == StatusCode::not_found);
  }
}

TEST_CASE("closing the client completes its pending calls with cancelled") {
  InprocServer server = serve_or_die("inproc://netem-close", echo());
  std::optional<Call> call;
  {
    auto client = connect_or_die(server.address(), NetemOptions{.up = {.latency = seconds(10)}});
    call.emplace(client.call(wire::Frames{{std::string("pending")}}, generous()));
    CHECK_FALSE(call->ready());
  }
  CHECK(call->get().status().code() == StatusCode::cancelled);
}

TEST_CASE("connect refuses a bad link and reports an address with nothing bound") {
  InprocServer server = serve_or_die("inproc://netem-bad", echo());
  auto bad_loss = Netem::connect(server.address(), NetemClientOptions(NetemOptions{.up = {.loss_probability = 2}}));
  CHECK(bad_loss.status().code() == StatusCode::invalid_argument);
  auto bad_latency =
      Netem::connect(server.address(), NetemClientOptions(NetemOptions{.down = {.latency = milliseconds(-1)}}));
  CHECK(bad_latency.status().code() == StatusCode::invalid_argument);
  auto nowhere = Netem::connect("inproc://netem-nothing-here", ClientOptions{});
  CHECK(nowhere.status().code() == StatusCode::unavailable);
}

}  // namespace
}  // namespace swarm
