// Joined rounds (--rounds joins), as swarm/averaging/round_protocol.h runs them, and the
// waits a round causes at its members (--forward-hold, --round-wait), as Replica does.
//
// The stage's leader (its lowest peer) learns of a member's samples by its JOIN, one
// crossing after they change, and BEGINs once the stage holds the global batch; the
// members take their gradients when the BEGIN lands. Then each member sends each other
// member its part of the gradient (reduce-scatter), each sends back the averaged part
// (all-gather), each reports DONE to the leader and steps on its COMMIT. The parts share
// the links with the pipeline's traffic.
#include <algorithm>
#include <limits>
#include <vector>

#include "swarm/sim/swarm_model.h"

namespace swarm::sim::detail {
namespace {

double crossing_latency(const Peer& a, const Peer& b) { return std::max(a.link.latency, b.link.latency); }

}  // namespace

void Simulation::check_joined_batch(int st, int credited_peer) {
  StageState& stage = stages_[st];
  if (stage.averaging || stage.round_pending) return;
  int64_t samples = 0;
  std::vector<int> members;
  for (int index = 0; index < static_cast<int>(peers_.size()); ++index) {
    const Peer& p = peers_[index];
    if (!serves(p) || p.stage != st) continue;
    samples += p.accumulated;
    members.push_back(index);
  }
  if (samples < s_.global_batch.target_samples) return;
  stage.round_pending = true;
  // The JOIN of the peer whose sample completed the batch, unless the leader counted
  // it itself; then the BEGIN, which the members take when it lands.
  const Peer& leader = peers_[members.front()];
  double join = 0, begin = 0;
  if (credited_peer != members.front()) join = crossing_latency(peers_[credited_peer], leader);
  for (size_t i = 1; i < members.size(); ++i) begin = std::max(begin, crossing_latency(leader, peers_[members[i]]));
  push(now_ + join + begin, Event{EventKind::round_begins, st, 0, 0, ++stage.round});
}

void Simulation::on_round_begins(const Event& e) {
  StageState& stage = stages_[e.a];
  if (e.token != stage.round || !stage.round_pending) return;
  start_joined_round(e.a);
}

void Simulation::start_joined_round(int st) {
  StageState& stage = stages_[st];
  stage.round_pending = false;
  take_round_members(st);
  if (stage.round_members.empty()) return;
  const std::vector<int>& members = stage.round_members;
  const size_t n = members.size();
  stage.averaging = true;
  stage.round_ends_at = std::numeric_limits<double>::infinity();  // known once the parts are in
  for (int index : members) {
    peers_[index].in_round = true;
    wake_held(index);
  }
  if (n < 2) return on_all_gathered(st, now_);
  // Reduce-scatter: each member sends every other its part.
  const int64_t part = (s_.gradient_bytes + static_cast<int64_t>(n) - 1) / static_cast<int64_t>(n);
  double reduced = now_;
  for (size_t from = 0; from < n; ++from) {
    for (size_t to = 0; to < n; ++to) {
      if (from != to) reduced = std::max(reduced, cross(peers_[members[from]].link, peers_[members[to]].link, part, now_));
    }
  }
  push(reduced, Event{EventKind::parts_reduced, st, 0, 0, stage.round});
}

// All-gather once every part is reduced: each member sends its averaged part back.
void Simulation::on_parts_reduced(const Event& e) {
  StageState& stage = stages_[e.a];
  if (e.token != stage.round || !stage.averaging) return;
  const std::vector<int>& members = stage.round_members;
  const size_t n = members.size();
  const int64_t part = (s_.gradient_bytes + static_cast<int64_t>(n) - 1) / static_cast<int64_t>(n);
  double gathered = now_;
  for (size_t from = 0; from < n; ++from) {
    for (size_t to = 0; to < n; ++to) {
      if (from != to) gathered = std::max(gathered, cross(peers_[members[from]].link, peers_[members[to]].link, part, now_));
    }
  }
  on_all_gathered(e.a, gathered);
}

// Every member reports DONE to the leader, which steps and COMMITs: two crossings.
void Simulation::on_all_gathered(int st, double gathered) {
  StageState& stage = stages_[st];
  const std::vector<int>& members = stage.round_members;
  const Peer& leader = peers_[members[0]];
  double done = gathered, ends = gathered;
  for (size_t i = 1; i < members.size(); ++i) done = std::max(done, gathered + crossing_latency(peers_[members[i]], leader));
  for (size_t i = 1; i < members.size(); ++i) ends = std::max(ends, done + crossing_latency(leader, peers_[members[i]]));
  stage.round_ends_at = ends;
  push(ends, Event{EventKind::round_done, st, 0, 0, stage.round});
}

// A round took the gradients a held forward waited on; it now waits for the round's step.
void Simulation::wake_held(int peer) {
  Peer& p = peers_[peer];
  if (!p.waiting) return;
  p.waiting = false;
  ++p.wait_token;
  if (!p.current) serve_next(peer);
}

// Replica's two waits, for the task at the front of the queue; true if it waits now.
bool Simulation::must_wait(int peer, QueuedTask& task) {
  Peer& p = peers_[peer];
  double until = -1;
  if (s_.round_wait > 0 && p.in_round && !task.waited_round) {
    task.waited_round = true;
    until = std::min(stages_[p.stage].round_ends_at, now_ + s_.round_wait);
  } else if (s_.forward_hold > 0 && !task.held && !p.in_round && p.accumulated > 0 &&
             hop_of(task.hop).kind == TaskKind::forward) {
    task.held = true;
    until = now_ + s_.forward_hold;
  }
  if (until < 0) return false;
  p.waiting = true;
  push(until, Event{EventKind::resume_serving, peer, 0, p.life, ++p.wait_token});
  return true;
}

void Simulation::on_resume_serving(const Event& e) {
  Peer& p = peers_[e.a];
  if (p.life != e.life || e.token != p.wait_token || !p.waiting) return;
  p.waiting = false;
  if (!p.current) serve_next(e.a);
}

}  // namespace swarm::sim::detail
