// certificate: identities that cost something.
//
// With a secret alone, every process that knows it mints a fresh identity at each
// start (join_swarm), so one member can speak as ten. A swarm may also have an
// owner: an Ed25519 key whose holder admits a member by signing the member's public
// key, its role and an expiry into a certificate. Where the members are told the
// owner's public key, a registry record counts only if it carries a certificate for
// its signer (record_seal.h): identities minted without one are refused and
// counted, so the rounds, votes and views built from the records count certified
// identities, one per admission.
//
//   swarm keygen --out owner.key                 # the owner, once: prints its public key
//   swarm keygen --out p0.key                    # a member: prints the key to send the owner
//   swarm admit --owner owner.key --member HEX --role peer --days 30 --out p0.cert
//   swarm peer --owner-key OWNER_HEX --identity p0.key --certificate p0.cert ...
//
// Key files hold a 32-byte Ed25519 seed as hex, readable by their owner only.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "swarm/core/status.h"
#include "swarm/security/identity.h"

namespace swarm::security {

using SigningKey = std::array<unsigned char, 32>;  // an Ed25519 public key

enum class MemberRole { peer, trainer };
const char* role_name(MemberRole role);
Result<MemberRole> role_from_name(std::string_view name);

struct Certificate {
  SigningKey member{};
  MemberRole role = MemberRole::peer;
  int64_t expires_at = 0;  // seconds since the epoch (UTC)
  std::array<unsigned char, 64> signature{};  // the owner's, over the fields above
};

// A certificate's text is one line; longer input is refused before parsing.
inline constexpr size_t kMaxCertificateChars = 400;

// The owner signs: `owner` is the owner's identity (its key file).
Certificate admit(const SwarmIdentity& owner, const SigningKey& member, MemberRole role, int64_t expires_at);

std::string to_text(const Certificate& certificate);
Result<Certificate> certificate_from_text(std::string_view text);

// Whether `certificate` admits `member` into the swarm of `owner` at `now`
// (seconds since the epoch): the owner's signature, the member's key, unexpired.
Status check_certificate(const Certificate& certificate, const SigningKey& owner, const SigningKey& member,
                         int64_t now);

// Whether a caller may use a peer's compute in the swarm of `owner`: `sender` is
// the key the transport authenticated ("curve:Z85"), `certificate_text` what the
// request carried (wire::MessageHeader::credential). It must admit that very key,
// in either role (a trainer calls; so may a peer), unexpired at `now`.
Status check_caller(const SigningKey& owner, const PeerIdentity& sender, std::string_view certificate_text,
                    int64_t now);

// A new key file at `path` (never over an existing file), mode 0600; its identity.
Result<SwarmIdentity> create_key_file(const std::string& path);
// The identity in a key file; refused when others may read it.
Result<SwarmIdentity> load_key_file(const std::string& path);

// join_swarm with a lasting identity and, where the swarm has an owner, this
// identity's certificate from it, checked now (a process whose every record would
// be refused stops at its start instead). With an owner and no certificate, the
// credentials read the swarm's records and announce none that count (swarm status,
// a trainer).
struct Membership {
  SwarmIdentity identity;
  std::optional<SigningKey> owner;
  std::optional<Certificate> certificate;
};
Result<SwarmCredentials> join_swarm_as(const std::string& secret, const Membership& membership, int64_t now);

// The clock certificates expire by: seconds since the epoch (UTC).
int64_t wall_clock_seconds();

Result<SigningKey> signing_key_from_hex(std::string_view hex);
Result<Certificate> load_certificate_file(const std::string& path);

}  // namespace swarm::security
