// router: the Router concept, the policy that picks which peer of a stage serves a task.
//
// A router is a pure policy (DESIGN §2, §3): it is told the registry's view of one
// stage and every outcome, is handed the time as an argument, and returns decisions.
// It reads no clock, does no I/O and starts no threads, so the trainer, tests with a
// fake clock and the simulator all run the same code. It opts in explicitly with
// `using router_concept = swarm::router_t;`. Implementations live in swarm/wiring.
//
//   template <swarm::Router R>
//   std::optional<swarm::PeerId> pick(R& r, double now, const std::vector<swarm::PeerId>& tried) {
//     return r.choose(swarm::TaskKind::forward, /*task_size=*/1, now, tried);
//   }
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "swarm/core/ids.h"

namespace swarm {

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

}  // namespace swarm
