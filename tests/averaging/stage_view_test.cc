// observed_stage_step: what a display shows as a stage's global step is what the
// stage's peers would trust, so one forged record far ahead moves no display.
#include <doctest/doctest.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "swarm/averaging/progress.h"
#include "swarm/averaging/stage_view.h"

namespace swarm {
namespace {

constexpr double kNow = 100;
constexpr double kStale = 5;
constexpr int64_t kFar = int64_t{1} << 40;

// A fresh serving record of `id` at (step, hash), committed to `members`.
ProgressRecord record(std::string id, int64_t step, uint64_t hash, std::vector<std::string> members = {},
                      std::vector<std::pair<int64_t, uint64_t>> recent = {}, double published = kNow - 1) {
  ProgressRecord r;
  r.peer_id = std::move(id);
  r.step = step;
  r.params_hash = hash;
  r.committed_members = std::move(members);
  r.recent_hashes = std::move(recent);
  r.published_at = published;
  return r;
}

ObservedStep observe(const std::vector<ProgressRecord>& records) {
  return observed_stage_step(records, kNow, kStale);
}

std::vector<std::string> ids_of(const std::vector<ProgressRecord>& records) {
  std::vector<std::string> ids;
  for (const auto& r : records) ids.push_back(r.peer_id);
  return ids;
}

TEST_CASE("a forged record at step 2^40 beside two members at step 40: step 40, the forged record refused") {
  const std::vector<std::string> ab{"a", "b"};
  // As convincing as a forger can make it: it names the members and itself.
  const ObservedStep seen = observe({record("a", 40, 0x40, ab), record("b", 40, 0x40, ab),
                                     record("m", kFar, 0xbad, {"a", "b", "m"}, {{kFar - 1, 0xbae}})});
  REQUIRE(seen.step.has_value());
  CHECK(*seen.step == 40);
  CHECK(seen.hash == 0x40);
  CHECK(seen.members == ab);
  CHECK(ids_of(seen.refused) == std::vector<std::string>{"m"});
  // Without any membership named, two fresh records of three still outvote it.
  const ObservedStep bare = observe({record("a", 40, 0x40), record("b", 40, 0x40), record("m", kFar, 0xbad)});
  CHECK(bare.step == 40);
  CHECK(ids_of(bare.refused) == std::vector<std::string>{"m"});
}

TEST_CASE("a split stage: the side whose membership more peers name gives the step") {
  const std::vector<std::string> abc{"a", "b", "c"};
  const std::vector<std::string> de{"d", "e"};
  const ObservedStep seen = observe({record("a", 50, 0x50, abc), record("b", 50, 0x50, abc), record("c", 50, 0x50, abc),
                                     record("d", 60, 0x60, de), record("e", 60, 0x60, de)});
  CHECK(seen.step == 50);
  CHECK(seen.members == abc);
  CHECK(ids_of(seen.refused) == std::vector<std::string>{"d", "e"});
}

TEST_CASE("between memberships named by as many peers, the larger one, then the one at the lower step") {
  // One peer each: {a, b, c} is larger than {d}.
  ObservedStep seen = observe({record("a", 5, 0x5, {"a", "b", "c"}), record("b", 5, 0x5, {"a", "b", "c"}),
                               record("d", 9, 0x9, {"d"}), record("e", 9, 0x9, {"d", "e"})});
  CHECK(seen.members == std::vector<std::string>{"a", "b", "c"});
  CHECK(seen.step == 5);  // two of three
  // Equal in namers and size: the lower step's, whatever the other side claims.
  seen = observe({record("a", 7, 0x7, {"a", "b"}), record("b", 7, 0x7, {"a", "b"}), record("c", kFar, 0xf, {"c", "d"}),
                  record("d", kFar, 0xf, {"c", "d"})});
  CHECK(seen.members == std::vector<std::string>{"a", "b"});
  CHECK(seen.step == 7);
  CHECK(ids_of(seen.refused) == std::vector<std::string>{"c", "d"});
}

TEST_CASE("a membership counts only where its namer is among its members") {
  // Three strangers naming {a, b} cannot make it prevail over what a and b name.
  const ObservedStep seen = observe({record("a", 3, 0x3, {"a", "b", "c"}), record("b", 3, 0x3, {"a", "b", "c"}),
                                     record("x", kFar, 0xf, {"a", "b"}), record("y", kFar, 0xf, {"a", "b"}),
                                     record("z", kFar, 0xf, {"a", "b"})});
  CHECK(seen.members == std::vector<std::string>{"a", "b", "c"});
  CHECK(seen.step == 3);
  CHECK(seen.refused.size() == 3);
}

TEST_CASE("a step is vouched by members that moved past it with the same hash there") {
  const std::vector<std::string> abc{"a", "b", "c"};
  // a is at 12; b published 12 among its recent hashes and moved on to 13 alone.
  ObservedStep seen = observe({record("a", 12, 0x12, abc), record("b", 13, 0x13, abc, {{12, 0x12}}),
                               record("c", 11, 0x11, abc)});
  CHECK(seen.step == 12);
  CHECK(seen.hash == 0x12);
  CHECK(seen.refused.empty());  // 13, one member of three, is a round in progress from 12
  // Another hash at 12 is no vote for a's.
  seen = observe({record("a", 12, 0x12, abc), record("b", 13, 0x13, abc, {{12, 0xee}}), record("c", 11, 0x11, abc)});
  CHECK_FALSE(seen.step.has_value());
  CHECK(seen.refused.empty());
}

TEST_CASE("a round in progress is not refused; a record far ahead is, whatever recent hashes it copies") {
  const std::vector<std::string> ab{"a", "b"};
  const ProgressRecord a = record("a", 40, 0x40, ab);
  // b committed a round of 8 steps, the most one round counts for, and published first.
  ObservedStep seen = observe({a, record("b", 48, 0x48, ab, {{40, 0x40}, {48, 0x48}})});
  CHECK(seen.step == 40);
  CHECK(seen.refused.empty());
  // 9 steps past it, or from another state at 40, or with no hash for 40: refused.
  const std::vector<std::string> abc{"a", "b", "c"};
  for (const auto& ahead : {record("b", 49, 0x49, abc, {{40, 0x40}}), record("b", 41, 0x41, abc, {{40, 0x4f}}),
                            record("b", 41, 0x41, abc)}) {
    seen = observe({record("a", 40, 0x40, abc), record("c", 40, 0x40, abc), ahead});
    CHECK(seen.step == 40);
    CHECK(ids_of(seen.refused) == std::vector<std::string>{"b"});
  }
  seen = observe({a, record("b", 40, 0x40, ab), record("m", kFar, 0xbad, {"m"}, {{40, 0x40}})});
  CHECK(ids_of(seen.refused) == std::vector<std::string>{"m"});
}

TEST_CASE("a strict majority of the membership, its silent members counted") {
  const std::vector<std::string> abcd{"a", "b", "c", "d"};
  // Two of four is no strict majority, though the other two published nothing.
  CHECK_FALSE(observe({record("a", 8, 0x8, abcd), record("b", 8, 0x8, abcd)}).step.has_value());
  CHECK(observe({record("a", 8, 0x8, abcd), record("b", 8, 0x8, abcd), record("c", 8, 0x8, abcd)}).step == 8);
}

TEST_CASE("stale, departed and older records do not count; no record, no step") {
  CHECK_FALSE(observe({}).step.has_value());
  CHECK(observe({}).refused.empty());
  ProgressRecord departed = record("b", 40, 0x40);
  departed.departed = true;
  const ObservedStep seen = observe({record("a", 40, 0x40), departed, record("c", 40, 0x40, {}, {}, kNow - 10),
                                     record("m", kFar, 0xbad)});
  CHECK_FALSE(seen.step.has_value());  // a and m, one each of two
  CHECK(seen.refused.empty());
  // A peer's newest record replaces its older one.
  CHECK(observe({record("a", 2, 0x2, {}, {}, kNow - 3), record("a", 3, 0x3, {}, {}, kNow - 2)}).step == 3);
}

ProgressRecord banning(ProgressRecord r, std::vector<std::string> banned) {
  r.banned = std::move(banned);
  return r;
}

TEST_CASE("a peer is banned for trainers once a strict majority of the stage's membership names it") {
  const std::vector<std::string> abm{"a", "b", "m"};
  // Both honest members banned m: 2 of 3.
  CHECK(banned_by_stage({banning(record("a", 40, 0x40, abm), {"m"}), banning(record("b", 40, 0x40, abm), {"m"}),
                         record("m", 40, 0x40, abm)},
                        kNow, kStale) == std::set<std::string>{"m"});
  // One member's ban is not the stage's: m cannot get an honest peer dropped alone.
  CHECK(banned_by_stage({record("a", 40, 0x40, abm), record("b", 40, 0x40, abm),
                         banning(record("m", 40, 0x40, abm), {"a"})},
                        kNow, kStale)
            .empty());
  // Once the two committed without m, their membership is theirs: 2 of 2.
  const std::vector<std::string> ab{"a", "b"};
  CHECK(banned_by_stage({banning(record("a", 41, 0x41, ab), {"m"}), banning(record("b", 41, 0x41, ab), {"m"}),
                         record("m", 40, 0x40, abm)},
                        kNow, kStale) == std::set<std::string>{"m"});
  // A stale record's ban counts for nothing.
  CHECK(banned_by_stage({banning(record("a", 40, 0x40, abm, {}, kNow - 10), {"m"}),
                         banning(record("b", 40, 0x40, abm), {"m"}), record("m", 40, 0x40, abm)},
                        kNow, kStale)
            .empty());
}

}  // namespace
}  // namespace swarm
