// router: the Router concept, the policy that picks which peer of a stage serves a task.
//
// A router is a pure policy (DESIGN §2, §3): it is told the registry's view of one
// stage and every outcome, is handed the time as an argument, and returns decisions.
// It reads no clock, does no I/O and starts no threads, so the trainer, tests with a
// fake clock and the simulator all run the same code. It opts in explicitly with
// `using router_concept = swarm::router_t;`.
//
//   template <swarm::Router R>
//   std::optional<swarm::PeerId> pick(R& r, double now, const std::vector<swarm::PeerId>& tried) {
//     return r.choose(swarm::TaskKind::forward, /*task_size=*/1, now, tried);
//   }
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "swarm/core/random.h"

namespace swarm {

using PeerId = std::string;

enum class TaskKind { forward, backward };

// timeout and error differ on purpose: a timeout may be a slow or overloaded peer
// (it stays usable, just slower), an error is a peer that cannot serve (it is banned).
enum class Outcome { success, timeout, error };

// One registry record of a stage's peer, as the trainer last read it.
struct PeerAnnouncement {
  PeerId id;
  double expires_at = 0;
  int64_t queue_length = 0;  // samples waiting at the peer when it announced
};

struct router_t {};

template <typename R>
concept Router =
    std::same_as<typename R::router_concept, router_t> &&
    requires(R& r, const R& cr, const std::vector<PeerAnnouncement>& peers,
             const std::vector<PeerId>& exclude, const PeerId& peer, TaskKind kind,
             int64_t task_size, Outcome outcome, double seconds) {
      { r.set_peers(peers, seconds) } -> std::same_as<void>;
      { r.choose(kind, task_size, seconds) } -> std::same_as<std::optional<PeerId>>;
      { r.choose(kind, task_size, seconds, exclude) } -> std::same_as<std::optional<PeerId>>;
      { r.report(peer, kind, task_size, outcome, seconds, seconds) } -> std::same_as<void>;
      { cr.usable_peers() } -> std::convertible_to<size_t>;
    };

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
