// Who is in the swarm: Poisson churn, joins and preemptions, the --schedule, and the
// moves each peer's own Rebalancer decides (DESIGN §5.4).
#include <cmath>

#include "swarm/sim/swarm_model.h"

namespace swarm::sim::detail {

double Simulation::poisson_rate(EventKind kind) const {
  switch (kind) {
    case EventKind::departure: return s_.churn * s_.peers / s_.seconds;
    case EventKind::join: return s_.join_rate / 3600;
    case EventKind::preemption: return s_.preempt_rate / 3600;
    default: return 0;
  }
}

void Simulation::schedule_poisson(EventKind kind) {
  const double per_second = poisson_rate(kind);
  if (!(per_second > 0)) return;
  const double wait = -std::log(1 - churn_rng_.next_unit()) / per_second;
  if (now_ + wait <= s_.seconds) push(now_ + wait, Event{kind});
}

void Simulation::on_departure() {
  const int p = random_alive_peer(-1);
  if (p >= 0) {
    ++summary_.departures;
    kill(p, "churn");
  }
  schedule_poisson(EventKind::departure);
}

void Simulation::on_join() {
  enter_swarm(add_peer(0, PeerState::downloading), "join");
  schedule_poisson(EventKind::join);
}

void Simulation::on_preemption() {
  const int p = random_alive_peer(-1);
  if (p >= 0) {
    ++summary_.preemptions;
    kill(p, "preempt");
    push(now_ + std::max(0.0, s_.downtime.sample(churn_rng_)), Event{EventKind::rejoin, p});
  }
  schedule_poisson(EventKind::preemption);
}

// The same machine back as a fresh process: the same id and hardware, a new record
// (a later expiry lifts any router's ban), a new rebalancer and stage service.
void Simulation::on_rejoin(int peer) {
  Peer& p = peers_[peer];
  mark_alive(peer, true);
  if (s_.rebalance) p.rebalancer.emplace(s_.rebalance_config, p.id, rebalance_seed_, now_);
  enter_swarm(peer, "rejoin");
}

void Simulation::on_scheduled(int index) {
  const ScheduledEvent& e = s_.schedule[index];
  if (e.kind == ScheduledEvent::Kind::join) return enter_swarm(add_peer(0, PeerState::downloading), "schedule");
  const int p = random_alive_peer(e.stage);
  if (p < 0) {
    emit({{"kind", "kill_skipped"}, {"t", fixed(now_)}, {"stage", e.stage}, {"why", "no live peer serves the stage"}});
    return;
  }
  ++summary_.kills;
  kill(p, "kill");
}

// A uniform pick among the alive peers, or among those serving `stage` (>= 0); -1 if none.
int Simulation::random_alive_peer(int stage) {
  if (stage < 0) return alive_.empty() ? -1 : alive_[churn_rng_.below(alive_.size())];
  std::vector<int> candidates;
  for (int index : alive_) {
    if (serves(peers_[index]) && peers_[index].stage == stage) candidates.push_back(index);
  }
  return candidates.empty() ? -1 : candidates[churn_rng_.below(candidates.size())];
}

// It vanishes: no reply to anything queued (trainers time out), its pending samples are
// lost, and its registry record stays until it lapses, as a dead process's would.
void Simulation::kill(int peer, const char* reason) {
  Peer& p = peers_[peer];
  emit({{"kind", "leave"}, {"t", fixed(now_)}, {"peer", p.id}, {"stage", p.stage}, {"reason", reason}});
  summary_.lost_samples += p.accumulated;
  p.accumulated = 0;
  p.state = PeerState::dead;
  ++p.life;
  p.queue.clear();
  p.current.reset();
  p.waiting = false;
  p.in_round = false;
  mark_alive(peer, false);
  bounds_dirty_ = true;
}

// A peer without a stage takes the one the registry says is most needed, then downloads
// that stage's state before it serves.
void Simulation::enter_swarm(int peer, const char* reason) {
  Peer& p = peers_[peer];
  p.stage = rebalance::stage_most_needed(loads_view_, s_.stages, 0);
  p.state = PeerState::downloading;
  withdraw(peer);
  p.measured_throughput = 0;
  p.accumulated = 0;
  p.has_published = false;
  ++summary_.joins;
  emit({{"kind", "join"}, {"t", fixed(now_)}, {"peer", p.id}, {"stage", p.stage}, {"reason", reason}});
  push(now_ + download_seconds(p), Event{EventKind::download_done, peer, 0, p.life});
  bounds_dirty_ = true;
}

double Simulation::download_seconds(const Peer& p) const {
  return static_cast<double>(s_.state_bytes) / p.link.bytes_per_second + p.link.latency;
}

void Simulation::schedule_check(int peer) {
  Peer& p = peers_[peer];
  if (!p.rebalancer) return;
  push(p.rebalancer->next_check_at(), Event{EventKind::rebalance_check, peer, 0, ++p.check_token});
}

void Simulation::on_rebalance_check(const Event& e) {
  Peer& p = peers_[e.a];
  if (e.life != p.check_token || p.state != PeerState::serving) return;
  const rebalance::Decision decision = p.rebalancer->check(loads_view_, s_.stages, now_);
  schedule_check(e.a);
  if (decision.move) start_move(e.a, decision.to_stage);
}

// The mover stops announcing at once, finishes what is queued at it, then downloads.
void Simulation::start_move(int peer, int to_stage) {
  Peer& p = peers_[peer];
  ++summary_.moves;
  emit({{"kind", "move"}, {"t", fixed(now_)}, {"peer", p.id}, {"from_stage", p.stage}, {"to_stage", to_stage}});
  p.state = PeerState::draining;
  p.move_to = to_stage;
  withdraw(peer);
  if (!p.current && p.queue.empty()) begin_download(peer);
}

void Simulation::begin_download(int peer) {
  Peer& p = peers_[peer];
  summary_.lost_samples += p.accumulated;  // gradients it held for the old stage
  p.accumulated = 0;
  p.has_published = false;
  p.stage = p.move_to;
  p.move_to = -1;
  p.state = PeerState::downloading;
  p.measured_throughput = 0;  // a new stage service measures itself anew
  push(now_ + download_seconds(p), Event{EventKind::download_done, peer, 0, p.life});
  bounds_dirty_ = true;
}

void Simulation::on_download_done(const Event& e) {
  Peer& p = peers_[e.a];
  if (e.life != p.life || p.state != PeerState::downloading) return;
  p.state = PeerState::serving;
  p.step = stages_[p.stage].step;
  p.withdrawn = false;
  announce(e.a);
  start_announcing(e.a);
  bounds_dirty_ = true;
  emit({{"kind", "ready"}, {"t", fixed(now_)}, {"peer", p.id}, {"stage", p.stage}});
  if (p.rebalancer) {
    p.rebalancer->reset(now_);
    schedule_check(e.a);
  }
}

void Simulation::mark_alive(int peer, bool alive) {
  int& position = alive_position_[peer];
  if (alive && position < 0) {
    position = static_cast<int>(alive_.size());
    alive_.push_back(peer);
  } else if (!alive && position >= 0) {
    const int last = alive_.back();
    alive_[position] = last;
    alive_position_[last] = position;
    alive_.pop_back();
    position = -1;
  }
}

}  // namespace swarm::sim::detail
