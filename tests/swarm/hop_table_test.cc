// The peer-to-peer hop table: a microbatch's life through a middle and a last
// stage, busy answers, retries that rebind or replay without a second
// accumulation, deadlines that drop and blame, and its bounds under a random
// stream of events.
#include <doctest/doctest.h>

#include <random>
#include <set>

#include "swarm/peer/hop_table.h"

namespace swarm {
namespace {

const HopKey kFirst{"trainer0", 1};
const HopKey kSecond{"trainer0", 2};

TEST_CASE("a middle stage takes a forward, offers its output until a successor takes it, and answers that one only") {
  HopTable table(/*last_stage=*/false, {});
  CHECK(table.offer_forward(kFirst, "s0p0", 10, 0) == HopVerdict::accepted);
  CHECK(table.held() == 1);
  CHECK(table.successor_refused(kFirst, "s2p0") == HopTable::AfterRefusal::try_another);  // busy
  CHECK(table.tried(kFirst) == std::vector<std::string>{"s2p0"});
  CHECK(table.successor_accepted(kFirst, "s2p1"));
  // A backward before its forward went anywhere, or from another peer, is refused and counted.
  CHECK(table.offer_backward(kSecond, "s2p1", 1) == HopVerdict::unknown);
  CHECK(table.offer_backward(kFirst, "s2p0", 1) == HopVerdict::wrong_sender);
  CHECK(table.offer_backward(kFirst, "s2p1", 1) == HopVerdict::accepted);
  // Only once: the second is no longer awaited.
  CHECK(table.offer_backward(kFirst, "s2p1", 1) == HopVerdict::unknown);
  CHECK(table.backward_done(kFirst, 2) == "s0p0");
  CHECK(table.held() == 0);
  CHECK(table.finished() == 1);
  CHECK(table.counts().wrong_sender == 1);
  CHECK(table.counts().unknown == 2);
}

TEST_CASE("the last stage finishes a microbatch with its fused forward and backward; it has no successor") {
  HopTable table(/*last_stage=*/true, {});
  CHECK(table.offer_forward(kFirst, "s0p1", 10, 0) == HopVerdict::accepted);
  CHECK_FALSE(table.successor_accepted(kFirst, "anyone"));
  CHECK(table.backward_done(kFirst, 1) == "s0p1");
  CHECK(table.backward_done(kFirst, 1) == "");  // finished already: nothing to send twice
  HopTable middle(/*last_stage=*/false, {});
  CHECK(middle.offer_forward(kFirst, "s0p1", 10, 0) == HopVerdict::accepted);
  CHECK(middle.backward_done(kFirst, 1) == "");  // a middle stage waits for its successor's gradient
}

TEST_CASE("beyond max_held a forward is answered busy, until one finishes") {
  HopTable table(/*last_stage=*/true, {.max_held = 2});
  CHECK(table.offer_forward({"t", 1}, "p", 10, 0) == HopVerdict::accepted);
  CHECK(table.offer_forward({"t", 2}, "p", 10, 0) == HopVerdict::accepted);
  CHECK(table.offer_forward({"t", 3}, "p", 10, 0) == HopVerdict::busy);
  CHECK(table.counts().busy == 1);
  CHECK(table.backward_done({"t", 1}, 1) == "p");
  CHECK(table.offer_forward({"t", 3}, "p", 10, 1) == HopVerdict::accepted);
  // Another trainer's microbatch 1 is another microbatch.
  CHECK(table.offer_forward({"u", 2}, "p", 10, 1) == HopVerdict::busy);
}

TEST_CASE("a retry rebinds one in progress and replays one finished, never asking for a second computation") {
  HopTable table(/*last_stage=*/false, {});
  REQUIRE(table.offer_forward(kFirst, "s0p0", 10, 0) == HopVerdict::accepted);
  REQUIRE(table.successor_accepted(kFirst, "s2p0"));
  // s0p0 died; the trainer retried through s0p1, whose forward lands on this same peer.
  CHECK(table.offer_forward(kFirst, "s0p1", 20, 5) == HopVerdict::rebound);
  CHECK(table.held() == 1);
  CHECK(table.offer_backward(kFirst, "s2p0", 15) == HopVerdict::accepted);  // the later deadline holds
  CHECK(table.backward_done(kFirst, 16) == "s0p1");
  // Its input gradient was lost upstream; the next retry gets it again from here.
  CHECK(table.offer_forward(kFirst, "s0p2", 40, 17) == HopVerdict::replay);
  CHECK(table.predecessor(kFirst) == "s0p2");
  CHECK(table.held() == 0);
  CHECK(table.counts().accepted == 1);
  CHECK(table.counts().rebound == 1);
  CHECK(table.counts().replayed == 1);
}

TEST_CASE("deadlines drop what they pass; a successor that took a microbatch and never answered is blamed") {
  HopTable table(/*last_stage=*/false, {.replay_seconds = 30});
  CHECK(table.offer_forward(kFirst, "s0p0", 0, 0) == HopVerdict::expired);
  REQUIRE(table.offer_forward(kFirst, "s0p0", 10, 0) == HopVerdict::accepted);
  REQUIRE(table.successor_accepted(kFirst, "silent"));
  REQUIRE(table.offer_forward(kSecond, "s0p0", 10, 0) == HopVerdict::accepted);  // still computing at 10
  CHECK(table.expire(9.9).empty());
  const std::vector<HopEvent> events = table.expire(10);
  REQUIRE(events.size() == 2);
  CHECK(events[0].kind == HopEvent::Kind::blame);
  CHECK(events[0].key == kFirst);
  CHECK(events[0].peer == "silent");
  CHECK(events[1].kind == HopEvent::Kind::dropped);
  CHECK(events[1].key == kSecond);
  CHECK(table.held() == 0);
  CHECK(table.counts().silent_successor == 1);
  // A backward that comes after the deadline was late, not silent: dropped without blame.
  REQUIRE(table.offer_forward({"t", 3}, "s0p0", 20, 11) == HopVerdict::accepted);
  REQUIRE(table.successor_accepted({"t", 3}, "late"));
  CHECK(table.offer_backward({"t", 3}, "late", 20) == HopVerdict::expired);
  CHECK(table.held() == 0);
  CHECK(table.expire(21).empty());
}

TEST_CASE("a microbatch no successor takes is dropped after the tries; finished ones are forgotten oldest first") {
  HopTable table(/*last_stage=*/false, {.max_finished = 2, .replay_seconds = 30, .max_successor_tries = 2});
  REQUIRE(table.offer_forward(kFirst, "p", 10, 0) == HopVerdict::accepted);
  CHECK(table.successor_refused(kFirst, "a") == HopTable::AfterRefusal::try_another);
  CHECK(table.successor_refused(kFirst, "b") == HopTable::AfterRefusal::dropped);
  CHECK(table.successor_refused(kFirst, "c") == HopTable::AfterRefusal::not_offering);
  CHECK(table.held() == 0);
  CHECK(table.counts().no_successor == 1);
  CHECK(table.offer_backward(kFirst, "a", 1) == HopVerdict::unknown);

  HopTable last(/*last_stage=*/true, {.max_finished = 2, .replay_seconds = 30});
  for (uint64_t id = 1; id <= 3; ++id) {
    REQUIRE(last.offer_forward({"t", id}, "p", 100, 0) == HopVerdict::accepted);
    REQUIRE(last.backward_done({"t", id}, static_cast<double>(id)) == "p");
  }
  std::vector<HopEvent> events = last.expire(4);
  REQUIRE(events.size() == 1);
  CHECK(events[0].kind == HopEvent::Kind::forgotten);
  CHECK(events[0].key == HopKey{"t", 1});
  events = last.expire(32.5);  // microbatch 2 finished at 2: its window closed at 32
  REQUIRE(events.size() == 1);
  CHECK(events[0].key == HopKey{"t", 2});
  CHECK(last.finished() == 1);
}

TEST_CASE("under a random stream of events the table stays within its bounds and accounts for every microbatch") {
  const HopLimits limits{.max_held = 4, .max_finished = 6, .replay_seconds = 5, .max_successor_tries = 2};
  HopTable table(/*last_stage=*/false, limits);
  std::mt19937_64 rng(7);
  std::set<HopKey> in_progress;  // by this test's own bookkeeping
  double now = 0;
  int64_t finished = 0, dropped = 0;
  for (int step = 0; step < 20000; ++step) {
    now += 0.01;
    const HopKey key{"t" + std::to_string(rng() % 2), rng() % 6};
    switch (rng() % 6) {
      case 0:
        if (table.offer_forward(key, "p" + std::to_string(rng() % 3), now + 1 + rng() % 3, now) ==
            HopVerdict::accepted) {
          in_progress.insert(key);
        }
        break;
      case 1:
        (void)table.successor_accepted(key, "s" + std::to_string(rng() % 2));
        break;
      case 2:
        if (table.successor_refused(key, "s" + std::to_string(rng() % 2)) == HopTable::AfterRefusal::dropped) {
          REQUIRE(in_progress.erase(key) == 1);
          ++dropped;
        }
        break;
      case 3:
        // A late backward drops its microbatch without an event.
        if (table.offer_backward(key, "s" + std::to_string(rng() % 2), now) == HopVerdict::expired) {
          REQUIRE(in_progress.erase(key) == 1);
          ++dropped;
        }
        break;
      case 4:
        if (!table.backward_done(key, now).empty()) {
          REQUIRE(in_progress.erase(key) == 1);
          ++finished;
        }
        break;
      default:
        for (const HopEvent& event : table.expire(now)) {
          if (event.kind == HopEvent::Kind::forgotten) continue;
          REQUIRE(in_progress.erase(event.key) == 1);
          ++dropped;
        }
        CHECK(table.finished() <= limits.max_finished);
    }
    REQUIRE(table.held() == in_progress.size());
    REQUIRE(table.held() <= limits.max_held);
  }
  CHECK(finished > 100);
  CHECK(dropped > 100);
  CHECK(table.counts().busy > 0);
}

}  // namespace
}  // namespace swarm
