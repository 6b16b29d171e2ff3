// clock: the one monotonic clock of the runtime, and absolute deadlines on it.
//
// Deadlines are absolute so that one survives being passed down through retries
// and hops. Policies never read this clock: they take the time as an argument.
//
//   swarm::Deadline until = swarm::deadline_after(2.5);
#pragma once

#include <chrono>

namespace swarm {

// How far apart the wall clocks of a swarm's machines may be. A timestamp from a
// stranger further ahead than this is refused: it would stay fresh for ever.
inline constexpr double kMaxClockSkewSeconds = 60.0;


using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

inline Deadline deadline_after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

}  // namespace swarm
