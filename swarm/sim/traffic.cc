// The trainers' microbatches and the peers' FIFO queues, as the real runtime runs them:
// a microbatch goes forward through stages 0 .. S-2, then one fused forward+backward
// request to the last stage, then backward S-2 .. 0 (swarm/trainer/trainer.h). Each hop
// asks the trainer's router of that stage for a peer; a timeout or an error is reported
// to the router and the hop is retried on another peer (call_stage).
#include <algorithm>
#include <charconv>

#include "swarm/sim/swarm_model.h"

namespace swarm::sim::detail {
namespace {

int peer_index(const PeerId& id) {
  int index = -1;
  std::from_chars(id.data() + 1, id.data() + id.size(), index);  // ids are "p" + index
  return index;
}

}  // namespace

// Hops 0 .. S-2 forward stage h; hop S-1 is the last stage's fused request; hops S ..
// 2S-2 backward stage 2S-2-h. Stage 0 receives tokens; the others a hidden tensor.
Hop Simulation::hop_of(int hop) const {
  const int last = s_.stages - 1;
  const int64_t tokens = s_.microbatch * s_.seq_len * 4;
  const int64_t hidden = s_.activation_bytes;
  auto input_bytes = [&](int stage) { return stage == 0 ? tokens : hidden; };
  if (hop < last) return Hop{hop, TaskKind::forward, 1.0, input_bytes(hop), hidden, s_.forward_timeout};
  if (hop == last) {
    return Hop{last, TaskKind::backward, s_.last_stage_cost, input_bytes(last) + tokens, last == 0 ? 4 : hidden,
               s_.backward_timeout};
  }
  const int stage = 2 * last - hop;
  return Hop{stage, TaskKind::backward, s_.backward_cost, input_bytes(stage) + hidden, stage == 0 ? 0 : hidden,
             s_.backward_timeout};
}

void Simulation::start_microbatch(int trainer) {
  const int mb = free_microbatches_.back();
  free_microbatches_.pop_back();
  Microbatch& m = microbatches_[mb];
  m.trainer = trainer;
  m.hop = 0;
  m.active = true;
  ++summary_.microbatches_started;
  begin_hop(mb);
}

void Simulation::begin_hop(int mb) {
  Microbatch& m = microbatches_[mb];
  m.hop_started_at = now_;
  m.tried.clear();
  attempt_hop(mb);
}

void Simulation::attempt_hop(int mb) {
  Microbatch& m = microbatches_[mb];
  const Hop hop = hop_of(m.hop);
  std::optional<PeerId> chosen = routers_[m.trainer][hop.stage].choose(hop.kind, s_.microbatch, now_, m.tried);
  if (!chosen) {
    if (now_ > m.hop_started_at + s_.abandon_after) return end_microbatch(mb, false);
    // Every known peer failed this hop: look again at the next registry view, and let
    // them all be tried anew (call_stage clears `tried` and forces a refresh).
    m.tried.clear();
    m.attempt = ++next_attempt_;  // nothing of an earlier attempt may land now
    waiting_.push_back(mb);
    return;
  }
  const int p = peer_index(*chosen);
  m.attempt = ++next_attempt_;
  m.peer = p;
  m.sent_at = now_;
  push(now_ + hop.timeout, Event{EventKind::attempt_timeout, mb, p, 0, m.attempt});
  Peer& peer = peers_[p];
  if (peer.state == PeerState::dead) return;  // nobody answers: the timeout fires
  const double arrives = transfer(peer.inbound_free_at, hop.request_bytes, peer);
  push(arrives, Event{EventKind::task_arrives, p, mb, peer.life, m.attempt});
}

void Simulation::retry_waiting() {
  if (waiting_.empty()) return;
  std::vector<int> retry;
  retry.swap(waiting_);
  for (int mb : retry) {
    Microbatch& m = microbatches_[mb];
    // The forced refresh of this trainer's router for the stage it waits on.
    routers_[m.trainer][hop_of(m.hop).stage].set_peers(stages_[hop_of(m.hop).stage].view, now_);
    attempt_hop(mb);
  }
}

// One transfer over one direction of a peer's link, after those already on it.
double Simulation::transfer(double& link_free_at, int64_t bytes, const Peer& p) {
  const double start = std::max(now_, link_free_at);
  link_free_at = start + static_cast<double>(bytes) / p.bytes_per_second;
  return link_free_at + p.latency;
}

void Simulation::on_task_arrives(const Event& e) {
  Peer& p = peers_[e.a];
  if (p.life != e.life || p.state == PeerState::dead) return;
  Microbatch& m = microbatches_[e.b];
  if (m.attempt != e.token) {
    // Only a timeout ends an attempt before its request lands: the deadline has passed,
    // and the peer drops such work unseen.
    ++summary_.expired_dropped;
    return;
  }
  const Hop hop = hop_of(m.hop);
  if (!serves(p) || p.stage != hop.stage) {
    // It left this stage (it downloads or serves another now): it refuses the request.
    push(now_ + p.latency, Event{EventKind::reply_error, e.b, e.a, 0, e.token});
    return;
  }
  p.queue.push_back({e.b, m.hop, e.token, m.sent_at + hop.timeout});
  if (!p.current) serve_next(e.a);
}

// The next task whose trainer still waits for it; a peer drops work whose caller gave up.
void Simulation::serve_next(int peer) {
  Peer& p = peers_[peer];
  while (!p.queue.empty()) {
    const QueuedTask task = p.queue.front();
    p.queue.pop_front();
    if (task.deadline < now_) {
      ++summary_.expired_dropped;
      continue;
    }
    const Hop hop = hop_of(task.hop);
    const double nominal = hop.cost * static_cast<double>(s_.microbatch) / p.throughput;
    const double jitter = s_.compute_jitter * (2 * compute_rng_.next_unit() - 1);
    p.current = task;
    p.current->service_seconds = nominal * (1 + jitter);
    push(now_ + p.current->service_seconds, Event{EventKind::task_done, peer, task.microbatch, p.life, task.attempt});
    return;
  }
  p.current.reset();
  if (p.state == PeerState::draining) begin_download(peer);
}

void Simulation::on_task_done(const Event& e) {
  Peer& p = peers_[e.a];
  if (p.life != e.life || p.state == PeerState::dead) return;
  const QueuedTask task = *p.current;
  const Microbatch& m = microbatches_[task.microbatch];
  // Its trainer may have timed out meanwhile: the peer computed it anyway, measures
  // itself on it, and its late reply would be ignored, so none is sent.
  const bool current = m.active && m.attempt == task.attempt;
  const Hop hop = hop_of(task.hop);
  const double rate = measured_rate(hop, task.service_seconds);
  p.measured_throughput = p.measured_throughput == 0 ? rate : 0.9 * p.measured_throughput + 0.1 * rate;
  if (current) {
    const double arrives = transfer(p.outbound_free_at, hop.reply_bytes, p);
    push(arrives, Event{EventKind::reply_ok, task.microbatch, e.a, 0, task.attempt});
  }
  p.current.reset();
  serve_next(e.a);
}

// StageService's measure (runtime): forward units per second, any backward request
// counted as backward_cost. Or (stage) the stage's own samples per second, in a middle
// stage's forward units: the rate that makes stage totals comparable across stages.
double Simulation::measured_rate(const Hop& hop, double seconds) const {
  const double samples = static_cast<double>(s_.microbatch);
  if (s_.announce_throughput == ThroughputReport::runtime) {
    return samples * (hop.kind == TaskKind::backward ? s_.backward_cost : 1.0) / seconds;
  }
  return samples * hop.cost / seconds * (1 + s_.backward_cost) / stage_costs_[hop.stage];
}

void Simulation::on_reply(const Event& e, bool ok) {
  Microbatch& m = microbatches_[e.a];
  if (!m.active || m.attempt != e.token) return;  // the trainer stopped waiting for it
  const Hop hop = hop_of(m.hop);
  AnyRouter& router = routers_[m.trainer][hop.stage];
  const PeerId& id = peers_[e.b].id;
  if (!ok) {
    ++summary_.errors;
    router.report(id, hop.kind, s_.microbatch, Outcome::error, now_ - m.sent_at, now_);
    m.tried.push_back(id);
    return attempt_hop(e.a);
  }
  router.report(id, hop.kind, s_.microbatch, Outcome::success, now_ - m.sent_at, now_);
  if (hop.kind == TaskKind::backward) credit_samples(e.b, hop.stage);
  if (++m.hop == 2 * s_.stages - 1) return end_microbatch(e.a, true);
  begin_hop(e.a);
}

void Simulation::on_attempt_timeout(const Event& e) {
  Microbatch& m = microbatches_[e.a];
  if (!m.active || m.attempt != e.token) return;
  const Hop hop = hop_of(m.hop);
  ++summary_.timeouts;
  const PeerId& id = peers_[e.b].id;
  routers_[m.trainer][hop.stage].report(id, hop.kind, s_.microbatch, Outcome::timeout, hop.timeout, now_);
  m.tried.push_back(id);
  attempt_hop(e.a);
}

// The stage counts a microbatch when its backward is accepted (DESIGN §5.2); a peer that
// died or left the stage since it computed has nobody to add the samples to.
void Simulation::credit_samples(int peer, int stage) {
  Peer& p = peers_[peer];
  if (serves(p) && p.stage == stage) {
    p.accumulated += s_.microbatch;
    p.accepted += s_.microbatch;
  } else {
    summary_.lost_samples += s_.microbatch;
  }
}

void Simulation::end_microbatch(int mb, bool completed) {
  Microbatch& m = microbatches_[mb];
  m.active = false;
  m.attempt = ++next_attempt_;
  if (completed) {
    ++summary_.microbatches_completed;
    window_completed_samples_ += s_.microbatch;
  } else {
    ++summary_.microbatches_abandoned;
  }
  const int trainer = m.trainer;
  free_microbatches_.push_back(mb);
  start_microbatch(trainer);  // the trainer keeps its window full (DESIGN §5.2)
}

}  // namespace swarm::sim::detail
