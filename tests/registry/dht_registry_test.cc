// The OpenDHT registry with real nodes on 127.0.0.1: records travel between
// nodes, re-announcements replace, expired and withdrawn records stay hidden.
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <doctest/doctest.h>

#include "swarm/registry/dht_registry.h"

namespace swarm {
namespace {

using namespace std::chrono_literals;

DhtRegistryOptions test_options() {
  DhtRegistryOptions options;
  options.get_timeout = 2s;
  options.per_address_rate_limit = false;  // every node here is 127.0.0.1
  return options;
}

// A seed node and two nodes that bootstrap from it, as a swarm would start.
struct ThreeNodes {
  DhtRegistry seed = start({});
  DhtRegistry a = start({fmt::format("127.0.0.1:{}", seed.port())});
  DhtRegistry c = start({fmt::format("127.0.0.1:{}", seed.port())});

  ThreeNodes() {
    for (DhtRegistry* node : {&seed, &a, &c}) {
      auto status = node->wait_connected(10s);
      REQUIRE_MESSAGE(status.is_ok(), status.to_string());
    }
  }

  static DhtRegistry start(std::vector<std::string> bootstrap) {
    auto node = DhtRegistry::start(0, std::move(bootstrap), test_options());
    REQUIRE_MESSAGE(node.is_ok(), node.status().to_string());
    return std::move(node).value();
  }
};

std::optional<Record> find(const std::vector<Record>& records, const std::string& subkey) {
  for (const auto& r : records) {
    if (r.subkey == subkey) return r;
  }
  return std::nullopt;
}

bool has(const std::vector<Record>& records, const std::string& subkey) {
  return find(records, subkey).has_value();
}

// Re-reads until `done` holds or the deadline passes; returns the last read.
// Each get is itself a network round trip bounded by get_timeout, so the loop
// paces itself: it re-checks the condition until it holds or the deadline passes.
std::vector<Record> get_until(DhtRegistry& node, const std::string& key,
                              const std::function<bool(const std::vector<Record>&)>& done,
                              std::chrono::seconds within = 10s) {
  auto deadline = std::chrono::steady_clock::now() + within;
  std::vector<Record> last;
  while (true) {
    auto records = node.get(key);
    if (records.is_ok()) {
      last = *records;
      if (done(last)) return last;
    }
    if (std::chrono::steady_clock::now() >= deadline) return last;
  }
}

TEST_CASE("a record announced on one node becomes visible from the others") {
  ThreeNodes nodes;
  CHECK(nodes.seed.port() != 0);
  CHECK(nodes.a.port() != nodes.seed.port());
  double expires = nodes.a.now() + 300;
  REQUIRE(nodes.a.announce("stage/0", "peer-a", R"({"port": 7000})", expires).is_ok());

  auto seen = get_until(nodes.c, "stage/0", [](const auto& r) { return has(r, "peer-a"); });
  REQUIRE(seen.size() == 1);
  CHECK(seen[0] == Record{"stage/0", "peer-a", R"({"port": 7000})", expires});

  seen = get_until(nodes.seed, "stage/0", [](const auto& r) { return has(r, "peer-a"); });
  CHECK(find(seen, "peer-a"));
  // Keys are independent.
  auto other = nodes.c.get("stage/1");
  REQUIRE(other.is_ok());
  CHECK(other->empty());
}

TEST_CASE("re-announcing a subkey replaces its value, from the same or another node") {
  ThreeNodes nodes;
  double expires = nodes.a.now() + 300;
  REQUIRE(nodes.a.announce("stage/0", "peer-a", "first", expires).is_ok());
  REQUIRE(nodes.a.announce("stage/0", "peer-b", "other", expires).is_ok());
  auto has_value = [](std::string value) {
    return [value](const std::vector<Record>& r) {
      auto rec = find(r, "peer-a");
      return rec && rec->value == value && has(r, "peer-b");
    };
  };
  auto seen = get_until(nodes.c, "stage/0", has_value("first"));
  REQUIRE(find(seen, "peer-a"));

  REQUIRE(nodes.a.announce("stage/0", "peer-a", "second", expires + 1).is_ok());
  seen = get_until(nodes.c, "stage/0", has_value("second"));
  REQUIRE(seen.size() == 2);
  CHECK(find(seen, "peer-a")->value == "second");
  CHECK(find(seen, "peer-a")->expires_at == expires + 1);
  CHECK(find(seen, "peer-b")->value == "other");

  // A peer that moved to another node re-announces the same subkey from there.
  REQUIRE(nodes.c.announce("stage/0", "peer-a", "third", expires).is_ok());
  seen = get_until(nodes.a, "stage/0", has_value("third"));
  REQUIRE(find(seen, "peer-a"));
  CHECK(find(seen, "peer-a")->value == "third");
  CHECK(seen.size() == 2);
}

TEST_CASE("storage nodes keep the replacement, not the first announcement") {
  ThreeNodes nodes;
  double expires = nodes.a.now() + 300;
  REQUIRE(nodes.a.announce("stage/0", "peer-a", "first", expires).is_ok());
  auto seen = get_until(nodes.seed, "stage/0", [](const auto& r) { return has(r, "peer-a"); });
  REQUIRE(has(seen, "peer-a"));
  REQUIRE(nodes.c.announce("stage/0", "peer-a", "second", expires).is_ok());
  seen = get_until(nodes.a, "stage/0", [](const auto& r) {
    return has(r, "peer-a") && find(r, "peer-a")->value == "second";
  });
  REQUIRE(has(seen, "peer-a"));

  // With both announcers gone, only the seed's stored copy answers: OpenDHT
  // refuses to overwrite a stored value by default, so this checks the
  // registry's own value type let the newer announcement in.
  { DhtRegistry gone = std::move(nodes.a); }
  { DhtRegistry gone = std::move(nodes.c); }
  seen = get_until(nodes.seed, "stage/0", [](const auto& r) {
    return has(r, "peer-a") && find(r, "peer-a")->value == "second";
  });
  REQUIRE(has(seen, "peer-a"));
  CHECK(find(seen, "peer-a")->value == "second");
}

TEST_CASE("expired and withdrawn records are not returned") {
  ThreeNodes nodes;
  double t = nodes.a.now();
  CHECK(t == doctest::Approx(DhtRegistry::system_seconds()).epsilon(1e-6));
  REQUIRE(nodes.a.announce("stage/0", "expired", "old", t - 1).is_ok());
  REQUIRE(nodes.a.announce("stage/0", "leaving", "bye", t + 300).is_ok());
  REQUIRE(nodes.a.announce("stage/0", "live", "here", t + 300).is_ok());

  // Announced together, so once the live records arrive the expired one has had
  // the same chance to.
  auto seen = get_until(nodes.c, "stage/0",
                        [](const auto& r) { return has(r, "live") && has(r, "leaving"); });
  REQUIRE(find(seen, "live"));
  CHECK(!find(seen, "expired"));
  CHECK(seen.size() == 2);

  REQUIRE(nodes.a.withdraw("stage/0", "leaving").is_ok());
  seen = get_until(nodes.c, "stage/0", [](const auto& r) { return !has(r, "leaving"); });
  CHECK(!find(seen, "leaving"));
  CHECK(find(seen, "live"));
  // The node that withdrew agrees at once: its own copy was replaced.
  auto local = nodes.a.get("stage/0");
  REQUIRE(local.is_ok());
  CHECK(!find(*local, "leaving"));
}

TEST_CASE("bad addresses and busy ports are errors, not exceptions") {
  auto bad_host = DhtRegistry::start(0, {"not-an-ip:4222"}, test_options());
  CHECK(bad_host.status().code() == StatusCode::invalid_argument);
  auto no_port = DhtRegistry::start(0, {"127.0.0.1"}, test_options());
  CHECK(no_port.status().code() == StatusCode::invalid_argument);
  auto bad_port = DhtRegistry::start(0, {"127.0.0.1:99999"}, test_options());
  CHECK(bad_port.status().code() == StatusCode::invalid_argument);
  DhtRegistryOptions bad_bind = test_options();
  bad_bind.bind_address = "localhost";
  CHECK(DhtRegistry::start(0, {}, bad_bind).status().code() == StatusCode::invalid_argument);

  auto first = DhtRegistry::start(0, {}, test_options());
  REQUIRE(first.is_ok());
  auto second = DhtRegistry::start(first->port(), {}, test_options());
  CHECK(!second.is_ok());
}

TEST_CASE("an oversized record is refused before it reaches the DHT") {
  auto node = DhtRegistry::start(0, {}, test_options());
  REQUIRE(node.is_ok());
  auto status = node->announce("stage/0", "big", std::string(70 * 1024, 'x'), node->now() + 60);
  CHECK(status.code() == StatusCode::invalid_argument);
}

}  // namespace
}  // namespace swarm
