// curve_keys: CURVE key pairs for the ZeroMQ transport, random or derived from
// a swarm-wide secret.
//
// Two ways to secure a swarm: every peer has its own pair and servers hold an
// allow-list of client public keys, or everyone shares one secret phrase and
// derives the same swarm pair from it (BLAKE2b via libsodium), so only holders
// of the phrase can connect or be connected to.
//
//   auto security = swarm::zmq_transport::shared_secret_security("correct horse battery");
//   ServerOptions server_options{.worker_threads = 2, .security = *security};
#pragma once

#include <string>

#include "swarm/core/status.h"
#include "swarm/api/transport.h"

namespace swarm::zmq_transport {

// A fresh random pair (Z85 text).
Result<CurveKeyPair> generate_curve_keypair();

// The pair derived from `secret` and a `label` (so one secret can feed several
// independent swarms). Errors on an empty secret.
Result<CurveKeyPair> derive_curve_keypair(const std::string& secret, const std::string& label = "swarm");

// Options for both servers and clients of a swarm keyed by one shared secret:
// CURVE on, the derived pair as both this side's and the expected server's
// key, and the derived public key as the only allowed client.
Result<SecurityOptions> shared_secret_security(const std::string& secret,
                                               const std::string& label = "swarm");

}  // namespace swarm::zmq_transport
