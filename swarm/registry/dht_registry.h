// dht_registry: a Registry over OpenDHT, for peers in separate processes or on
// separate machines.
//
// Each node is a full DHT node; a bootstrap node is just the first one started,
// and the others name it. Expiry is wall-clock seconds since the epoch so that
// separate processes agree on it.
//
//   auto seed = swarm::DhtRegistry::start(0, {});
//   auto node = swarm::DhtRegistry::start(0, {fmt::format("127.0.0.1:{}", seed->port())});
//   (void)node->announce("stage/0", "peer-a", "{}", node->now() + 300);
//
// Records live in the DHT for at most DhtRegistry::kDhtLifetimeSeconds whatever
// their expires_at: announcers must refresh more often than that (the design's
// 30 s refresh of 300 s records does). Records are unsigned: like the peer list
// they describe, they are advisory, and transports authenticate the peers.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "swarm/core/status.h"
#include "swarm/api/registry.h"

namespace swarm {

struct DhtRegistryOptions {
  // IPv4 address to bind. Loopback keeps a test swarm off the real network;
  // "0.0.0.0" serves every interface. IPv6 is not bound.
  std::string bind_address = "127.0.0.1";
  // Nodes only talk to nodes of the same network id; non-zero keeps swarm off
  // the public OpenDHT network (id 0) even when a bootstrap address is wrong.
  uint32_t network_id = 0x5357524d;  // "SWRM"
  // How long get() waits for the DHT lookup before giving up.
  std::chrono::milliseconds get_timeout{5000};
  // Every node of a loopback swarm shares one source address, which OpenDHT's
  // per-address rate limit would treat as one abusive peer.
  bool per_address_rate_limit = true;
  // Values whose sequence (wall-clock) lies further ahead than this, or whose
  // expiry lies beyond the DHT lifetime plus this, are refused and counted.
  double max_clock_skew_seconds = 60.0;
  // Secured swarms: every value is sealed on put, and a value whose seal does not
  // open is neither stored by this node nor returned by get (and is counted).
  RecordSealer sealer;
};

class DhtRegistry {
 public:
  using registry_concept = registry_t;

  // DHT-level lifetime of every stored value (OpenDHT's default expiration).
  static constexpr double kDhtLifetimeSeconds = 600.0;

  // Binds `port` (0 = any free port) and bootstraps from "host:port" nodes
  // (numeric IPv4). Errors: bad address, port in use.
  static Result<DhtRegistry> start(uint16_t port, std::vector<std::string> bootstrap_nodes,
                                   DhtRegistryOptions options = {});

  DhtRegistry(DhtRegistry&&) noexcept;
  DhtRegistry& operator=(DhtRegistry&&) noexcept;
  ~DhtRegistry();  // leaves the DHT and joins its threads

  // Queues the put and returns: the DHT stores it in the background, and
  // readers see it once it reaches them. Replaces an earlier announce of the
  // same key and subkey (from any node), as the newer announcement wins.
  Status announce(const std::string& key, const std::string& subkey, std::string value,
                  double expires_at);
  // Blocks up to options.get_timeout. Returns what arrived by then; errors only
  // when nothing arrived and the lookup failed or timed out.
  Result<std::vector<Record>> get(const std::string& key);
  // Puts a tombstone that hides the record everywhere until it would have
  // expired from the DHT anyway.
  Status withdraw(const std::string& key, const std::string& subkey);
  // Wall-clock seconds since the Unix epoch.
  double now() const;

  uint16_t port() const;

  // Whether this node has heard back from at least one peer. A node that just
  // started, or that others bootstrapped from, answers gets only from its own
  // store until then; wait_connected is for callers that need the network.
  bool connected() const;
  Status wait_connected(std::chrono::milliseconds within);

  static double system_seconds();

  // Values refused so far, by this node's gets and its storage alike: with
  // implausible timestamps, and (secured swarms) unsigned or forged.
  uint64_t untimely_records() const;
  uint64_t refused_seals() const;

 private:
  struct Impl;
  explicit DhtRegistry(std::unique_ptr<Impl> impl);
  Status put(const std::string& key, const std::string& subkey, std::string value,
             double expires_at);

  std::unique_ptr<Impl> impl_;
};

static_assert(Registry<DhtRegistry>);

}  // namespace swarm
