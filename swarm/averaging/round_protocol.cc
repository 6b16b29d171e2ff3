#include "swarm/averaging/round_protocol.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace swarm {

namespace {
// A Joiner with these samples did not JOIN: it is a member of the round this
// peer last committed, kept as heard (and as where to find that round's leader)
// until it JOINs again, goes silent or stops answering. A registry view that lost
// its records (empty, or too far behind) then neither makes this peer "alone" in
// its membership nor loses it the leader it stepped with.
constexpr int64_t kCommittedNotJoined = -1;

// The view less the stage-mates whose records, published since `since` (this
// peer's last round began or ended), show them at an earlier step and in no
// round: they fell behind (a restart that re-synced to an older state, a member
// that gave up on a committed round) and cannot take part at this step before
// they re-sync. Counted as present, a membership of two would hold still for
// ever: the one cannot step without the other, the other cannot be vouched
// forward by one member alone.
StageView without_fallen_behind(const StageView& view, int64_t step, double since) {
  StageView out = view;
  std::erase_if(out.mates, [&](const ProgressRecord& r) {
    return r.published_at > since && r.step < step && r.state != ProgressRecord::State::averaging;
  });
  return out;
}
}  // namespace

Status RoundsConfig::validate(double publish_period_seconds) const {
  if (peer_id.empty()) return invalid_argument("rounds: no peer id");
  if (global_batch_samples < 1) return invalid_argument("the global batch must be >= 1 sample, got {}", global_batch_samples);
  for (double s : {stale_seconds, join_period_seconds, joiner_silent_seconds, phase_timeout_seconds, look_seconds,
                   publish_period_seconds}) {
    if (!(s > 0)) return invalid_argument("rounds: every period and timeout must be > 0");
  }
  if (joiner_silent_seconds < 3 * join_period_seconds) {
    return invalid_argument("a leader forgets a joiner silent {} s, under three of its {} s JOIN periods",
                            joiner_silent_seconds, join_period_seconds);
  }
  if (stale_seconds < 3 * publish_period_seconds) {
    return invalid_argument("records count as absent after {} s, under three of their {} s publication periods",
                            stale_seconds, publish_period_seconds);
  }
  if (max_chunk_elements < 1 || max_members < 1 || max_early_values < 0 || join_on_samples_seconds < 0 ||
      gradient_values < 0 || !(contributors_wait_seconds >= 0)) {
    return invalid_argument("rounds: bad bounds");
  }
  return Status::ok();
}

StageRounds::StageRounds(RoundsConfig config, RoundReplica* replica, RoundCodec codec, double now)
    : config_(std::move(config)), replica_(replica), codec_(codec), started_at_(now),
      resync_holds_(config_.resync_hold_seconds), last_published_at_(now), born_at_(now) {}

// ---- inputs ----

void StageRounds::observe(const std::vector<ProgressRecord>& records, double now) {
  const bool had_mates = !view_.mates.empty();
  view_ = StageView::from(records, config_.peer_id, now, config_.stale_seconds);
  // A view gone empty is no proof of an empty stage (this peer may have been
  // stopped while its stage went on): a peer that never committed waits a stale
  // period before it leads a group of one (seed 3844 of the harness's fuzzer).
  if (mode_ == Mode::serving && membership_.empty() && had_mates && view_.mates.empty()) started_at_ = now;
  if (now - born_at_ <= voted_round_over_after()) {  // see earlier_life_settled
    for (const auto& r : view_.mates) {
      const bool in_round = r.state == ProgressRecord::State::averaging;
      if (r.published_at > born_at_ && !in_round) out_of_round_since_born_.insert(r.peer_id);
    }
  }
  for (auto* heard : {&unreachable_, &heard_from_}) {
    for (auto it = heard->begin(); it != heard->end();) {
      it = now - it->second > config_.stale_seconds ? heard->erase(it) : std::next(it);
    }
  }
}

void StageRounds::tick(double now) {
  if (mode_ == Mode::resyncing) return;  // the driver is downloading
  if (group_) {
    tick_group(now);
    return;
  }
  if (check_behind(now)) return;
  if (mode_ == Mode::looking) {
    if (now - started_at_ < config_.look_seconds) return;
    // An empty view is no proof of an empty stage until a live peer's record
    // would be in any working view: a registry that lags by more than the look
    // would otherwise show a stage that is stepping as empty, and this peer
    // would step a lineage of its own.
    if (view_.mates.empty() && now - started_at_ < config_.stale_seconds) return;
    // A stage-mate re-syncing may be about to hold the stage's state: serving this
    // replica's own (an old checkpoint, say) now could start a second lineage.
    const bool mate_resyncing = std::any_of(view_.mates.begin(), view_.mates.end(), [](const ProgressRecord& r) {
      return r.state == ProgressRecord::State::resyncing;
    });
    if (mate_resyncing && now - started_at_ < config_.look_seconds + 3 * config_.stale_seconds) return;
    // A newcomer serves its own state (fresh weights, a checkpoint) only where the
    // stage is empty or every stage-mate holds that same state: otherwise a state
    // nobody vouches for yet (a stage-mate stepping, a forged record) is no reason
    // to start a second lineage; it waits for a vouched one.
    const bool same_state_everywhere = std::all_of(view_.mates.begin(), view_.mates.end(), [&](const ProgressRecord& r) {
      return r.step == replica_->step() && r.params_hash == replica_->params_hash();
    });
    // Where no stage-mate serves at all (all of them looking: restarted, or left
    // behind by a stage that since died), the newest state serves (the lowest id
    // among equals) and the others follow it: each waiting for all to agree would
    // keep the stage still for ever.
    const bool nobody_serves = std::none_of(view_.mates.begin(), view_.mates.end(), [](const ProgressRecord& r) {
      return r.state != ProgressRecord::State::looking;
    });
    const bool newest = std::all_of(view_.mates.begin(), view_.mates.end(), [&](const ProgressRecord& r) {
      return r.step < replica_->step() || (r.step == replica_->step() && r.peer_id > config_.peer_id);
    });
    if (membership_.empty() && !same_state_everywhere && !(nobody_serves && newest)) return;
    mode_ = Mode::serving;  // nobody vouches for another state: this one is the stage's
    events_.push_back({RoundEvent::Kind::serving, replica_->step(), 0, false, 0, "no vouched state ahead"});
  }
  tick_serving(now);
}

// A stage that went on without this peer, or a vouched state ahead: re-sync.
bool StageRounds::check_behind(double now) {
  const int64_t step = replica_->step();
  const uint64_t hash = replica_->params_hash();
  // A state given up to a split's other side is worth nothing, even ahead: any
  // state the stage vouches for is followed, behind it too (fuzzer seed 13775).
  auto vouched_from = [&] { return yielded_ == std::pair{step, hash} ? int64_t{-1} : step; };
  auto vouched = vouched_state(view_, membership_, config_.peer_id, vouched_from(), hash);
  const bool outweighed =
      !vouched && !membership_.empty() && outweighed_by_split(view_, membership_, former_members_, config_.peer_id, step, hash);
  if (outweighed) yielded_ = std::pair{step, hash};
  if (!vouched && !membership_.empty() && (outweighed || dropped_from_membership(view_, membership_, config_.peer_id, step))) {
    // A newcomer again: the fresh records' majority vouches. Only once the old
    // membership vouches for nothing: a round that went on without this peer is
    // vouched by that membership, while fresh records count the stage-mates
    // that hold no state of it (resyncing, looking) and may vouch for nothing,
    // leaving this peer to serve its old step alone, a second lineage.
    set_membership({});
    committed_group_ = 0;
    vouched = vouched_state(view_, membership_, config_.peer_id, vouched_from(), hash);
    if (!vouched && mode_ == Mode::serving) {
      // and looks again: a newcomer serves its state only where the stage does
      // (see tick), never by leading the others it left behind into a genesis group.
      drop_held();
      joiners_.clear();
      mode_ = Mode::looking;
      started_at_ = now;
      return true;
    }
  }
  if (!vouched) vouched = committed_without_me(step);
  if (!vouched) {
    for (const auto& r : view_.mates) counters_.unvouched_ahead += r.step > step;
    return false;
  }
  drop_held();
  mode_ = Mode::resyncing;
  resync_target_ = std::move(vouched);
  joiners_.clear();
  events_.push_back({RoundEvent::Kind::resync, resync_target_->step, 0, false, 0,
                     fmt::format("a majority vouches for step {} hash {:016x}", resync_target_->step,
                                 resync_target_->hash)});
  (void)now;
  return true;
}

// A round this peer voted DONE in and gave up on (no COMMIT came), since
// committed by a member: the leader committed it only with this peer's vote, so
// that member's record is the stage's word even where no majority can vouch (a
// stage of two). Only such an unsettled round: a record citing one this peer
// committed itself could be a member's forgery.
//
// A process that has not voted yet may be a restart under its id, whose earlier
// life voted (or committed) in any group that names it: it follows such a
// record too, within a round's steps of its own (so a record far ahead, forged,
// pulls no restarted peer), rather than vote at that step a second time.
std::optional<VouchedState> StageRounds::committed_without_me(int64_t step) const {
  for (const auto& r : view_.mates) {
    if (r.step <= step || r.address.empty()) continue;
    auto it = voted_groups_.find(r.committed_group);
    const bool voted_in_it = it != voted_groups_.end();
    if (!voted_in_it && remembers_its_votes()) continue;
    const int64_t from = voted_in_it ? it->second : step;
    if (r.step - from < 1 || r.step - from > kMaxStepsPerRound) continue;
    if (!std::binary_search(r.committed_members.begin(), r.committed_members.end(), config_.peer_id)) continue;
    if (r.state == ProgressRecord::State::resyncing) continue;
    return VouchedState{r.step, r.params_hash, {r}, r.committed_members};
  }
  return std::nullopt;
}

// Whether this process remembers every vote its id cast since it started: it has voted or committed.
bool StageRounds::remembers_its_votes() const { return counters_.rounds_committed > 0 || !voted_groups_.empty(); }

// By then a round this peer voted DONE in can no longer commit: its leader's
// deadline (two phase timeouts from a start before the vote) has passed.
double StageRounds::voted_round_over_after() const {
  return std::max(config_.phase_timeout_seconds + config_.stale_seconds, 2 * config_.phase_timeout_seconds);
}

// A process restarted under its id has forgotten the DONEs its earlier life
// sent, yet counts as that id in the committed membership: voting at a step
// where its earlier life voted, it could make two groups, each a majority only
// with its vote, commit two lineages at one step. So it votes in no round until
// every round that may hold such a DONE is over. Each began before this process
// did, so it is over once its leader (a stage-mate in the view, or a member of
// the committed membership) has published since then a record in no round, or
// once its deadline has passed. One that committed names this peer in its
// members' records, and this peer follows it (committed_without_me) instead of
// voting at that step again. A first start costs nothing: its stage-mates'
// records show them in no round within a publication or two. Once this process
// has voted it remembers its votes, and the gate stays open.
bool StageRounds::earlier_life_settled(double now) const {
  if (remembers_its_votes() || now - born_at_ > voted_round_over_after()) return true;
  auto seen = [&](const std::string& id) { return id == config_.peer_id || out_of_round_since_born_.count(id) != 0; };
  const bool mates_seen = std::all_of(view_.mates.begin(), view_.mates.end(),
                                      [&](const ProgressRecord& r) { return seen(r.peer_id); });
  return mates_seen && std::all_of(membership_.begin(), membership_.end(), seen);
}

void StageRounds::resync_finished(bool loaded, double now) {
  if (loaded && resync_target_) {
    std::set<std::string> members(resync_target_->members.begin(), resync_target_->members.end());
    uint64_t group = resync_target_->donors.empty() ? 0 : resync_target_->donors.front().committed_group;
    // A donor that stepped during the download handed over a newer state (vouched by
    // recent hashes): its membership is the one of the round that made that state,
    // not the target's. Members that disagree on it follow different leaders.
    if (const ProgressRecord* at_loaded = committed_at_my_state()) {
      members = std::set<std::string>(at_loaded->committed_members.begin(), at_loaded->committed_members.end());
      group = at_loaded->committed_group;
    }
    set_membership(std::move(members));
    committed_group_ = group;
  }
  resync_target_.reset();
  if (loaded) yielded_.reset();
  mode_ = loaded ? Mode::serving : Mode::looking;
  started_at_ = now;
  finished_groups_.clear();
  early_parts_.clear();
  early_reductions_.clear();
  early_values_ = 0;
}

bool StageRounds::benched(const std::string& peer_id, double now) const {
  auto it = bench_.find(peer_id);
  return it != bench_.end() && now < it->second.until;
}

// Kept out of rounds (and of leading them) for a while, longer each time: a member
// that joins and then sends nothing, or a leader that never begins, would
// otherwise cost every round its deadline for as long as it likes. A peer this
// one never committed a round with starts four offenses in (16 phase timeouts):
// a stranger that JOINs and then sends nothing got into 3 rounds in 10 s, and
// held a stage stepping twice a second to 77% of its rate, when it started at one.
void StageRounds::bench(const std::vector<std::string>& peers, double now) {
  for (const auto& id : peers) {
    if (id == config_.peer_id || bans_.banned(id)) continue;  // a ban outlasts any bench
    Bench& b = bench_[id];
    b.offenses = std::min(b.offenses + (membership_.count(id) != 0 ? 1 : 4), 6);
    b.until = now + std::min(60.0, 2 * config_.phase_timeout_seconds * double(1 << (b.offenses - 1)));
    ++counters_.benched;
  }
}

// The leader this peer JOINs began no round for long while the stage (as the
// records show it) held two global batches at this step.
bool StageRounds::leader_never_begins(double now) const {
  if (now - std::max(following_since_, last_round_at_) < 2 * config_.phase_timeout_seconds + config_.stale_seconds) {
    return false;
  }
  int64_t samples = offered_samples();
  for (const auto& r : view_.mates) {
    if (r.step == replica_->step()) samples += r.samples;
  }
  return samples >= 2 * config_.global_batch_samples;
}

void StageRounds::tick_serving(double now) {
  if (!earlier_life_settled(now)) return;
  const int64_t step = replica_->step();
  for (auto it = joiners_.begin(); it != joiners_.end();) {
    it = now - it->second.heard_at > config_.joiner_silent_seconds ? joiners_.erase(it) : std::next(it);
  }
  std::set<std::string> joiner_ids;
  for (const auto& [id, j] : joiners_) {
    if (unreachable_.count(id) == 0 && !benched(id, now)) joiner_ids.insert(id);
  }
  // A stage-mate benched for a contribution that never came still leads if the
  // stage elects it: that bench is this member's own view of a round (its mates may
  // not share it), and a member that chose another leader for it refused the leader
  // its stage-mates followed, for as long as the bench outlasted the faults that
  // earned it (fuzzer seed 53787). Passed over: one that does not answer, and one
  // that began no round while the records showed the stage ready, which every
  // member sees alike.
  StageView reachable = view_;
  std::erase_if(reachable.mates, [&](const ProgressRecord& r) {
    auto it = bench_.find(r.peer_id);
    return unreachable_.count(r.peer_id) != 0 || (it != bench_.end() && now < it->second.deposed_until);
  });
  const std::string leader =
      choose_leader(reachable, config_.peer_id, step, replica_->params_hash(), joiner_ids, electing_membership());
  if (leader != leader_) {
    leader_ = leader;
    following_since_ = now;
    last_join_at_ = -1e18;
  }
  if (leader_ != config_.peer_id) {
    std::erase_if(joiners_, [](const auto& entry) { return entry.second.samples != kCommittedNotJoined; });
    if (leader_never_begins(now)) {
      Bench& b = bench_[leader_];
      b.until = b.deposed_until = now + config_.stale_seconds;  // not escalated: it may only have been unlucky
      ++counters_.benched;
      events_.push_back({RoundEvent::Kind::aborted, step, 0, false, 0,
                         fmt::format("leader {} began no round while the stage held two global batches", leader_)});
      leader_.clear();
      return;
    }
    const bool samples_changed = offered_samples() != last_join_samples_;
    const double since = now - last_join_at_;
    if (since >= config_.join_period_seconds ||
        (samples_changed && config_.join_on_samples_seconds > 0 && since >= config_.join_on_samples_seconds)) {
      send_join(now);
    }
    return;
  }
  if (ready_to_begin(now)) begin_round(now);
}

int64_t StageRounds::offered_samples() const { return replica_->pending_samples() + (held_ ? held_->samples : 0); }

double StageRounds::join_due_at() const {
  if (mode_ != Mode::serving || group_ || leader_.empty() || leader_ == config_.peer_id) {
    return std::numeric_limits<double>::infinity();
  }
  const bool samples_changed = offered_samples() != last_join_samples_;
  return samples_changed ? last_join_at_ + config_.join_on_samples_seconds : std::numeric_limits<double>::infinity();
}

void StageRounds::send_join(double now) {
  const std::string address = address_of(leader_);
  if (address.empty()) return;
  RoundMessage m = control(RoundOp::join);
  m.address = config_.address;
  m.samples = offered_samples();
  m.samples_per_second = rate_;
  m.params_hash = replica_->params_hash();
  last_join_samples_ = m.samples;
  send(leader_, address, std::move(m));
  last_join_at_ = now;
  // Unanswered or refused, the JOIN comes back through delivery_failed; until then its leader counts as heard.
  if (auto it = joiners_.find(leader_); it != joiners_.end() && it->second.samples == kCommittedNotJoined) {
    it->second.heard_at = now;
  }
}

std::set<std::string> StageRounds::genesis_membership() const {
  // No round committed yet: the peers holding this state, and every peer serving
  // another. Those ahead count too: a newcomer (or a peer its stage
  // dropped) and whoever else sits at its step would otherwise be a "majority"
  // of themselves and step a second lineage beside the stage that went on.
  std::set<std::string> out{config_.peer_id};
  for (const auto& r : view_.mates) {
    const bool same_state = r.step == replica_->step() && r.params_hash == replica_->params_hash();
    const bool serving = r.state == ProgressRecord::State::serving || r.state == ProgressRecord::State::averaging;
    // and those ahead, even looking: a restarted peer that loaded a vouched state
    // looks until its earlier life's rounds are over, and is no newcomer.
    const bool ahead = r.step > replica_->step() && r.state != ProgressRecord::State::resyncing;
    if (same_state || serving || ahead) out.insert(r.peer_id);
  }
  return out;
}

// Whom a round needs a strict majority of: the committed membership's members
// present, or with no membership, the genesis one's. A peer that loaded a state
// whose membership does not name it, every member of which is gone since, would
// need a majority of nobody and never step (fuzzer seed 20787); it counts every
// fresh stage-mate instead, whatever it does: those re-syncing may be loading
// its very state, under that same membership, and must not find it stepped
// alone meanwhile (seed 17707).
std::set<std::string> StageRounds::present_voters(const StageView& here, const std::set<std::string>& heard) const {
  if (membership_.empty()) return present_members(here, genesis_membership(), config_.peer_id, heard);
  std::set<std::string> present = present_members(here, membership_, config_.peer_id, heard);
  if (!present.empty()) return present;
  present.insert(config_.peer_id);
  for (const auto& r : view_.mates) present.insert(r.peer_id);  // the fallen behind too
  return present;
}

// The stage-mates heard from lately, whatever the registry shows: this leader's
// joiners, and members whose messages showed them at this step or past it.
std::set<std::string> StageRounds::heard_lately() const {
  std::set<std::string> heard;
  for (const auto& [id, at] : heard_from_) heard.insert(id);
  for (const auto& [id, j] : joiners_) heard.insert(id);
  return heard;
}

// Whose members lead: the committed membership, or with none (a peer that came
// back as a newcomer and serves the stage's state), the one the stage-mates that
// hold this very state publish. Electing from its own view, it would follow the
// lowest id present while they follow the lowest member, each refusing the
// other's JOINs for good (fuzzer seeds 1693, 5739).
std::set<std::string> StageRounds::electing_membership() const {
  if (!membership_.empty()) return membership_;
  const ProgressRecord* at_my_state = committed_at_my_state();
  if (at_my_state == nullptr) return {};
  return std::set<std::string>(at_my_state->committed_members.begin(), at_my_state->committed_members.end());
}

// The freshest stage-mate's record at this replica's very state that names the
// membership which committed it.
const ProgressRecord* StageRounds::committed_at_my_state() const {
  const ProgressRecord* freshest = nullptr;
  for (const auto& r : view_.mates) {
    if (r.step != replica_->step() || r.params_hash != replica_->params_hash() || r.committed_members.empty()) continue;
    if (freshest == nullptr || r.published_at > freshest->published_at) freshest = &r;
  }
  return freshest;
}

// The joiners a round takes now: benched ones only where the group would not be
// a majority without them (a member that failed rounds while the network did
// must not keep its stage from stepping once the network heals).
std::set<std::string> StageRounds::round_joiners(double now) const {
  std::set<std::string> all, unbenched;
  for (const auto& [id, j] : joiners_) {
    if (j.samples == kCommittedNotJoined || bans_.banned(id)) continue;
    all.insert(id);
    if (!benched(id, now)) unbenched.insert(id);
  }
  const std::set<std::string> present =
      present_voters(without_fallen_behind(view_, replica_->step(), last_round_at_), heard_lately());
  std::set<std::string> group = unbenched;
  group.insert(config_.peer_id);
  return is_majority(group, present) ? unbenched : all;
}

StageRounds::Downloaded StageRounds::judge_download(int64_t step, uint64_t hash) const {
  if (resync_target_ && step == resync_target_->step && hash == resync_target_->hash) return Downloaded::load;
  if (!resync_target_ || step < resync_target_->step) return Downloaded::refuse;
  if (vouched(step, hash)) return Downloaded::load;
  return moved_past(view_, membership_, config_.peer_id, step) ? Downloaded::refuse : Downloaded::wait;
}

// Held for a stage-mate that catches up (resync_hold.h). Not for one that JOINed
// this step (it is in), nor for a benched one (no round would take it). One a
// message failed to lately is held for all the same: a restarted process is the
// very mate that catches up, under the id its dead life left unreachable.
bool StageRounds::holding_for_resync(double now) {
  return resync_holds_.holding(
      view_,
      [&](const std::string& id) {
        auto joined = joiners_.find(id);
        return benched(id, now) || (joined != joiners_.end() && joined->second.samples != kCommittedNotJoined);
      },
      now);
}

bool StageRounds::ready_to_begin(double now) {
  if (holding_for_resync(now)) return false;
  const std::set<std::string> taken = round_joiners(now);
  std::set<std::string> group{config_.peer_id};
  std::vector<ProgressRecord> records;
  ProgressRecord own;
  own.peer_id = config_.peer_id;
  own.step = replica_->step();
  own.samples = offered_samples();
  own.samples_per_second = rate_;
  own.published_at = now;
  records.push_back(own);
  for (const auto& [id, j] : joiners_) {
    if (taken.count(id) == 0) continue;
    group.insert(id);
    ProgressRecord r;
    r.peer_id = id;
    r.step = own.step;
    r.samples = j.samples;
    r.samples_per_second = j.rate;
    r.published_at = j.heard_at;
    records.push_back(r);
  }
  const StageView here = without_fallen_behind(view_, replica_->step(), last_round_at_);
  if (!is_majority(group, present_voters(here, heard_lately()))) return false;
  if (membership_.empty() && group.size() == 1 && view_.mates.empty() && now - started_at_ < config_.stale_seconds) {
    return false;
  }
  GlobalBatchConfig batch{config_.global_batch_samples, config_.stale_seconds, config_.start_on_estimated_arrival};
  if (!decide_global_batch(batch, own.step, records, now).ready) return false;
  // A majority suffices, but the stage-mates at this step that have not JOINed
  // yet get a moment (two JOIN periods of samples): a member whose JOIN comes
  // just after the majority's would otherwise miss nearly every round, and
  // re-sync for ever where the stage steps faster than it downloads.
  double rate = 0;
  for (const auto& r : records) rate += r.samples_per_second;
  bool everyone = true;
  size_t candidates = group.size();  // and the mates at this step that have not JOINed yet
  for (const auto& r : view_.mates) {
    const bool takes_part = r.state == ProgressRecord::State::serving || r.state == ProgressRecord::State::averaging;
    const bool here = r.step == own.step && r.params_hash == replica_->params_hash();
    // A member whose record lags the round it committed with this peer (of up to
    // kMaxStepsPerRound steps) is at this step too.
    const bool member_behind_record =
        membership_.count(r.peer_id) != 0 && r.step < own.step && own.step - r.step <= kMaxStepsPerRound;
    if (takes_part && (here || member_behind_record) && group.count(r.peer_id) == 0 &&
        unreachable_.count(r.peer_id) == 0) {
      everyone = false;
      if (!bans_.banned(r.peer_id)) ++candidates;
    }
  }
  if (!everyone) {
    batch.target_samples += static_cast<int64_t>(std::ceil(rate * 2 * config_.join_period_seconds));
    if (!decide_global_batch(batch, own.step, records, now).ready) return false;
  }
  return enough_contributors(records, candidates, now);
}

// A group of three or more clips towards its majority (round_group.h), which takes
// three contributions that hold samples: with two, one member's numbers would be
// half the average again. So a leader with three candidates or more (its joiners
// and the mates at its step that have not JOINed yet) waits, for a while, until
// three members hold samples: a mate's JOIN may come just after the round is
// ready, and a global batch of a few microbatches can leave the third empty. One
// that does not come in that time is not waited for.
bool StageRounds::enough_contributors(const std::vector<ProgressRecord>& records, size_t candidates, double now) {
  int contributors = 0;
  for (const auto& r : records) contributors += r.samples > 0 ? 1 : 0;
  if (candidates < static_cast<size_t>(RoundGroup::kRobustGroupSize) ||
      contributors >= RoundGroup::kRobustGroupSize) {
    contributors_wait_since_.reset();
    return true;
  }
  if (!contributors_wait_since_) contributors_wait_since_ = now;
  if (now - *contributors_wait_since_ < config_.contributors_wait_seconds) return false;
  contributors_wait_since_.reset();
  return true;
}

void StageRounds::begin_round(double now) {
  GroupSpec spec;
  spec.stage = config_.stage;
  spec.step = replica_->step();
  spec.leader = config_.peer_id;
  // The time too: a restarted leader counts its rounds from 0 again, and a group
  // id it used before its restart may still be pending at a member, which
  // would take this round's commit for that one's.
  spec.group = make_group_id(spec.step, config_.peer_id, ++rounds_begun_ ^ std::bit_cast<uint64_t>(now));
  spec.me = config_.peer_id;
  spec.max_chunk_elements = config_.max_chunk_elements;
  spec.members.push_back({config_.peer_id, config_.address});
  const std::set<std::string> taken = round_joiners(now);
  for (const auto& [id, j] : joiners_) {
    if (taken.count(id) != 0) spec.members.push_back({id, j.address});
  }
  std::sort(spec.members.begin(), spec.members.end(),
            [](const RoundMember& a, const RoundMember& b) { return a.peer_id < b.peer_id; });
  ++counters_.rounds_led;
  if (Status entered = enter_group(spec, now); !entered.is_ok()) {
    events_.push_back({RoundEvent::Kind::aborted, spec.step, spec.group, true, 0, entered.to_string()});
    return;
  }
  for (const auto& member : group_->round.spec().members) {
    if (member.peer_id == config_.peer_id) continue;
    RoundMessage m = control(RoundOp::begin);
    m.members = group_->round.spec().members;
    send(member.peer_id, member.address, std::move(m));
  }
  after_progress(now);
}

// Takes this step's gradients (with any kept from an aborted attempt) and starts the group.
Status StageRounds::enter_group(GroupSpec spec, double now) {
  auto taken = replica_->take_gradients();
  if (!taken.is_ok()) return taken.status();
  if (!held_) {
    held_ = std::move(taken).value();
  } else if (taken->samples > 0) {  // merged, weighted by samples
    const double a = double(held_->samples), b = double(taken->samples);
    for (size_t i = 0; i < held_->mean.size() && i < taken->mean.size(); ++i) {
      held_->mean[i] = static_cast<float>((a * held_->mean[i] + b * taken->mean[i]) / (a + b));
    }
    held_->samples += taken->samples;
  }
  spec.max_member_samples = kMaxStepsPerRound * config_.global_batch_samples;
  spec.params_hash = replica_->params_hash();
  group_ = std::make_unique<ActiveGroup>(std::move(spec), codec_);
  group_->started_at = now;
  last_round_at_ = now;
  group_->hash_before = replica_->params_hash();
  SWARM_RETURN_IF_ERROR(group_->round.start(held_->mean, held_->samples));
  // Parts that came before the BEGIN, from this leader's round.
  std::vector<RoundMessage> early = std::exchange(early_parts_, {});
  early_values_ = 0;
  for (const auto& part : early) {
    if (part.group == group_->round.spec().group) (void)group_->round.receive(part);
  }
  for (const auto& [group, sender] : std::exchange(early_reductions_, {})) {
    RoundMessage claimed;
    claimed.phase = 1;
    claimed.sender = sender;
    if (group == group_->round.spec().group) ban_if_forged_reduction(claimed);
  }
  return Status::ok();
}

// After parts arrive or a group starts: send what the group produced; report DONE when complete.
void StageRounds::after_progress(double now) {
  if (!group_) return;
  for (auto& out : group_->round.take_outgoing()) outbox_.push_back(std::move(out));
  forge_reduced_parts();
  if (!group_->round.complete() || group_->done_sent) return;
  judge_contributions(now);
  group_->done_sent = true;
  group_->done_at = now;
  const GroupSpec& spec = group_->round.spec();
  if (spec.leader == config_.peer_id) {
    group_->done_from.insert(config_.peer_id);
    group_->samples_from[config_.peer_id] = held_ ? held_->samples : 0;
    if (group_->done_from.size() == spec.members.size()) commit(now);
    return;
  }
  voted_groups_[spec.group] = spec.step;
  while (voted_groups_.size() > 16) voted_groups_.erase(voted_groups_.begin());
  RoundMessage m = control(RoundOp::done);
  m.params_hash = group_->hash_before;
  m.samples = held_ ? held_->samples : 0;
  send(spec.leader, address_of(spec.leader), std::move(m));
}

// A robust round's judgements of its members' contributions, to the ban policy.
// Every honest member reduced the same numbers, so they ban the same member at once.
void StageRounds::judge_contributions(double now) {
  for (const auto& [id, why] : bans_.judge_round(group_->round.judgements(), config_.peer_id)) exclude(id, why);
  (void)now;
}

// Attack tests' Byzantine stage-mate: once per robust round, a "reduced" part of
// junk to every other member, which an honest member refuses and bans it for.
void StageRounds::forge_reduced_parts() {
  const GroupSpec& spec = group_->round.spec();
  if (config_.test_forge_reduced_part_from < 0 || spec.step < config_.test_forge_reduced_part_from ||
      !group_->round.robust() || group_->forged_sent) {
    return;
  }
  group_->forged_sent = true;
  for (const auto& member : spec.members) {
    if (member.peer_id == config_.peer_id) continue;
    RoundMessage m = control(RoundOp::part);
    m.phase = 1;  // a reduced part is its owner's: part == from
    m.from = m.part = group_->round.member_index(config_.peer_id);
    m.values.assign(16, 1000.0f);
    send(member.peer_id, member.address, std::move(m));
  }
}

// A ban is for good: no bench ends it, no JOIN is taken, and it is counted and told.
void StageRounds::exclude(const std::string& id, const std::string& why) {
  Bench& b = bench_[id];
  b.until = b.deposed_until = std::numeric_limits<double>::infinity();
  joiners_.erase(id);
  ++counters_.banned;
  const int64_t step = group_ ? group_->round.spec().step : replica_->step();
  const uint64_t group = group_ ? group_->round.spec().group : 0;  // out of any (a finished group's forgery)
  events_.push_back({RoundEvent::Kind::banned, step, group, false, 0, fmt::format("{} banned from the stage's rounds: {}", id, why)});
}

// In a robust round every member reduces the whole gradient itself: a reduced
// part is not a slip of an honest member but an attempt to hand the others an
// average, so its sender is banned on the spot.
void StageRounds::ban_if_forged_reduction(const RoundMessage& m) {
  ban_if_forged_reduction(m, group_->round.robust(), group_->round.member_index(m.sender) >= 0,
                          static_cast<size_t>(group_->round.size()));
}

void StageRounds::ban_if_forged_reduction(const RoundMessage& m, bool robust, bool from_member, size_t round_size) {
  if (m.phase != 1 || !robust || !from_member || m.sender == config_.peer_id || bans_.banned(m.sender)) return;
  exclude(m.sender, bans_.caught(m.sender, fmt::format("it sent a reduced part in a round of {}, where every member "
                                                       "reduces for itself",
                                                       round_size)));
}

void StageRounds::remember_finished() {
  FinishedGroup f{group_->round.spec().group, group_->round.robust(), {}};
  for (const auto& member : group_->round.spec().members) f.members.push_back(member.peer_id);
  finished_groups_.push_back(std::move(f));
  if (finished_groups_.size() > 16) finished_groups_.pop_front();
}

void StageRounds::commit(double now) {
  // Past the deadline the leader aborts even with every DONE in hand (DONEs that
  // waited while it was stalled, say): a member that reported DONE gives up only
  // after this deadline, and one that has must not see the others step.
  if (now - group_->started_at > 2 * config_.phase_timeout_seconds) {
    abort_group("every member reported DONE, but after the deadline", true, now);
    return;
  }
  // Nor where its record may have lapsed meanwhile (it was stopped, say): a member
  // restarted since then, seeing no leader in any round, may have voted at this
  // step in another group, and its earlier life's DONE here must not count too.
  const double unpublished = std::max(group_->longest_unpublished, now - last_published_at_);
  if (unpublished > 0.5 * config_.stale_seconds) {
    abort_group(fmt::format("every member reported DONE, but this leader published no record for {:.1f} s", unpublished),
                true, now);
    return;
  }
  const GroupSpec spec = group_->round.spec();
  // Each member's samples count up to a full round's worth: a member cannot
  // push the stage's step (and its learning rate) ahead by claiming more.
  const int64_t cap = kMaxStepsPerRound * config_.global_batch_samples;
  int64_t total = 0;
  for (const auto& [id, samples] : group_->samples_from) total += std::min(samples, cap);
  const int64_t steps = steps_for_samples(total, config_.global_batch_samples, &sample_credit_);
  for (const auto& member : spec.members) {
    if (member.peer_id == config_.peer_id) continue;
    RoundMessage m = control(RoundOp::commit);
    m.samples = total;
    m.steps = steps;
    send(member.peer_id, member.address, std::move(m));
  }
  apply(true, steps, now);
}

int64_t steps_for_samples(int64_t samples, int64_t global_batch, int64_t* credit) {
  const int64_t batch = std::max<int64_t>(global_batch, 1);
  const int64_t owed = std::max<int64_t>(samples, 0) + *credit;
  const int64_t steps = std::clamp<int64_t>(owed / batch, 1, kMaxStepsPerRound);
  // What a step counted beyond its samples (or they beyond it) carries to the
  // next round this leader commits, within one batch either way.
  *credit = std::clamp<int64_t>(owed - steps * batch, -batch, batch);
  return steps;
}

void StageRounds::apply(bool led, int64_t steps, double now) {
  const GroupSpec spec = group_->round.spec();
  last_round_at_ = now;
  const uint64_t consensus = consensus_hash(group_->round.hashes());
  const uint64_t before = group_->hash_before;
  Status stepped = replica_->apply_step(group_->round.averaged(), steps);
  counters_.payload_bytes += group_->round.payload_bytes_sent();
  counters_.payload_values += group_->round.payload_values_sent();
  std::set<std::string> members;
  for (const auto& member : spec.members) {
    members.insert(member.peer_id);
    bench_.erase(member.peer_id);  // it took its part in a committed round
  }
  set_membership(std::move(members));
  voted_groups_.clear();  // settled: no round before this one can still be committed without it
  committed_group_ = spec.group;
  remember_finished();
  group_.reset();
  held_.reset();
  joiners_.clear();
  for (const auto& member : spec.members) {
    if (member.peer_id != config_.peer_id) joiners_[member.peer_id] = {member.address, kCommittedNotJoined, 0, now};
  }
  last_join_at_ = -1e18;  // JOIN the next round at once: its leader waits only briefly
  ++counters_.rounds_committed;
  if (!led && spec.leader != config_.peer_id) ++counters_.rounds_followed;
  events_.push_back({RoundEvent::Kind::stepped, spec.step + steps, spec.group, led, static_cast<int>(spec.members.size()),
                     stepped.is_ok() ? "" : stepped.to_string()});
  if (before != consensus) {
    // Stepped from other parameters than the stage's: this replica is wrong, and
    // the majority's records now vouch for the state to download.
    ++counters_.diverged;
    events_.push_back({RoundEvent::Kind::diverged, spec.step, spec.group, led, 0,
                       fmt::format("parameters hashed {:016x}, the stage's {:016x}", before, consensus)});
  }
  (void)now;
}

void StageRounds::abort_group(const std::string& why, bool tell_others, double now) {
  const GroupSpec spec = group_->round.spec();
  // Past half its deadline, a member whose contribution never came is why.
  if (now - group_->started_at >= 0.5 * config_.phase_timeout_seconds) bench(group_->round.missing(), now);
  last_round_at_ = now;
  if (tell_others) {
    for (const auto& member : spec.members) {
      if (member.peer_id == config_.peer_id) continue;
      if (spec.leader != config_.peer_id && member.peer_id != spec.leader) continue;  // a member tells its leader
      RoundMessage m = control(RoundOp::abort);
      m.reason = why;
      send(member.peer_id, member.address, std::move(m));
    }
  }
  remember_finished();
  group_.reset();  // the gradient stays held for the next attempt
  replica_->round_aborted();
  ++counters_.rounds_aborted;
  last_join_at_ = -1e18;
  events_.push_back({RoundEvent::Kind::aborted, spec.step, spec.group, spec.leader == config_.peer_id,
                     static_cast<int>(spec.members.size()), why});
  (void)now;
}

void StageRounds::tick_group(double now) {
  const GroupSpec& spec = group_->round.spec();
  if (group_->done_sent && spec.leader != config_.peer_id) {
    // The COMMIT may have been lost: a member of the group at the next step,
    // committed to this group, is the leader's word.
    std::vector<std::string> ids;
    for (const auto& member : spec.members) ids.push_back(member.peer_id);
    for (const auto& member : spec.members) {
      const ProgressRecord* r = view_.find(member.peer_id);
      const int64_t steps = r != nullptr ? r->step - spec.step : 0;
      if (steps >= 1 && steps <= kMaxStepsPerRound && r->committed_group == spec.group && r->committed_members == ids) {
        apply(false, steps, now);
        return;
      }
    }
    // The leader's record published after this member's DONE, showing it out of
    // every round at this step (or restarted, behind it), is its word too: the
    // round is over there uncommitted, and waiting out the deadline would only
    // keep this member from the next one.
    if (const ProgressRecord* r = view_.find(spec.leader);
        r != nullptr && r->published_at > group_->done_at &&
        (r->step < spec.step || (r->step == spec.step && r->state != ProgressRecord::State::averaging))) {
      abort_group("the leader's record shows it out of the round", false, now);
      return;
    }
    // Never before the leader's own deadline has passed (it started before this
    // member's DONE): until then the leader may still commit.
    if (now - group_->done_at > voted_round_over_after()) {
      abort_group("no COMMIT, and no member's record shows the group committed", false, now);
    }
    return;
  }
  const double limit = (spec.leader == config_.peer_id ? 2 : 1) * config_.phase_timeout_seconds;
  if (now - group_->started_at > limit) {
    abort_group(group_->round.complete() ? "not every member reported DONE in time" : "parts missing at the deadline",
                true, now);
  }
}

void StageRounds::set_membership(std::set<std::string> members) {
  for (const auto& id : membership_) {
    if (id != config_.peer_id) former_members_.insert(id);
  }
  while (former_members_.size() > 4 * static_cast<size_t>(config_.max_members)) former_members_.erase(former_members_.begin());
  membership_ = std::move(members);
}

void StageRounds::published(double now) {
  if (group_) group_->longest_unpublished = std::max(group_->longest_unpublished, now - last_published_at_);
  last_published_at_ = now;
}

void StageRounds::drop_held() {
  if (group_) {
    remember_finished();
    group_.reset();
  }
  if (held_) replica_->lose_round_samples();
  held_.reset();
}

// ---- messages ----

RoundMessage StageRounds::control(RoundOp op) const {
  RoundMessage m;
  m.op = op;
  m.stage = config_.stage;
  m.step = replica_->step();
  m.sender = config_.peer_id;
  if (group_) {
    m.leader = group_->round.spec().leader;
    m.group = group_->round.spec().group;
    m.step = group_->round.spec().step;
  } else {
    m.leader = leader_.empty() ? config_.peer_id : leader_;
  }
  return m;
}

void StageRounds::send(const std::string& to, const std::string& address, RoundMessage m) {
  const RoundOp op = m.op;
  const uint64_t group = m.group;
  auto frames = encode_round_message(m, codec_);
  if (!frames.is_ok() || address.empty()) return;
  outbox_.push_back({to, address, op, group, std::move(frames).value()});
}

std::string StageRounds::address_of(const std::string& peer_id) const {
  if (group_) {
    for (const auto& m : group_->round.spec().members) {
      if (m.peer_id == peer_id) return m.address;
    }
  }
  if (const ProgressRecord* r = view_.find(peer_id)) return r->address;
  if (auto it = joiners_.find(peer_id); it != joiners_.end()) return it->second.address;
  return {};
}

void StageRounds::delivery_failed(const Outgoing& sent, const Status& why, double now) {
  // Only a peer that did not answer, or answered that it serves nothing, is
  // unreachable; one that refused (at another step, not the leader) is alive,
  // and a member that chose another leader for that would follow a minority.
  if (why.code() == StatusCode::deadline_exceeded || why.code() == StatusCode::unavailable) unreachable_[sent.to] = now;
  joiners_.erase(sent.to);  // a live one JOINs again, and is heard again
  if (sent.op == RoundOp::join) {
    if (sent.to == leader_) leader_.clear();  // choose again, without it
    return;
  }
  // A member that reported DONE has voted: whatever it sent may still arrive (a
  // DONE that timed out at a stalled leader is committed when it resumes), so
  // only the leader's word, a record or the deadline ends its round.
  const bool voted = group_ && group_->done_sent && group_->round.spec().leader != config_.peer_id;
  if (group_ && sent.group == group_->round.spec().group && !voted && !(group_->done_sent && sent.op == RoundOp::commit)) {
    abort_group(fmt::format("{} to {} failed: {}", round_op_name(sent.op), sent.to, why.message()), true, now);
  }
}

Status StageRounds::receive(const RoundMessage& m, double now) {
  if (m.stage != config_.stage) return failed_precondition("a round message for stage {}; this peer serves {}", m.stage, config_.stage);
  if (m.sender == config_.peer_id) return invalid_argument("a round message sent as this peer");
  if (membership_.count(m.sender) != 0 && m.step >= replica_->step()) heard_from_[m.sender] = now;
  Status status = [&] {
    switch (m.op) {
      case RoundOp::join: return on_join(m, now);
      case RoundOp::begin: return on_begin(m, now);
      case RoundOp::part: return on_part(m, now);
      case RoundOp::done: return on_done(m, now);
      case RoundOp::commit: return on_commit(m, now);
      case RoundOp::abort: return on_abort(m, now);
      case RoundOp::refuse: return on_refuse(m, now);
    }
    return invalid_argument("unknown op");
  }();
  return status;
}

Status StageRounds::on_join(const RoundMessage& m, double now) {
  const int64_t step = replica_->step();
  auto refuse = [&](Status s) {
    ++counters_.joins_refused;
    return s;
  };
  if (bans_.banned(m.sender)) return refuse(permission_denied("{} is banned from this stage's rounds", m.sender));
  // Members come from the stage's view, whose records are sealed and, in a swarm
  // with an owner, certified: an identity with no record there is no stage-mate.
  if (view_.find(m.sender) == nullptr) {
    return refuse(permission_denied("{} has no record in this stage's view", m.sender));
  }
  if (mode_ != Mode::serving || !earlier_life_settled(now)) {
    return refuse(unavailable("{} is not serving", config_.peer_id));
  }
  if (m.step != step) {
    if (m.step < step && view_.find(m.sender) != nullptr) {  // it catches up: hold a round for it
      resync_holds_.heard_behind(m.sender, now);
      unreachable_.erase(m.sender);
    }
    return refuse(failed_precondition("{} is at step {}, the JOIN at {}", config_.peer_id, step, m.step));
  }
  if (m.params_hash != replica_->params_hash()) {
    return refuse(failed_precondition("{} holds other parameters at step {}", config_.peer_id, step));
  }
  if (!leader_.empty() && leader_ != config_.peer_id && leader_ < m.sender) {
    return refuse(failed_precondition("not the leader: {}", leader_));
  }
  const bool fresh = joiners_.count(m.sender) == 0;
  if (fresh && joiners_.size() + 1 >= static_cast<size_t>(config_.max_members)) {
    return refuse(resource_exhausted("a round holds at most {} members", config_.max_members));
  }
  joiners_[m.sender] = {m.address, m.samples, m.samples_per_second, now};
  unreachable_.erase(m.sender);
  return Status::ok();
}

Status StageRounds::on_begin(const RoundMessage& m, double now) {
  if (mode_ != Mode::serving || !earlier_life_settled(now)) return unavailable("{} is not serving", config_.peer_id);
  if (m.step != replica_->step()) return failed_precondition("a BEGIN for step {} at step {}", m.step, replica_->step());
  if (m.leader != m.sender) return invalid_argument("a BEGIN from {} for {}'s round", m.sender, m.leader);
  if (m.sender != leader_) return failed_precondition("a BEGIN from {}; this peer follows {}", m.sender, leader_);
  if (std::none_of(m.members.begin(), m.members.end(), [&](const RoundMember& x) { return x.peer_id == config_.peer_id; }) ||
      std::none_of(m.members.begin(), m.members.end(), [&](const RoundMember& x) { return x.peer_id == m.sender; })) {
    return invalid_argument("a BEGIN whose members leave out this peer or its leader");
  }
  for (const auto& x : m.members) {
    if (bans_.banned(x.peer_id)) return permission_denied("a BEGIN with {}, whom this peer banned", x.peer_id);
  }
  // The leader counted its group against its membership; a member counts it
  // against its own: a leader that never committed with this peer (a newcomer
  // forming a genesis group, or one behind the stage) cannot take a minority
  // of the members this peer last committed with into a second lineage.
  std::set<std::string> group;
  for (const auto& x : m.members) group.insert(x.peer_id);
  const StageView here = without_fallen_behind(view_, replica_->step(), last_round_at_);
  if (!is_majority(group, present_voters(here, {m.sender}))) {
    return failed_precondition("a BEGIN whose group is no majority of the members {} committed with", config_.peer_id);
  }
  if (group_) {
    if (group_->round.spec().group == m.group) return already_exists("in group {:016x} already", m.group);
    if (group_->round.spec().leader != m.sender) return failed_precondition("in another leader's round");
    // A member that voted DONE keeps its vote until the leader's word on that group
    // (or a record, or the deadline; see tick_group): a BEGIN can be an old one the
    // network duplicated or held back (fuzzer seed 97474), and a member that took
    // it for the leader's next round voted twice at one step.
    if (group_->done_sent) {
      return failed_precondition("voted DONE in group {:016x}; its COMMIT or ABORT comes first", group_->round.spec().group);
    }
    abort_group("the leader began another group", false, now);  // it gave up on the old one
  }
  GroupSpec spec;
  spec.stage = config_.stage;
  spec.step = m.step;
  spec.leader = m.sender;
  spec.group = m.group;
  spec.members = m.members;
  spec.me = config_.peer_id;
  spec.max_chunk_elements = config_.max_chunk_elements;
  if (Status entered = enter_group(std::move(spec), now); !entered.is_ok()) {
    group_.reset();
    return entered;
  }
  after_progress(now);
  return Status::ok();
}

namespace {
// What an early part held counts against its sender's share: its values and a
// fixed overhead (the message around them).
constexpr int64_t kEarlyPartOverheadValues = 256;
int64_t early_part_cost(const RoundMessage& m) { return static_cast<int64_t>(m.values.size()) + kEarlyPartOverheadValues; }
}  // namespace

Status StageRounds::on_part(const RoundMessage& m, double now) {
  if (group_ && group_->round.spec().group == m.group) {
    Status s = group_->round.receive(m);
    if (!s.is_ok()) {
      ++counters_.refused_bad_part;
      ban_if_forged_reduction(m);
      return s;
    }
    after_progress(now);
    return Status::ok();
  }
  const auto ended = std::find_if(finished_groups_.begin(), finished_groups_.end(),
                                 [&](const FinishedGroup& f) { return f.group == m.group; });
  const bool finished = ended != finished_groups_.end();
  // The forgery may come after its round ended here (its leader aborted on banning
  // the forger, say): proof all the same (round_attacks_test).
  if (finished) {
    const bool from_member = std::find(ended->members.begin(), ended->members.end(), m.sender) != ended->members.end();
    ban_if_forged_reduction(m, ended->robust, from_member, ended->members.size());
  }
  // Its BEGIN is on its way: held, bounded, until the group starts.
  const bool early = !finished && !group_ && mode_ == Mode::serving && m.step == replica_->step() &&
                     !leader_.empty() && m.leader == leader_ && leader_ != config_.peer_id;
  // Only contributions come early: an averaged part (phase 1) needs this peer's
  // own contribution first, so it cannot precede this peer's BEGIN.
  if (!early || m.phase != 0) {
    // A reduced part before the BEGIN is remembered (not held): once the group begins
    // and proves to be one where nobody reduces for another, it is proof enough.
    if (early && m.phase == 1 && early_reductions_.size() < kMaxEarlyReductions) {
      early_reductions_.emplace(m.group, m.sender);
    }
    ++counters_.refused_no_begin;
    return failed_precondition("no BEGIN for group {:016x} here", m.group);
  }
  // Held per sender within its share of the bound, its oldest evicted first: a
  // member sending junk that claims the leader's round crowds out its own parts,
  // never another member's, whose loss would stall the real round until its
  // deadline; and to evict its own real part (sent just before the BEGIN) it
  // must send a whole share within those milliseconds, not a few junk parts.
  // A part costs its values and a fixed overhead, so tiny parts bound memory too.
  // A robust round's member sends its whole gradient: a share holds one, whatever
  // the bound (it is what this peer holds of that member once the round begins).
  const int64_t shares = early_shares();
  const int64_t chunk = std::max<int64_t>(config_.max_chunk_elements, 1);
  const int64_t whole = config_.gradient_values + kEarlyPartOverheadValues * (config_.gradient_values / chunk + 1);
  const int64_t share = std::max(config_.max_early_values / shares, whole);
  return hold_early(m, share, std::max(config_.max_early_values, share * shares));
}

// Anyone can publish records under fresh ids, so the records' count of
// stage-mates says nothing of how many shares are due: counted from it, a member
// minting ids made this peer hold a whole gradient per id. With a committed
// membership, its members and the leader hold a share each, and every other
// sender one between them: minted ids cost one share in all, while a mate back
// from a re-sync or a newcomer (no member of the last group, one of few at a
// time) still finds room; refused, it would abort the round it rejoins. Before
// any, a round of max_members is the most this peer could join, and it holds as
// much once that round begins.
int64_t StageRounds::early_shares() const {
  if (membership_.empty()) {
    return std::clamp<int64_t>(static_cast<int64_t>(view_.mates.size()), 1, config_.max_members);
  }
  const size_t mates = membership_.size() - membership_.count(config_.peer_id) + (membership_.count(leader_) == 0);
  return std::clamp<int64_t>(static_cast<int64_t>(mates) + 1, 1, config_.max_members);
}

// Whether a sender's early parts count against the share all senders outside
// the committed membership hold between them, rather than one of its own.
bool StageRounds::early_pooled(const std::string& sender) const {
  return !membership_.empty() && membership_.count(sender) == 0 && sender != leader_;
}

Status StageRounds::hold_early(const RoundMessage& m, int64_t share, int64_t bound) {
  const int64_t cost = early_part_cost(m);
  const bool pooled = early_pooled(m.sender);
  int64_t own = 0, others = 0;  // held against this sender's share: its parts and the pool's others'
  for (const auto& held : early_parts_) {
    if (held.sender == m.sender) {
      own += early_part_cost(held);
    } else if (pooled && early_pooled(held.sender)) {
      others += early_part_cost(held);
    }
  }
  if (cost + others > share) {
    ++counters_.refused_full;
    return resource_exhausted("an early part of {} values; {} may hold {}", m.values.size(), m.sender, share - others);
  }
  for (auto it = early_parts_.begin(); it != early_parts_.end() && cost + own + others > share;) {
    if (it->sender != m.sender) {
      ++it;
      continue;
    }
    own -= early_part_cost(*it);
    early_values_ -= early_part_cost(*it);
    ++counters_.refused_full;
    it = early_parts_.erase(it);
  }
  if (cost > bound - early_values_) {
    ++counters_.refused_full;
    return resource_exhausted("early parts held: {} values' worth", early_values_);
  }
  early_values_ += cost;
  early_parts_.push_back(m);
  return Status::ok();
}

Status StageRounds::on_done(const RoundMessage& m, double now) {
  if (!group_ || group_->round.spec().group != m.group || group_->round.spec().leader != config_.peer_id) {
    ++counters_.refused_no_begin;
    return failed_precondition("no round {:016x} led here", m.group);
  }
  if (group_->round.member_index(m.sender) < 0) {
    ++counters_.refused_not_member;
    return permission_denied("{} is no member of group {:016x}", m.sender, m.group);
  }
  group_->done_from.insert(m.sender);
  group_->samples_from[m.sender] = m.samples;
  if (group_->done_sent && group_->done_from.size() == group_->round.spec().members.size()) commit(now);
  return Status::ok();
}

Status StageRounds::on_commit(const RoundMessage& m, double now) {
  if (!group_ || group_->round.spec().group != m.group || m.sender != group_->round.spec().leader) {
    return failed_precondition("no round {:016x} of {} here", m.group, m.sender);
  }
  if (!group_->done_sent) return failed_precondition("a COMMIT before this member holds every part");
  apply(false, std::clamp<int64_t>(m.steps, 1, kMaxStepsPerRound), now);
  return Status::ok();
}

Status StageRounds::on_abort(const RoundMessage& m, double now) {
  if (!group_ || group_->round.spec().group != m.group) return Status::ok();  // over already
  const GroupSpec& spec = group_->round.spec();
  if (group_->round.member_index(m.sender) < 0) {
    ++counters_.refused_not_member;
    return permission_denied("{} is no member of group {:016x}", m.sender, m.group);
  }
  const bool led = spec.leader == config_.peer_id;
  if (!led && m.sender != spec.leader) return failed_precondition("only the leader ends a round");
  abort_group(fmt::format("{} aborted it: {}", m.sender, m.reason), led, now);
  return Status::ok();
}

Status StageRounds::on_refuse(const RoundMessage& m, double now) {
  (void)m;
  (void)now;
  return Status::ok();  // refusals travel as error replies; a REFUSE message is only logged
}

bool StageRounds::mates_at_step() const {
  return std::any_of(view_.mates.begin(), view_.mates.end(), [&](const ProgressRecord& r) {
    return r.step == replica_->step() && r.state != ProgressRecord::State::resyncing;
  });
}

ProgressRecord StageRounds::progress(double now) const {
  ProgressRecord r;
  r.peer_id = config_.peer_id;
  r.address = config_.address;
  r.stage = config_.stage;
  r.published_at = now;
  r.step = replica_->step();
  r.samples = offered_samples();
  r.samples_per_second = rate_;
  r.params_hash = replica_->params_hash();
  r.recent_hashes = replica_->recent_hashes();
  r.state = mode_ == Mode::resyncing ? ProgressRecord::State::resyncing
            : mode_ == Mode::looking || !earlier_life_settled(now) ? ProgressRecord::State::looking
            : group_                 ? ProgressRecord::State::averaging
                                     : ProgressRecord::State::serving;
  r.stage_mates_seen = static_cast<int>(view_.mates.size());
  r.committed_group = committed_group_;
  r.committed_members.assign(membership_.begin(), membership_.end());
  r.allreduce_bytes = counters_.payload_bytes;
  r.allreduce_values = counters_.payload_values;
  for (const auto& [id, why] : bans_.bans()) {
    if (r.banned.size() == ProgressRecord::kMaxMembers) break;
    r.banned.push_back(id);
  }
  return r;
}

}  // namespace swarm
