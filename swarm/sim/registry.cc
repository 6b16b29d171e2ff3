// The registry as the swarm sees it: each peer re-announces its record (stage,
// throughput, queue) every announce period at its own phase; a record lives
// announce_ttl seconds, so a dead peer's lingers until it lapses; a mover or joiner
// leaves the routers' view until it serves, but stays in the rebalancers' (as the
// runtime's `serving: false` record does). Each trainer hands its routers the records at
// its own phase every refresh period, as Trainer::refresh does: trainers do not all see
// the same snapshot at the same instant.
#include <algorithm>

#include "swarm/sim/swarm_model.h"

namespace swarm::sim::detail {

void Simulation::announce(int peer) {
  Peer& p = peers_[peer];
  p.announced_at = now_;
  p.announced_stage = p.stage;
  p.announced_queue = static_cast<int64_t>(p.queue.size() + (p.current ? 1 : 0)) * s_.microbatch;
  p.announced_throughput = p.measured_throughput;
  if (p.view_slot >= 0 && p.view_stage != p.stage) drop_from_view(peer);
  const PeerAnnouncement record{p.id, now_ + s_.announce_ttl, p.announced_queue};
  StageState& stage = stages_[p.stage];
  if (p.view_slot >= 0) {
    stage.view[p.view_slot] = record;
    return;
  }
  p.view_stage = p.stage;
  p.view_slot = static_cast<int>(stage.view.size());
  stage.view.push_back(record);
  stage.view_peer.push_back(peer);
}

// One announce chain per life of a peer; it stops when the peer dies.
void Simulation::start_announcing(int peer) {
  Peer& p = peers_[peer];
  if (p.announcing_life == p.life) return;
  p.announcing_life = p.life;
  const double first = next_phase_time(p.announce_phase, s_.announce_period);
  push(first > now_ ? first : first + s_.announce_period, Event{EventKind::announce, peer, 0, p.life});
}

void Simulation::on_announce(const Event& e) {
  Peer& p = peers_[e.a];
  if (p.life != e.life || p.state == PeerState::dead) return;
  if (serves(p) && !p.withdrawn) announce(e.a);
  push(now_ + s_.announce_period, Event{EventKind::announce, e.a, 0, p.life});
}

void Simulation::withdraw(int peer) {
  peers_[peer].withdrawn = true;
  drop_from_view(peer);
}

// Swap-remove: the last record takes the hole, and its peer learns its new slot.
void Simulation::drop_from_view(int peer) {
  Peer& p = peers_[peer];
  if (p.view_slot < 0) return;
  StageState& stage = stages_[p.view_stage];
  const int last = static_cast<int>(stage.view.size()) - 1;
  const int moved = stage.view_peer[last];
  stage.view[p.view_slot] = stage.view[last];
  stage.view_peer[p.view_slot] = moved;
  peers_[moved].view_slot = p.view_slot;
  stage.view.pop_back();
  stage.view_peer.pop_back();
  p.view_slot = -1;
  p.view_stage = -1;
}

// Routers skip lapsed records themselves; dropping them bounds the views and keeps
// them out of the rebalancers' loads.
void Simulation::lapse_records() {
  for (StageState& stage : stages_) {
    for (int i = static_cast<int>(stage.view.size()) - 1; i >= 0; --i) {
      if (i < static_cast<int>(stage.view.size()) && stage.view[i].expires_at <= now_) drop_from_view(stage.view_peer[i]);
    }
  }
}

// The rebalancers' and joiners' reading of the registry, once per announce period: the
// serving peers' records, and movers and joiners as the runtime announces them (not
// serving: in the old stage while they drain, in the new one while they download), so a
// second peer does not leave for a vacancy that one is already filling.
void Simulation::rebuild_loads_view() {
  loads_view_.clear();
  for (int st = 0; st < s_.stages; ++st) {
    for (int peer : stages_[st].view_peer) {
      const Peer& p = peers_[peer];
      loads_view_.push_back({p.id, st, p.announced_throughput, p.announced_queue});
    }
  }
  for (int peer : alive_) {
    const Peer& p = peers_[peer];
    if (p.state == PeerState::draining || p.state == PeerState::downloading) {
      loads_view_.push_back({p.id, p.stage, p.measured_throughput, 0});
    }
  }
}

void Simulation::on_refresh(const Event& e) {
  refresh_trainer(e.a);
  const double next = now_ + s_.refresh_period;
  if (next <= s_.seconds) push(next, Event{EventKind::refresh, e.a});
}

void Simulation::refresh_trainer(int trainer) {
  for (int st = 0; st < s_.stages; ++st) routers_[trainer][st].set_peers(stages_[st].view, now_);
}

}  // namespace swarm::sim::detail
