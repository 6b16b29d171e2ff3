// The pure link and fault policies, driven with made-up times: serialization,
// latency, jitter bounds and replay by seed, loss rate, and scheduled outages.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "transports/netem/link_model.h"

namespace swarm::netem {
namespace {

using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using std::chrono::seconds;

// Any instant will do; nothing here reads a clock.
const Clock::time_point t0 = Clock::time_point{} + seconds(1000);

TEST_CASE("at 100 bytes/s, three back-to-back 100-byte messages arrive 1 s apart") {
  LinkModel link({.bandwidth_bytes_per_s = 100}, 1);
  auto a = link.schedule(t0, 100);
  auto b = link.schedule(t0, 100);
  auto c = link.schedule(t0, 100);
  CHECK_FALSE(a.dropped);
  CHECK_FALSE(b.dropped);
  CHECK_FALSE(c.dropped);
  CHECK(a.deliver_at == t0 + seconds(1));
  CHECK(b.deliver_at == t0 + seconds(2));
  CHECK(c.deliver_at == t0 + seconds(3));
  CHECK(link.busy_until() == t0 + seconds(3));
}

TEST_CASE("latency adds to transmission time and does not occupy the link") {
  LinkModel link({.bandwidth_bytes_per_s = 100, .latency = milliseconds(250)}, 1);
  CHECK(link.schedule(t0, 100).deliver_at == t0 + milliseconds(1250));
  // Queued behind the first transmission only, not behind its propagation.
  CHECK(link.schedule(t0, 50).deliver_at == t0 + milliseconds(1750));
  // An idle link starts at once.
  CHECK(link.schedule(t0 + seconds(10), 100).deliver_at == t0 + milliseconds(11250));
}

TEST_CASE("an unlimited link delivers any size after the latency alone") {
  LinkModel link({.latency = milliseconds(40)}, 1);
  CHECK(link.schedule(t0, 1'000'000'000).deliver_at == t0 + milliseconds(40));
  CHECK(link.schedule(t0, 1'000'000'000).deliver_at == t0 + milliseconds(40));
  CHECK(link.transmission_time(1'000'000'000) == nanoseconds(0));
}

TEST_CASE("jitter stays within [0, jitter], spreads over it, and replays by seed") {
  const LinkSpec spec{.latency = milliseconds(10), .jitter = milliseconds(20)};
  LinkModel a(spec, 42), b(spec, 42), other(spec, 43);
  std::vector<Clock::time_point> from_a, from_b, from_other;
  for (int i = 0; i < 1000; ++i) {
    // Spaced out so only jitter moves the arrival.
    Clock::time_point now = t0 + seconds(i);
    from_a.push_back(a.schedule(now, 10).deliver_at);
    from_b.push_back(b.schedule(now, 10).deliver_at);
    from_other.push_back(other.schedule(now, 10).deliver_at);
  }
  Clock::duration lowest = Clock::duration::max(), highest = Clock::duration::min();
  for (int i = 0; i < 1000; ++i) {
    Clock::duration extra = from_a[i] - (t0 + seconds(i)) - milliseconds(10);
    lowest = std::min(lowest, extra);
    highest = std::max(highest, extra);
  }
  CHECK(lowest >= nanoseconds(0));
  CHECK(highest <= milliseconds(20));
  CHECK(lowest < milliseconds(1));
  CHECK(highest > milliseconds(19));
  CHECK(from_a == from_b);
  CHECK(from_a != from_other);
}

TEST_CASE("loss 0.3 over 10000 messages drops 30% +- 2%, and 0 and 1 are exact") {
  LinkModel lossy({.loss_probability = 0.3}, 7);
  int dropped = 0;
  for (int i = 0; i < 10000; ++i) dropped += lossy.schedule(t0, 100).dropped ? 1 : 0;
  CHECK(dropped >= 2800);
  CHECK(dropped <= 3200);

  LinkModel never({.loss_probability = 0}, 7), always({.loss_probability = 1}, 7);
  int never_dropped = 0, always_dropped = 0;
  for (int i = 0; i < 1000; ++i) {
    never_dropped += never.schedule(t0, 1).dropped ? 1 : 0;
    always_dropped += always.schedule(t0, 1).dropped ? 1 : 0;
  }
  CHECK(never_dropped == 0);
  CHECK(always_dropped == 1000);
}

TEST_CASE("a lost message still used the link's bandwidth") {
  LinkModel link({.bandwidth_bytes_per_s = 100, .loss_probability = 1}, 3);
  auto lost = link.schedule(t0, 100);
  CHECK(lost.dropped);
  CHECK(lost.deliver_at == t0 + seconds(1));
  CHECK(link.busy_until() == t0 + seconds(1));
}

TEST_CASE("LinkSpec::validate refuses negative values and a loss outside [0, 1]") {
  CHECK(LinkSpec{}.validate().is_ok());
  CHECK(LinkSpec{.bandwidth_bytes_per_s = 25e6, .latency = milliseconds(50), .loss_probability = 1}
            .validate()
            .is_ok());
  CHECK(LinkSpec{.bandwidth_bytes_per_s = -1}.validate().code() == StatusCode::invalid_argument);
  CHECK(LinkSpec{.latency = milliseconds(-1)}.validate().code() == StatusCode::invalid_argument);
  CHECK(LinkSpec{.jitter = milliseconds(-1)}.validate().code() == StatusCode::invalid_argument);
  CHECK(LinkSpec{.loss_probability = 1.5}.validate().code() == StatusCode::invalid_argument);
  CHECK(LinkSpec{.loss_probability = -0.1}.validate().code() == StatusCode::invalid_argument);
}

TEST_CASE("a fault drops traffic to its peer from t and restores it at t2") {
  const Clock::time_point t = t0 + seconds(5), t2 = t0 + seconds(9);
  FaultSchedule faults;
  faults.drop_between("peer-x", t, t2);
  CHECK_FALSE(faults.dropped("peer-x", t - nanoseconds(1)));
  CHECK(faults.dropped("peer-x", t));
  CHECK(faults.dropped("peer-x", t2 - nanoseconds(1)));
  CHECK_FALSE(faults.dropped("peer-x", t2));
  CHECK_FALSE(faults.dropped("peer-x", t2 + seconds(100)));
  // Other peers are untouched.
  CHECK_FALSE(faults.dropped("peer-y", t + seconds(1)));
}

TEST_CASE("faults added out of order, unrestored faults, and faults for every peer") {
  const Clock::time_point t = t0 + seconds(5);
  // Added latest first: the schedule orders them by time.
  FaultSchedule faults({
      Fault{Fault::drop_all, t + seconds(10), ""},
      Fault{Fault::restore, t + seconds(2), "peer-x"},
      Fault{Fault::drop_all, t, "peer-x"},
      Fault{Fault::drop_all, t + seconds(1), "peer-y"},
  });
  CHECK(faults.dropped("peer-x", t + seconds(1)));
  CHECK_FALSE(faults.dropped("peer-x", t + seconds(3)));
  // Never restored: dropped for good.
  CHECK(faults.dropped("peer-y", t + seconds(1000)));
  // A fault naming no peer reaches everyone, peer-x included.
  CHECK_FALSE(faults.dropped("peer-z", t + seconds(9)));
  CHECK(faults.dropped("peer-z", t + seconds(10)));
  CHECK(faults.dropped("peer-x", t + seconds(10)));
}

}  // namespace
}  // namespace swarm::netem
