// identity: who a process is in a secured swarm, and how the others check it.
//
// One secret admits a process to a swarm; one key pair per process says which
// member it is. From the secret every member derives the same two things: the
// CURVE pair that all its servers present (a client that does not know the
// server's public key cannot complete a CURVE handshake, so knowing the secret is
// what admits it) and a membership key that MACs a member's signing key. Each
// process also makes a fresh Ed25519 pair: it signs the process's registry records,
// and its CURVE conversion is the process's client key, which the server
// authenticates. A peer's id ends in the fingerprint of that client key, so the
// id a message or record claims can be checked against the key that sent it, and
// one member cannot speak for another.
//
//   SWARM_ASSIGN_OR_RETURN(auto credentials, swarm::security::join_swarm(secret));
//   config.server.security = credentials.server_options();
//   config.client.security = credentials.client_options();
//   config.peer_id = swarm::security::peer_id_bound_to("stage0", credentials.self);
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "swarm/api/transport.h"
#include "swarm/core/ids.h"
#include "swarm/core/status.h"

namespace swarm::security {

// Hex of a 128-bit BLAKE2b of the raw CURVE public key: collisions cost 2^64 work.
inline constexpr size_t kFingerprintHexChars = 32;

struct SwarmIdentity {
  std::array<unsigned char, 32> signing_public{};  // Ed25519
  std::array<unsigned char, 64> signing_secret{};
  CurveKeyPair curve;       // the Ed25519 pair converted to X25519, Z85 text
  std::string fingerprint;  // of curve.public_key
};

struct SwarmCredentials {
  CurveKeyPair swarm_server;                      // derived from the secret, the same for every member
  std::array<unsigned char, 32> membership_key{};  // derived from the secret
  SwarmIdentity self;
  // Where the swarm has an owner (certificate.h): the owner's Ed25519 public key,
  // which every record must carry a certificate from, and this process's own
  // certificate, as text. Unset and empty in a swarm of the secret alone.
  std::optional<std::array<unsigned char, 32>> owner;
  std::string certificate;

  // CURVE on, the swarm's server pair, any client key admitted (the handshake
  // itself proves the client knew the server key).
  SecurityOptions server_options() const;
  // CURVE on, this process's own pair, the swarm's server key expected.
  SecurityOptions client_options() const;
};

// The swarm's derived keys plus a fresh identity. Errors on an empty secret or a
// libzmq without CURVE.
Result<SwarmCredentials> join_swarm(const std::string& secret);

// The identity an Ed25519 seed makes, the same every time (a key file's:
// certificate.h); join_swarm's is from a random seed.
Result<SwarmIdentity> identity_from_seed(const std::array<unsigned char, 32>& seed);

// The fingerprint of a Z85 CURVE public key (40 characters).
Result<std::string> fingerprint_of_curve_key(std::string_view z85_public_key);
// The fingerprint of the CURVE key converted from an Ed25519 public key.
Result<std::string> fingerprint_of_signing_key(const std::array<unsigned char, 32>& signing_public);

// "NAME.FINGERPRINT". NAME may not contain '.'.
Result<std::string> peer_id_bound_to(std::string_view name, const SwarmIdentity& identity);
// The fingerprint at the end of a bound peer id, or empty when it has none.
std::string_view fingerprint_in(std::string_view peer_id);

// True when `peer_id` is bound to the key the transport authenticated for
// `sender` ("curve:Z85" from the ZeroMQ transport). False for an unauthenticated
// sender, so only secured swarms should ask.
bool speaks_for(std::string_view peer_id, const PeerIdentity& sender);

// Keyed BLAKE2b-256 of `message` under the membership key, as hex.
std::string membership_tag(const std::array<unsigned char, 32>& membership_key,
                           const std::array<unsigned char, 32>& signing_public);

std::string to_hex(const unsigned char* data, size_t size);
// Exactly `out.size()` bytes of lowercase or uppercase hex; false otherwise.
bool from_hex(std::string_view text, unsigned char* out, size_t size);

}  // namespace swarm::security
