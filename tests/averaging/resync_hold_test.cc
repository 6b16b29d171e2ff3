// A newcomer catching up with a fast stage: the pure parts that decide it. What a
// download that landed behind the records is worth (moved_past), and when a
// leader holds its round still for a mate (ResyncHolds). Records and a fake clock.
#include <doctest/doctest.h>

#include <set>
#include <string>
#include <vector>

#include "swarm/averaging/resync_hold.h"
#include "swarm/averaging/stage_view.h"

namespace swarm {
namespace {

using State = ProgressRecord::State;

// A fresh record of `id` at `step`, with recent hashes for the steps before it from `oldest`.
ProgressRecord mate(std::string id, int64_t step, int64_t oldest, State state = State::serving) {
  ProgressRecord r;
  r.peer_id = std::move(id);
  r.address = "inproc://" + r.peer_id;
  r.step = step;
  r.params_hash = 0x1000 + static_cast<uint64_t>(step);
  for (int64_t s = oldest; s < step; ++s) r.recent_hashes.emplace_back(s, 0x1000 + static_cast<uint64_t>(s));
  r.state = state;
  r.published_at = 10;
  return r;
}

StageView view_of(const std::vector<ProgressRecord>& records) { return StageView::from(records, "m", 10, 5); }

TEST_CASE("moved_past: only once a strict majority's records hold nothing at or before the step") {
  const std::set<std::string> membership{"a", "b", "m"};
  // Both members still publish step 20 among their recent hashes: it may yet be vouched.
  CHECK_FALSE(moved_past(view_of({mate("a", 30, 15), mate("b", 30, 15)}), membership, "m", 20));
  // Both records begin after it: no record of theirs can vouch for step 20 again.
  CHECK(moved_past(view_of({mate("a", 40, 25), mate("b", 40, 25)}), membership, "m", 20));
  // One member past it is one vote of three (this peer counted): wait on.
  CHECK_FALSE(moved_past(view_of({mate("a", 40, 25), mate("b", 30, 15)}), membership, "m", 20));
  // A newcomer (no membership) counts the fresh serving records, not a re-syncing one.
  CHECK(moved_past(view_of({mate("a", 40, 25)}), {}, "m", 20));
  CHECK_FALSE(moved_past(view_of({mate("a", 40, 25, State::resyncing), mate("b", 30, 15)}), {}, "m", 20));
  // A lone forged record far ahead moves nobody's download past its step.
  CHECK_FALSE(moved_past(view_of({mate("x", int64_t{1} << 40, (int64_t{1} << 40) - 1), mate("a", 30, 15),
                                  mate("b", 30, 15)}),
                         {}, "m", 20));
}

TEST_CASE("a leader holds for a mate that re-syncs or JOINed from behind, a tenth of its time at most") {
  auto none = [](const std::string&) { return false; };
  const StageView serving = view_of({mate("a", 30, 15)});
  const StageView resyncing = view_of({mate("a", 30, 15, State::resyncing)});

  ResyncHolds holds(1.0);
  CHECK_FALSE(holds.holding(serving, none, 100));
  // A JOIN from an older step: held for up to one hold period from then.
  holds.heard_behind("a", 100);
  CHECK(holds.holding(serving, none, 100.1));
  CHECK(holds.holding(serving, none, 100.5));
  // The credit (1 s) is spent by 101.1, and the JOIN's hold period is over anyway.
  CHECK_FALSE(holds.holding(resyncing, none, 101.1));
  // Earned back at a tenth of the time: 5 s later, half a second of holding.
  CHECK(holds.holding(resyncing, none, 106.1));
  CHECK(holds.holding(resyncing, none, 106.5));
  CHECK_FALSE(holds.holding(resyncing, none, 106.7));
  // A short hold spends only what it held: 0.2 s of a full credit leaves 0.8 s.
  ResyncHolds brief(1.0);
  CHECK(brief.holding(resyncing, none, 200));
  CHECK(brief.holding(resyncing, none, 200.2));
  CHECK_FALSE(brief.holding(serving, none, 200.21));
  CHECK(brief.holding(resyncing, none, 200.3));
  CHECK(brief.holding(resyncing, none, 201.0));
  CHECK_FALSE(brief.holding(resyncing, none, 201.2));

  // Not for a mate the caller skips (it JOINed this step, or is benched).
  ResyncHolds skipping(1.0);
  CHECK_FALSE(skipping.holding(resyncing, [](const std::string& id) { return id == "a"; }, 100));
  // And never with no hold configured.
  ResyncHolds off(0);
  off.heard_behind("a", 100);
  CHECK_FALSE(off.holding(resyncing, none, 100));
}

}  // namespace
}  // namespace swarm
