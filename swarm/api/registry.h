// registry: the Registry concept, soft-state records with subkeys and expiry.
//
// Peers announce who they are and how they are doing (peer lists, loads,
// training progress) as records that vanish unless refreshed, so a dead peer
// drops out without anyone having to notice it died. A registry opts in with
// `using registry_concept = swarm::registry_t;` (the right member names
// without the tag are not enough). Expiry is on the registry's own clock:
//
//   template <swarm::Registry R>
//   swarm::Status announce_peer(R& registry, const std::string& stage, const std::string& id) {
//     return registry.announce("stage/" + stage, id, "{\"port\": 7000}", registry.now() + 300);
//   }
#pragma once

#include <concepts>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "swarm/core/status.h"

namespace swarm {

struct registry_t {};

// One announcement. A key holds at most one live record per subkey (typically
// the announcing peer's id); value is opaque to the registry (JSON, say).
struct Record {
  std::string key;
  std::string subkey;
  std::string value;
  double expires_at = 0.0;  // seconds on the registry's clock, see now()

  friend bool operator==(const Record&, const Record&) = default;
};

// What a registry that keeps records on other machines stores for one
// announcement. `scope` names the key as the storing machines see it (for
// OpenDHT, the key's hash), so they can check a seal without knowing the key.
struct StoredRecord {
  std::string scope;
  std::string subkey;
  uint64_t seq = 0;         // the announcer's ordering of its announcements
  double expires_at = 0.0;
  std::string value;
};

// Seals for secured swarms: seal turns a record into the bytes stored for its
// value; open checks stored bytes and gives the announced value back, or an
// error saying why they are refused (unsigned, forged, not a member). Both cover
// every field, the ordering ones included, so none can be changed in transit.
struct RecordSealer {
  std::function<Result<std::string>(const StoredRecord&)> seal;
  std::function<Result<std::string>(const StoredRecord&)> open;
  explicit operator bool() const { return seal && open; }
};

// announce replaces the record of the same key and subkey; get returns only
// unexpired records, the newest per subkey; withdraw removes one before it
// expires; now() is the clock expires_at is measured on, so callers set expiry
// relative to it rather than to a clock the registry does not share.
template <typename R>
concept Registry =
    std::same_as<typename R::registry_concept, registry_t> &&
    requires(R& r, const R& cr, const std::string& s, std::string v, double t) {
      { r.announce(s, s, std::move(v), t) } -> std::same_as<Status>;
      { r.get(s) } -> std::same_as<Result<std::vector<Record>>>;
      { r.withdraw(s, s) } -> std::same_as<Status>;
      { cr.now() } -> std::same_as<double>;
    };

}  // namespace swarm
