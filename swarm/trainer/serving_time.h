// serving_time: what one answered call tells the router of a peer's speed.
//
// A round trip also holds time that says nothing of how fast the peer serves: the
// call sat behind this trainer's earlier calls to the same peer (a peer serves its
// requests in turn), and the peer held it for a forward hold or a round's step,
// which cost a fast peer as long as a slow one. Left in, two peers of a stage got
// about equal work however their speeds differed (0.52 of it to a 2x faster peer).
// The queueing is the trainer's own measure; the waits are the peer's word
// (StageReply::waited_us), so their effect is bounded.
//
//   const ServingTime t = serving_time({started, replied_at, peer_last_replied_at, reply.waited_us});
//   router.report(peer, kind, batch, Outcome::success, t.seconds, replied_at);
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

namespace swarm {

// The most of a call's time the peer's reported wait may take out. A peer that
// claims to have waited throughout then looks at most 1 / (1 - 0.9) = 10 times
// faster than it serves, and draws that much more work, rather than looking
// infinitely fast and drawing it all. Measured (swarm local, 2 peers per stage, one
// 2x slower, 2 in flight): the fast peer's waits passed 0.9 of its time in 4% of
// its replies, 0.75 in 31%.
inline constexpr double kMaxExcusedShare = 0.9;

// One answered call, in seconds on the trainer's clock.
struct AnsweredCall {
  double started = 0;
  double replied_at = 0;
  // When the same peer last answered this trainer before this reply; -inf: never.
  double previous_reply = -std::numeric_limits<double>::infinity();
  uint32_t waited_us = 0;  // the peer's word
};

struct ServingTime {
  double seconds = 0;         // within [0, replied_at - started]
  bool wait_refused = false;  // a wait longer than the round trip: impossible, so not believed
};

inline ServingTime serving_time(const AnsweredCall& call) {
  const double end = std::max(call.started, call.replied_at);
  const double reported = static_cast<double>(call.waited_us) * 1e-6;
  const bool refused = reported > end - call.started;
  // The peer took this call up no sooner than it answered the one ahead of it.
  const double at_peer = end - std::clamp(call.previous_reply, call.started, end);
  const double waited = refused ? 0.0 : std::min(reported, kMaxExcusedShare * at_peer);
  return {at_peer - waited, refused};
}

}  // namespace swarm
