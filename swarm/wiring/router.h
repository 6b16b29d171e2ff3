// router (wiring): what the routers in this package share: the ban list.
// The Router concept itself is swarm/api/router.h.
#pragma once

#include <algorithm>
#include <vector>

#include "swarm/api/router.h"
#include "swarm/core/random.h"

namespace swarm {

namespace wiring {

// Exclude lists hold the few peers already tried for one task, so a scan beats a set.
inline bool contains(const std::vector<PeerId>& ids, const PeerId& id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

using swarm::SplitMix64;

// Which peers an error has banned, and the record expiry each was banned under.
// A peer comes back only when it re-announces with a later expiry: a fresh record
// means it restarted or recovered, the same record is the same broken peer.
class BanList {
 public:
  void ban(const PeerId& id, double expires_at) {
    for (Entry& e : entries_) {
      if (e.id == id) {
        e.expires_at = std::max(e.expires_at, expires_at);
        return;
      }
    }
    entries_.push_back({id, expires_at});
  }

  // True while `a` is still the record the peer was banned under; lifts the ban otherwise.
  bool still_banned(const PeerAnnouncement& a) {
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (entries_[i].id != a.id) continue;
      if (a.expires_at > entries_[i].expires_at) {
        entries_[i] = entries_.back();
        entries_.pop_back();
        return false;
      }
      return true;
    }
    return false;
  }

  // Once `now` passes a banned record's expiry, any record the registry still holds
  // is a later one, so forgetting the ban changes no decision and bounds memory.
  void forget_expired(double now) {
    std::erase_if(entries_, [now](const Entry& e) { return e.expires_at <= now; });
  }

  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    PeerId id;
    double expires_at;
  };
  std::vector<Entry> entries_;  // bans are rare; a vector keeps iteration order deterministic
};

}  // namespace wiring
}  // namespace swarm
