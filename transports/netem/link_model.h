// link_model: the pure policy of the network emulator, deciding WHEN (and
// whether) a message crosses one direction of a link, and which scheduled
// faults cut a peer off. No clock and no I/O: times come in, times go out, so
// the same code runs in the emulating transport, the simulator and tests.
//
//   swarm::netem::LinkModel up({.bandwidth_bytes_per_s = 25e6, .latency = 50ms}, /*seed=*/7);
//   auto delivery = up.schedule(now, frame_bytes(frames));   // deliver_at = now + 1 s + 50 ms for 25 MB
//   swarm::netem::FaultSchedule faults;
//   faults.drop_between("stage1-peer3", t, t2);              // faults.dropped("stage1-peer3", t) == true
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "swarm/core/random.h"
#include "swarm/api/transport.h"
#include "swarm/core/status.h"

namespace swarm::netem {

using Clock = std::chrono::steady_clock;
using Duration = Clock::duration;

using swarm::SplitMix64;

// One direction of a link, in the terms netem and tc use.
struct LinkSpec {
  double bandwidth_bytes_per_s = 0;  // 0 = unlimited
  Duration latency{0};               // one-way propagation delay
  Duration jitter{0};                // extra delay, uniform in [0, jitter]
  double loss_probability = 0;       // of each whole message

  // invalid_argument for negative values or a loss outside [0, 1].
  Status validate() const;
  // No bandwidth limit, delay or loss: the link is the network underneath.
  bool perfect() const {
    return bandwidth_bytes_per_s == 0 && latency == Duration::zero() && jitter == Duration::zero() &&
           loss_probability == 0;
  }
};

// "200mbit,50ms": a bandwidth in tc's units (bit, kbit, mbit, gbit: per second,
// decimal) and a one-way latency (us, ms, s); "0" for either is none. Errors
// (invalid_argument) name what was wrong.
Result<EmulatedLink> parse_link(std::string_view text);

class LinkModel {
 public:
  // `spec` must pass validate(); out-of-range values are clamped, never trusted.
  explicit LinkModel(LinkSpec spec, uint64_t seed);

  struct Delivery {
    bool dropped;
    // When the last byte arrives; also set for a dropped message (when it
    // would have arrived), which helps tests and traces.
    Clock::time_point deliver_at;
  };

  // Offers `bytes` to the link at `now`. Messages serialize: each starts when
  // the previous one has left (busy_until), so back-to-back messages queue.
  // A lost message still used the link's bandwidth, as a lost packet does.
  // Jitter is drawn per message, so it may reorder arrivals, as netem's does.
  Delivery schedule(Clock::time_point now, uint64_t bytes);

  const LinkSpec& spec() const { return spec_; }
  // When the link finishes transmitting everything scheduled so far.
  Clock::time_point busy_until() const { return busy_until_; }
  // bytes / bandwidth, zero on an unlimited link.
  Duration transmission_time(uint64_t bytes) const;

 private:
  LinkSpec spec_;
  SplitMix64 rng_;
  Clock::time_point busy_until_ = Clock::time_point::min();
};

struct Fault {
  enum Kind { drop_all, restore } kind;
  Clock::time_point at;
  // The peer whose traffic is affected; empty means every peer.
  std::string peer;
};

// Scheduled outages, answering "is traffic to `peer` dropped at time t?". The
// latest fault at or before t that names the peer (or names no peer) decides,
// so "drop from t, restore at t2" is two faults, and a peer that is never
// restored stays cut off.
class FaultSchedule {
 public:
  FaultSchedule() = default;
  explicit FaultSchedule(std::vector<Fault> faults);

  FaultSchedule& add(Fault fault);
  // Drops all traffic to `peer` from `from` until `until` (exclusive).
  FaultSchedule& drop_between(std::string peer, Clock::time_point from, Clock::time_point until);

  bool dropped(std::string_view peer, Clock::time_point t) const;
  const std::vector<Fault>& faults() const { return faults_; }

 private:
  // Sorted by time, stable, so of two faults at one instant the later-added wins.
  std::vector<Fault> faults_;
};

}  // namespace swarm::netem
