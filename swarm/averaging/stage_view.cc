#include "swarm/averaging/stage_view.h"

#include <algorithm>
#include <map>

#include "swarm/averaging/round_protocol.h"

namespace swarm {

StageView StageView::from(const std::vector<ProgressRecord>& records, const std::string& me, double now,
                          double stale_seconds) {
  std::map<std::string, const ProgressRecord*> newest;
  for (const ProgressRecord& r : records) {
    if (r.peer_id == me) continue;
    auto [it, inserted] = newest.emplace(r.peer_id, &r);
    if (!inserted && r.published_at > it->second->published_at) it->second = &r;
  }
  StageView view;
  for (const auto& [id, r] : newest) {
    if (r->departed || r->published_at < now - stale_seconds) continue;
    view.mates.push_back(*r);
  }
  return view;
}

const ProgressRecord* StageView::find(const std::string& peer_id) const {
  auto it = std::lower_bound(mates.begin(), mates.end(), peer_id,
                             [](const ProgressRecord& r, const std::string& id) { return r.peer_id < id; });
  return it != mates.end() && it->peer_id == peer_id ? &*it : nullptr;
}

namespace {

// Every (step, hash) a record publishes: its current state and its recent ones.
std::vector<std::pair<int64_t, uint64_t>> published_states(const ProgressRecord& r) {
  std::vector<std::pair<int64_t, uint64_t>> out(r.recent_hashes.begin(), r.recent_hashes.end());
  out.emplace_back(r.step, r.params_hash);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first == b.first; }),
            out.end());
  return out;
}

}  // namespace

namespace {

// Voters: the committed membership (this peer among them, voting for its own
// state only), or with none, every fresh peer.
std::vector<const ProgressRecord*> voters_of(const StageView& view, const std::set<std::string>& membership,
                                             const std::string& me, size_t* electorate) {
  std::vector<const ProgressRecord*> voters;
  if (membership.empty()) {
    // A newcomer's own state counts for nothing: it is not the stage's. Nor do
    // those of the mates that serve none (looking: newcomers like it, or peers
    // the stage went on without; resyncing): counted, they would outvote the
    // stage's last holders, and every one of them would wait for ever.
    for (const auto& r : view.mates) {
      if (r.state == ProgressRecord::State::serving || r.state == ProgressRecord::State::averaging) voters.push_back(&r);
    }
    *electorate = voters.size();
    return voters;
  }
  // This peer counts among the electorate (voting only for its own state): one
  // other member of two must not move it alone, or a single member could make
  // its stage-mate load any state it likes. A member that fell behind a round it
  // voted DONE in follows that round's record instead (StageRounds::check_behind).
  *electorate = membership.count(me);
  for (const auto& id : membership) {
    if (id == me) continue;
    ++*electorate;
    if (const ProgressRecord* r = view.find(id)) voters.push_back(r);
  }
  return voters;
}

}  // namespace

bool is_vouched(const StageView& view, const std::set<std::string>& membership, const std::string& me, int64_t step,
                uint64_t hash) {
  size_t electorate = 0;
  size_t votes = 0;
  for (const ProgressRecord* r : voters_of(view, membership, me, &electorate)) {
    const auto states = published_states(*r);
    votes += std::count(states.begin(), states.end(), std::pair{step, hash});
  }
  return 2 * votes > electorate;
}

bool moved_past(const StageView& view, const std::set<std::string>& membership, const std::string& me, int64_t step) {
  size_t electorate = 0;
  size_t past = 0;
  for (const ProgressRecord* r : voters_of(view, membership, me, &electorate)) {
    const auto states = published_states(*r);
    past += !states.empty() && states.front().first > step;
  }
  return 2 * past > electorate;
}

std::optional<VouchedState> vouched_state(const StageView& view, const std::set<std::string>& membership,
                                          const std::string& me, int64_t my_step, uint64_t my_hash) {
  size_t electorate = 0;
  const std::vector<const ProgressRecord*> voters = voters_of(view, membership, me, &electorate);
  std::map<std::pair<int64_t, uint64_t>, size_t> votes;
  for (const ProgressRecord* r : voters) {
    for (const auto& state : published_states(*r)) {
      if (state.first > my_step || (state.first == my_step && state.second != my_hash)) ++votes[state];
    }
  }
  // The newest step first: a stage that moved on twice is followed to where it is now.
  for (auto it = votes.rbegin(); it != votes.rend(); ++it) {
    if (2 * it->second <= electorate) continue;
    VouchedState v{it->first.first, it->first.second, {}, {}};
    for (const ProgressRecord* r : voters) {
      if (r->step == v.step && r->params_hash == v.hash && !r->address.empty() &&
          r->state != ProgressRecord::State::resyncing) {
        v.donors.push_back(*r);
        if (v.members.empty()) v.members = r->committed_members;
      }
    }
    if (v.donors.empty()) continue;  // vouched by recent hashes, but nobody holds it now
    v.donors = donors_freshest_first(std::move(v.donors));
    return v;
  }
  return std::nullopt;
}

namespace {

// The membership the most fresh records name (see ObservedStep for the ties);
// empty when none names one. A record whose namer is not among the members it
// names reports no round it committed, and counts for none.
std::vector<std::string> prevailing_membership(const std::vector<ProgressRecord>& fresh) {
  struct Named {
    size_t namers = 0;
    int64_t step = 0;  // the highest its namers are at
  };
  std::map<std::vector<std::string>, Named> named;
  for (const ProgressRecord& r : fresh) {
    const auto& members = r.committed_members;
    if (std::find(members.begin(), members.end(), r.peer_id) == members.end()) continue;
    Named& n = named[members];
    n.step = n.namers++ == 0 ? r.step : std::max(n.step, r.step);
  }
  const std::vector<std::string>* best = nullptr;
  const Named* best_named = nullptr;
  for (const auto& [members, n] : named) {  // in id order: equals keep the lower ids
    const bool better = best == nullptr || n.namers > best_named->namers ||
                        (n.namers == best_named->namers &&
                         (members.size() > best->size() || (members.size() == best->size() && n.step < best_named->step)));
    if (better) {
      best = &members;
      best_named = &n;
    }
  }
  return best ? *best : std::vector<std::string>{};
}

// A member that committed the stage's next round and published it before the
// others: from the vouched state, at most one round's steps past it.
bool one_round_past(const ProgressRecord& r, int64_t step, uint64_t hash) {
  return r.step - step <= kMaxStepsPerRound && published_hash(r, step) == hash;
}

}  // namespace

ObservedStep observed_stage_step(const std::vector<ProgressRecord>& records, double now, double stale_seconds) {
  const std::vector<ProgressRecord> fresh = StageView::from(records, /*me=*/"", now, stale_seconds).mates;
  ObservedStep out;
  out.members = prevailing_membership(fresh);
  const size_t electorate = out.members.empty() ? fresh.size() : out.members.size();
  std::map<std::pair<int64_t, uint64_t>, size_t> votes;
  for (const ProgressRecord& r : fresh) {
    const bool votes_here = out.members.empty() ||
                            std::find(out.members.begin(), out.members.end(), r.peer_id) != out.members.end();
    if (!votes_here) continue;
    for (const auto& state : published_states(r)) ++votes[state];
  }
  for (auto it = votes.rbegin(); it != votes.rend(); ++it) {  // the newest step first
    if (2 * it->second <= electorate) continue;
    out.step = it->first.first;
    out.hash = it->first.second;
    break;
  }
  if (!out.step) return out;
  for (const ProgressRecord& r : fresh) {
    if (r.step > *out.step && !one_round_past(r, *out.step, out.hash)) out.refused.push_back(r);
  }
  return out;
}

std::set<std::string> banned_by_stage(const std::vector<ProgressRecord>& records, double now, double stale_seconds) {
  const std::vector<ProgressRecord> fresh = StageView::from(records, /*me=*/"", now, stale_seconds).mates;
  const std::vector<std::string> members = prevailing_membership(fresh);
  const size_t electorate = members.empty() ? fresh.size() : members.size();
  std::map<std::string, size_t> votes;
  for (const ProgressRecord& r : fresh) {
    if (!members.empty() && std::find(members.begin(), members.end(), r.peer_id) == members.end()) continue;
    for (const auto& id : r.banned) ++votes[id];
  }
  std::set<std::string> out;
  for (const auto& [id, n] : votes) {
    if (2 * n > electorate) out.insert(id);
  }
  return out;
}

bool dropped_from_membership(const StageView& view, const std::set<std::string>& membership, const std::string& me,
                             int64_t my_step) {
  for (const auto& id : membership) {
    const ProgressRecord* r = id == me ? nullptr : view.find(id);
    if (r == nullptr || r->step <= my_step || r->committed_members.empty()) continue;
    if (!std::binary_search(r->committed_members.begin(), r->committed_members.end(), me)) return true;
  }
  return false;
}

bool outweighed_by_split(const StageView& view, const std::set<std::string>& membership,
                         const std::set<std::string>& former, const std::string& me, int64_t my_step,
                         uint64_t my_hash) {
  auto takes_part = [](const ProgressRecord& r) {
    return r.state == ProgressRecord::State::serving || r.state == ProgressRecord::State::averaging;
  };
  auto names_me = [&](const ProgressRecord& r) {
    return std::binary_search(r.committed_members.begin(), r.committed_members.end(), me);
  };
  size_t ours = 1, theirs = 0;
  std::pair<int64_t, uint64_t> their_best{my_step, my_hash};
  bool their_best_set = false;
  for (const auto& r : view.mates) {
    if (!takes_part(r) || r.committed_members.empty()) continue;
    if (membership.count(r.peer_id) != 0) {
      ours += names_me(r);
      continue;
    }
    if (former.count(r.peer_id) == 0 || names_me(r)) continue;
    if (r.step == my_step && r.params_hash == my_hash) continue;  // the same state: no split
    ++theirs;
    // Further ahead first, then the lower hash.
    if (!their_best_set || r.step > their_best.first || (r.step == their_best.first && r.params_hash < their_best.second)) {
      their_best = {r.step, r.params_hash};
      their_best_set = true;
    }
  }
  if (theirs == 0) return false;
  if (theirs != ours) return theirs > ours;
  return their_best.first > my_step || (their_best.first == my_step && their_best.second < my_hash);
}

std::string choose_leader(const StageView& view, const std::string& me, int64_t step, uint64_t hash,
                          const std::set<std::string>& joiners, const std::set<std::string>& membership) {
  std::set<std::string> candidates{me};
  for (const auto& r : view.mates) {
    const bool takes_part = r.state == ProgressRecord::State::serving || r.state == ProgressRecord::State::averaging;
    if (takes_part && r.step == step && r.params_hash == hash) candidates.insert(r.peer_id);
  }
  candidates.insert(joiners.begin(), joiners.end());
  const bool a_member_is_here = std::any_of(candidates.begin(), candidates.end(),
                                            [&](const std::string& id) { return membership.count(id) != 0; });
  for (const auto& id : candidates) {  // in id order
    if (!a_member_is_here || membership.count(id) != 0) return id;
  }
  return me;
}

std::set<std::string> present_members(const StageView& view, const std::set<std::string>& membership,
                                      const std::string& me, const std::set<std::string>& heard) {
  std::set<std::string> present;
  for (const auto& id : membership) {
    if (id == me || heard.count(id) != 0 || view.find(id) != nullptr) present.insert(id);
  }
  return present;
}

bool is_majority(const std::set<std::string>& group, const std::set<std::string>& present) {
  size_t in = 0;
  for (const auto& id : present) in += group.count(id);
  return 2 * in > present.size();
}

}  // namespace swarm
