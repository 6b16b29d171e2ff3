// ClientCache over the in-process transport: one client per address, and
// clients nobody has used for the idle time are dropped on a later get().
#include "swarm/protocol/client_cache.h"

#include <chrono>
#include <memory>
#include <string>

#include <doctest/doctest.h>

#include "transports/inproc/inproc_transport.h"

namespace swarm {
namespace {

using namespace std::chrono_literals;

InprocServer echo_server(const std::string& address) {
  auto server = InprocTransport::bind(address, {});
  REQUIRE_MESSAGE(server.is_ok(), server.status().to_string());
  REQUIRE(server->serve([](const PeerIdentity&, wire::Frames f) { return f; }).is_ok());
  return std::move(server).value();
}

// Calls `use` until `done` holds or ten seconds pass; true if it held.
template <typename Use, typename Done>
bool keep_using_until(Use use, Done done) {
  const Deadline give_up = Clock::now() + 10s;
  while (!done()) {
    if (Clock::now() >= give_up) return false;
    use();
  }
  return true;
}

TEST_CASE("one client per address, reused while in use") {
  InprocServer a = echo_server("inproc://cache-reuse-a");
  InprocServer b = echo_server("inproc://cache-reuse-b");
  ClientCache<InprocTransport> cache;
  auto first = cache.get(a.address());
  REQUIRE(first != nullptr);
  CHECK(cache.get(a.address()) == first);
  CHECK(cache.get(b.address()) != first);
  CHECK(cache.size() == 2);
  CHECK(cache.get("inproc://cache-nobody") == nullptr);
  CHECK(cache.size() == 2);
  cache.forget(a.address());
  CHECK(cache.size() == 1);
  CHECK(first->call(wire::Frames{{std::string("still works")}}, Clock::now() + 10s).get().is_ok());
}

TEST_CASE("a client unused for longer than the idle time is dropped on a later get") {
  InprocServer idle = echo_server("inproc://cache-idle");
  InprocServer busy = echo_server("inproc://cache-busy");
  ClientCache<InprocTransport> cache({}, 200ms);
  std::weak_ptr<InprocClient> idle_client = cache.get(idle.address());
  REQUIRE_FALSE(idle_client.expired());  // the cache holds it
  REQUIRE(cache.get(busy.address()) != nullptr);
  CHECK(cache.size() == 2);

  // Only the cache held the idle client, so it is freed once dropped.
  CHECK(keep_using_until([&] { (void)cache.get(busy.address()); }, [&] { return idle_client.expired(); }));
  CHECK(cache.size() == 1);
  // Asking again connects afresh.
  auto again = cache.get(idle.address());
  REQUIRE(again != nullptr);
  CHECK(again->call(wire::Frames{{std::string("hi")}}, Clock::now() + 10s).get().is_ok());
  CHECK(cache.size() == 2);
}

TEST_CASE("a client still held by a caller is kept however long it idles") {
  InprocServer held_server = echo_server("inproc://cache-held");
  InprocServer other = echo_server("inproc://cache-other");
  ClientCache<InprocTransport> cache({}, 1ms);
  auto held = cache.get(held_server.address());
  REQUIRE(held != nullptr);
  const Deadline long_idle = Clock::now() + 50ms;
  CHECK(keep_using_until([&] { (void)cache.get(other.address()); }, [&] { return Clock::now() > long_idle; }));
  CHECK(cache.get(held_server.address()) == held);
}

}  // namespace
}  // namespace swarm
