// hop_chain: who handed a peer-to-peer microbatch to whom, signed at every
// hand-off, so that a peer takes a forward only on a path its trainer started.
//
// Peer to peer, a stage hears of a microbatch from the stage before, never
// from its trainer. Without more, any member could send a stage forwards under
// another trainer's ids: ahead of the honest path they would be computed and
// accumulated, and the honest one answered as a retry. So the trainer signs
// the start of each attempt (its id, the microbatch, the attempt, the
// deadline) together with the first peer it hands it to, and every peer that
// hands it on signs the link to the next, over the link before. A stage checks
// the chain back to the trainer, that each signer's key is the one its id is
// bound to, that the chain ends at itself, and that the transport's
// authenticated sender is its last signer. A peer can then only pass on what
// was handed to it.
//
//   HopChain chain = start_hop_chain(trainer, "trainer0.FP", {7, 1, deadline_ms}, "s0p0.FP");
//   extend_hop_chain(chain, s0, "s0p0.FP", "s1p2.FP");            // at stage 0
//   SWARM_RETURN_IF_ERROR(check_hop_chain(chain, "s1p2.FP", sender, /*max_links=*/8));  // at stage 1
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "swarm/api/transport.h"
#include "swarm/core/status.h"
#include "swarm/security/identity.h"

namespace swarm::security {

struct HopStart {
  uint64_t microbatch = 0;
  uint32_t attempt = 0;
  int64_t deadline_unix_ms = 0;
  friend bool operator==(const HopStart&, const HopStart&) = default;
};

struct HopLink {
  std::string from;  // the signer's peer id; links[0]'s is the trainer's
  std::array<unsigned char, 32> from_key{};  // its Ed25519 key, bound to `from` by its fingerprint
  std::string to;
  std::array<unsigned char, 64> signature{};
};

struct HopChain {
  std::string trainer;
  HopStart start;
  std::vector<HopLink> links;
};

// Ids in a chain are bound peer ids (NAME.FINGERPRINT) of at most this many bytes.
inline constexpr size_t kMaxHopIdBytes = 96;

HopChain start_hop_chain(const SwarmIdentity& trainer, std::string_view trainer_id, HopStart start,
                         std::string_view first_peer);
void extend_hop_chain(HopChain& chain, const SwarmIdentity& self, std::string_view self_id, std::string_view next_peer);

// ok when the chain is the trainer's, every link signed by the key its `from`
// is bound to over the link before, it ends at `me`, and `sender` (the key the
// transport authenticated) speaks for its last signer. permission_denied (what
// failed) otherwise; invalid_argument beyond max_links.
Status check_hop_chain(const HopChain& chain, std::string_view me, const PeerIdentity& sender, size_t max_links);

// A compact binary form for the wire; parsing refuses anything malformed,
// longer than its counts say, or beyond max_links, before it allocates for it.
std::string hop_chain_bytes(const HopChain& chain);
Result<HopChain> hop_chain_from_bytes(std::string_view bytes, size_t max_links);

}  // namespace swarm::security
