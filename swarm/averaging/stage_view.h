// stage_view: one peer's view of its stage-mates, and the one trust rule.
//
// A record ahead of this replica counts, for everything it is used for (am I
// behind, whom do I download from, may my round still happen), only when it is
// vouched: a strict majority of the stage's committed membership (the members of
// the last round this peer committed) published that step with that parameters
// hash. A peer that never committed (a newcomer, or one its stage dropped) has no
// membership yet and counts a strict majority of the fresh records instead, its
// own state not among them; it serves its own state only where the stage is
// verifiably empty or every fresh stage-mate holds that same state. A
// record nobody vouches for is ignored everywhere, so one forged record cannot
// stop a stage or pull a replica out of service.
//
// Pure: records and the time in, answers out; no clock, no I/O.
//
//   StageView view = StageView::from(records, me, now, stale_seconds);
//   if (auto v = vouched_state(view, membership, my_step, my_hash)) download_from(v->donors);
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "swarm/averaging/progress.h"

namespace swarm {

// The fresh records of the other peers of a stage, newest per peer, departed ones left out.
struct StageView {
  std::vector<ProgressRecord> mates;  // ordered by peer id
  static StageView from(const std::vector<ProgressRecord>& records, const std::string& me, double now,
                        double stale_seconds);
  const ProgressRecord* find(const std::string& peer_id) const;
};

// A state that a strict majority vouches for, other than this replica's own.
struct VouchedState {
  int64_t step = 0;
  uint64_t hash = 0;
  std::vector<ProgressRecord> donors;        // publish it now, freshest first
  std::vector<std::string> members;          // the committed membership they published
};

// The newest state ahead of (my_step, my_hash), or at my_step with another hash,
// that a strict majority vouches for: of `membership` (this peer counted, though it
// votes only for its own state) when it has one, else of the fresh records.
std::optional<VouchedState> vouched_state(const StageView& view, const std::set<std::string>& membership,
                                          const std::string& me, int64_t my_step, uint64_t my_hash);

// Whether a strict majority (as in vouched_state) published exactly (step, hash).
bool is_vouched(const StageView& view, const std::set<std::string>& membership, const std::string& me, int64_t step,
                uint64_t hash);

// Whether a strict majority of the voters (as in vouched_state) published only
// states after `step`: records only move on, so (step, any hash) can no longer be
// vouched. A download that handed over such a state is waited on for nothing.
bool moved_past(const StageView& view, const std::set<std::string>& membership, const std::string& me, int64_t step);

// Whether a member of `membership` published a committed membership at a later step
// that leaves this peer out: the stage went on without it, and it must join again
// as a newcomer.
bool dropped_from_membership(const StageView& view, const std::set<std::string>& membership, const std::string& me,
                             int64_t my_step);

// Whether a split stage's other side outweighs this peer's. Two sides that lost
// sight of each other (a stop, a blind registry) can each step as a majority of
// what it still saw, and once they see each other again neither is behind the
// other's membership: each side's records name a membership without the other.
// The other side: `former` stage-mates (peers this one committed rounds with, now
// outside its membership) serving on a membership that leaves this peer out;
// this side: this peer and the members serving on a membership that names it.
// The larger side wins; between equals the one further ahead, then the lower
// hash, so both sides reach the same verdict. Only former stage-mates count: a
// stranger's record (a forged one) cannot make a stage give up its state.
bool outweighed_by_split(const StageView& view, const std::set<std::string>& membership,
                         const std::set<std::string>& former, const std::string& me, int64_t my_step,
                         uint64_t my_hash);

// What a display may show as a stage's global step. An observer (the live status,
// the run summary, the report, `swarm status`) is no member, so it takes the
// stage's committed membership from the records themselves: of the memberships
// that fresh records name (each naming peer among its members), the prevailing
// one is named by the most peers; ties go to the larger membership, then to the
// one whose namers are at the lower step (a forger cannot win a tie by claiming
// more), then to the lower ids. A step is vouched when a strict majority of that
// membership published it with one hash, now or among their recent hashes. With
// no membership named (a stage before its first round) a strict majority of the
// fresh records vouches instead. So one forged record moves no display, as it
// moves no peer.
struct ObservedStep {
  std::optional<int64_t> step;  // the newest vouched step; none when no step is vouched
  uint64_t hash = 0;            // the parameters hash vouched at it
  std::vector<std::string> members;  // the prevailing membership; empty when none is named
  // Fresh records ahead of `step`, which nobody vouches for, by peer id; but not
  // a round in progress (at most kMaxStepsPerRound steps past the vouched state,
  // that state among its recent hashes): a member that committed the next round
  // publishes it before the others do. With no vouched step there is nothing to
  // be ahead of, and none is refused.
  std::vector<ProgressRecord> refused;
};

// Pure: newest record per peer, fresh and not departed, as in StageView.
ObservedStep observed_stage_step(const std::vector<ProgressRecord>& records, double now, double stale_seconds);

// The peers a strict majority of the stage's prevailing membership (as for
// observed_stage_step; all fresh records where none is named) banned from its
// rounds: a trainer routes no more samples to them, which would never be averaged.
std::set<std::string> banned_by_stage(const std::vector<ProgressRecord>& records, double now, double stale_seconds);

// The leader of the round that ends `step`: the lowest id among this peer and the
// fresh stage-mates at that step, serving, with the same parameters hash, and the
// peers that joined this one lately (`joiners`). Where `membership` (the last
// committed round's) has a member among them, only members lead: a record copied
// under a lower id, or a newcomer, cannot take the stage's rounds.
std::string choose_leader(const StageView& view, const std::string& me, int64_t step, uint64_t hash,
                          const std::set<std::string>& joiners, const std::set<std::string>& membership = {});

// Members of `membership` still present: this peer, the ones in the view, and those heard from lately.
std::set<std::string> present_members(const StageView& view, const std::set<std::string>& membership,
                                      const std::string& me, const std::set<std::string>& heard);

// Whether `group` holds more than half of `present`: a round needs a strict majority
// of the committed membership, less only the members gone from the registry and
// silent (so two halves that lost sight of each other cannot both step).
bool is_majority(const std::set<std::string>& group, const std::set<std::string>& present);

}  // namespace swarm
