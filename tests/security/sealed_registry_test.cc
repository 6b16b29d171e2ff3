// Sealed registry records over real OpenDHT nodes: members read each other's
// records; unsigned, forged, impersonating, foreign and far-future values are
// never returned, and each refusal is counted.
#include <chrono>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <opendht.h>

#include <doctest/doctest.h>

#include "swarm/registry/dht_registry.h"
#include "swarm/security/identity.h"
#include "swarm/security/record_seal.h"

namespace swarm {
namespace {

using namespace std::chrono_literals;

struct Member {
  security::SwarmCredentials credentials;
  std::string id;
  DhtRegistry node;
};

DhtRegistryOptions options_with(RecordSealer sealer) {
  DhtRegistryOptions options;
  options.get_timeout = 2s;
  options.per_address_rate_limit = false;
  options.sealer = std::move(sealer);
  return options;
}

DhtRegistry start_node(uint16_t bootstrap_port, DhtRegistryOptions options) {
  std::vector<std::string> bootstrap;
  if (bootstrap_port != 0) bootstrap.push_back(fmt::format("127.0.0.1:{}", bootstrap_port));
  auto node = DhtRegistry::start(0, bootstrap, std::move(options));
  REQUIRE_MESSAGE(node.is_ok(), node.status().to_string());
  return std::move(node).value();
}

Member join(const std::string& secret, const std::string& name, uint16_t bootstrap_port) {
  auto credentials = security::join_swarm(secret);
  REQUIRE(credentials.is_ok());
  auto id = security::peer_id_bound_to(name, credentials->self);
  REQUIRE(id.is_ok());
  DhtRegistry node = start_node(bootstrap_port, options_with(security::make_record_sealer(*credentials)));
  return Member{*credentials, *id, std::move(node)};
}

std::optional<Record> find(const std::vector<Record>& records, const std::string& subkey) {
  for (const auto& r : records) {
    if (r.subkey == subkey) return r;
  }
  return std::nullopt;
}

// Reads until `done` holds or the deadline passes (each get is a bounded network round trip).
std::vector<Record> get_until(DhtRegistry& node, const std::string& key,
                              const std::function<bool(const std::vector<Record>&)>& done,
                              std::chrono::seconds within = 10s) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  std::vector<Record> last;
  while (true) {
    if (auto records = node.get(key); records.is_ok()) last = *records;
    if (done(last) || std::chrono::steady_clock::now() >= deadline) return last;
  }
}

struct Swarm {
  Member a = join("the swarm secret", "a", 0);
  Member b = join("the swarm secret", "b", a.node.port());
  Swarm() {
    REQUIRE(a.node.wait_connected(10s).is_ok());
    REQUIRE(b.node.wait_connected(10s).is_ok());
  }
  double expiry() const { return a.node.now() + 300; }
};

TEST_CASE("members read each other's sealed records as announced") {
  Swarm swarm;
  const std::string value = fmt::format(R"({{"peer": "{}", "address": "tcp://127.0.0.1:7000"}})", swarm.a.id);
  REQUIRE(swarm.a.node.announce("swarm/stage/0", swarm.a.id, value, swarm.expiry()).is_ok());
  auto seen = get_until(swarm.b.node, "swarm/stage/0", [&](const auto& r) { return find(r, swarm.a.id).has_value(); });
  auto record = find(seen, swarm.a.id);
  REQUIRE(record);
  CHECK(record->value == value);
  CHECK(swarm.b.node.refused_seals() == 0);
}

TEST_CASE("unsigned records, records of another swarm and records for another member are refused and counted") {
  Swarm swarm;
  DhtRegistry plain = start_node(swarm.a.node.port(), options_with({}));
  Member stranger = join("another secret", "c", swarm.a.node.port());
  REQUIRE(plain.wait_connected(10s).is_ok());
  REQUIRE(stranger.node.wait_connected(10s).is_ok());
  const std::string key = "swarm/stage/1";

  // Unsigned, under a subkey bound to a real member.
  REQUIRE(plain.announce(key, swarm.b.id, "unsigned", swarm.expiry()).is_ok());
  // Sealed, but by a stranger to this swarm.
  REQUIRE(stranger.node.announce(key, stranger.id, "foreign", swarm.expiry()).is_ok());
  // A member announcing under another member's id, and naming another member in its own record.
  REQUIRE(swarm.a.node.announce(key, swarm.b.id, "impersonation", swarm.expiry()).is_ok());
  const std::string names_b = fmt::format(R"({{"peer": "{}"}})", swarm.b.id);
  REQUIRE(swarm.a.node.announce(key, swarm.a.id, names_b, swarm.expiry()).is_ok());
  // And one honest record, so the reader knows the others had time to arrive.
  const std::string honest_key = "swarm/stage/1-honest";
  REQUIRE(swarm.b.node.announce(honest_key, swarm.b.id, "honest", swarm.expiry()).is_ok());
  REQUIRE(find(get_until(swarm.a.node, honest_key, [&](const auto& r) { return !r.empty(); }), swarm.b.id));

  auto seen = get_until(swarm.b.node, key, [&](const auto&) { return swarm.b.node.refused_seals() >= 3; });
  CHECK(seen.empty());
  CHECK(swarm.b.node.refused_seals() >= 3);
  // The stranger's own node reads nothing of this swarm either.
  auto theirs = stranger.node.get(key);
  if (theirs.is_ok()) {
    for (const auto& r : *theirs) CHECK(r.subkey == stranger.id);
  }
}

// The packed layout of DhtRegistry's values, written by hand as an attacker would.
dht::Blob packed_value(uint64_t seq, double expires_at, const std::string& subkey, const std::string& value) {
  dht::Blob out = {'S', 'W', 'R', '1'};
  auto u64 = [&](uint64_t x) {
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(x >> (8 * i)));
  };
  auto str = [&](const std::string& s) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(s.size() >> (8 * i)));
    out.insert(out.end(), s.begin(), s.end());
  };
  u64(seq);
  u64(std::bit_cast<uint64_t>(expires_at));
  str(subkey);
  str(value);
  return out;
}

TEST_CASE("a value from the far future is refused even in a plaintext swarm") {
  DhtRegistry reader = start_node(0, options_with({}));
  dht::DhtRunner raw;
  dht::DhtRunner::Config config;
  config.threaded = true;
  config.dht_config.node_config.network = DhtRegistryOptions{}.network_id;
  config.dht_config.node_config.max_peer_req_per_sec = -1;
  dht::SockAddr bind;
  bind.setFamily(AF_INET);
  bind.setAddress("127.0.0.1");
  bind.setPort(0);
  config.bind4 = bind;
  raw.run(config, {});
  raw.bootstrap("127.0.0.1", std::to_string(reader.port()));
  REQUIRE(reader.wait_connected(10s).is_ok());

  const double now = DhtRegistry::system_seconds();
  const uint64_t in_an_hour = static_cast<uint64_t>((now + 3600) * 1e9);
  auto future = std::make_shared<dht::Value>(0x5357, packed_value(in_an_hour, now + 300, "peer-x", "ahead"), 7);
  auto forever = std::make_shared<dht::Value>(0x5357, packed_value(static_cast<uint64_t>(now * 1e9), now + 1e9,
                                                                    "peer-y", "forever"), 8);
  raw.put(dht::InfoHash::get("swarm/progress/0"), future);
  raw.put(dht::InfoHash::get("swarm/progress/0"), forever);
  auto seen = get_until(reader, "swarm/progress/0", [&](const auto&) { return reader.untimely_records() >= 2; });
  CHECK(seen.empty());
  CHECK(reader.untimely_records() >= 2);
  raw.join();
}

}  // namespace
}  // namespace swarm
