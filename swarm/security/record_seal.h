// record_seal: signed registry records, so a stranger on the DHT cannot inject,
// alter or shadow what a swarm's members announce.
//
// A sealed value is JSON: the announced value, the announcer's Ed25519 key, a
// membership tag (a MAC of that key under the key derived from the swarm secret:
// only members can make one) and a signature over every stored field. Opening
// also checks that the subkey (the announcer's peer id) is bound to the signing
// key's fingerprint, and that a JSON value naming a "peer" names that same id, so
// a member can only ever announce as itself. Where the swarm has an owner
// (credentials.owner), a value also carries its signer's certificate, and one
// without a valid peer certificate for its signer is refused (certificate.h).
//
//   DhtRegistryOptions options;
//   options.sealer = swarm::security::make_record_sealer(credentials);
#pragma once

#include <cstdint>
#include <functional>

#include "swarm/api/registry.h"
#include "swarm/security/identity.h"

namespace swarm::security {

// Refuses values over this many bytes before parsing them.
inline constexpr size_t kMaxSealedBytes = 60 * 1024;

// wall_seconds: the clock certificates expire by (seconds since the epoch); unset,
// the system clock.
RecordSealer make_record_sealer(const SwarmCredentials& credentials, std::function<int64_t()> wall_seconds = {});

}  // namespace swarm::security
