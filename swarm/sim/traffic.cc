// The trainers' microbatches and the peers' FIFO queues, as the real runtime runs them.
// Hub (swarm/trainer/trainer.h): a microbatch goes forward through stages 0 .. S-2, then
// one fused forward+backward request to the last stage, then backward S-2 .. 0, every
// hop a request from its trainer. Peer to peer: the trainer sends stage 0 the tokens,
// each peer sends its output on to a peer of the next stage, and the gradient returns
// along the same path to stage 0, which answers the trainer. Each hop asks a router of
// that stage for a peer; a timeout or an error is reported to it and the hop is retried
// on another peer (call_stage), or, for a path broken on its way back, from the trainer.
#include <algorithm>
#include <charconv>
#include <cmath>

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
  const int64_t tokens = s_.token_bytes;
  const int64_t hidden = s_.activation_bytes;
  const int64_t gradient = s_.activation_gradient_bytes;
  auto input_bytes = [&](int stage) { return stage == 0 ? tokens : hidden; };
  const int stage = hop <= last ? hop : 2 * last - hop;
  if (s_.hops == HopMode::peer_to_peer) {
    // The targets ride along to the loss stage; a backward's input stayed where its
    // forward ran, so only the gradient travels back.
    const int64_t answer = stage == 0 ? s_.loss_bytes : gradient;
    if (hop < last) return Hop{hop, TaskKind::forward, 1.0, input_bytes(hop) + tokens, 0, s_.forward_timeout};
    if (hop == last) return Hop{last, TaskKind::backward, s_.last_stage_cost, input_bytes(last) + tokens, answer, s_.backward_timeout};
    return Hop{stage, TaskKind::backward, s_.backward_cost, 0, answer, s_.backward_timeout};
  }
  if (hop < last) return Hop{hop, TaskKind::forward, 1.0, input_bytes(hop), hidden, s_.forward_timeout};
  if (hop == last) {
    return Hop{last, TaskKind::backward, s_.last_stage_cost, input_bytes(last) + tokens, last == 0 ? 4 : gradient,
               s_.backward_timeout};
  }
  return Hop{stage, TaskKind::backward, s_.backward_cost, input_bytes(stage) + gradient, stage == 0 ? 0 : gradient,
             s_.backward_timeout};
}

void Simulation::start_microbatch(int trainer) {
  const int mb = free_microbatches_.back();
  free_microbatches_.pop_back();
  Microbatch& m = microbatches_[mb];
  m.trainer = trainer;
  m.hop = 0;
  m.active = true;
  m.sender = -1;
  m.path.assign(static_cast<size_t>(s_.stages), -1);
  m.credited.assign(static_cast<size_t>(s_.stages), false);
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
  if (peers_[p].state == PeerState::dead) return;  // nobody answers: the timeout fires
  send_task(mb, p, hop.request_bytes);
}

// The current hop's request leaves its sender (the trainer, or the peer before it on the path).
void Simulation::send_task(int mb, int peer, int64_t bytes) {
  Microbatch& m = microbatches_[mb];
  const bool from_trainer = s_.hops == HopMode::hub || m.sender < 0;
  if (from_trainer) summary_.trainer_up_bytes += static_cast<double>(bytes);
  Link& from = from_trainer ? trainer_links_[m.trainer] : peers_[m.sender].link;
  const double arrives = cross(from, peers_[peer].link, bytes, now_);
  push(arrives, Event{EventKind::task_arrives, peer, mb, peers_[peer].life, m.attempt});
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

// One message sent at `at`: through the sender's up link after what is already on it,
// then the receiver's down link, then the larger latency. When it arrives.
double Simulation::cross(Link& from, Link& to, int64_t bytes, double at) {
  double t = at;
  if (!std::isinf(from.bytes_per_second)) {
    t = std::max(t, from.up_free_at) + static_cast<double>(bytes) / from.bytes_per_second;
    from.up_free_at = t;
  }
  if (!std::isinf(to.bytes_per_second)) {
    t = std::max(t, to.down_free_at) + static_cast<double>(bytes) / to.bytes_per_second;
    to.down_free_at = t;
  }
  return t + std::max(from.latency, to.latency);
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
    push(now_ + p.link.latency, Event{EventKind::reply_error, e.b, e.a, 0, e.token});
    return;
  }
  p.queue.push_back({e.b, m.hop, e.token, m.sent_at + hop.timeout});
  if (!p.current && !p.waiting) serve_next(e.a);
}

// The next task whose trainer still waits for it; a peer drops work whose caller gave up.
void Simulation::serve_next(int peer) {
  Peer& p = peers_[peer];
  while (!p.queue.empty()) {
    if (p.queue.front().deadline < now_) {
      p.queue.pop_front();
      ++summary_.expired_dropped;
      continue;
    }
    if (must_wait(peer, p.queue.front())) return;
    const QueuedTask task = p.queue.front();
    p.queue.pop_front();
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
  if (current && s_.hops == HopMode::hub) {
    if (hop.kind == TaskKind::backward && credits_at_compute()) credit_samples(e.a, hop.stage, task.microbatch);
    summary_.trainer_down_bytes += static_cast<double>(hop.reply_bytes);
    const double arrives = cross(p.link, trainer_links_[m.trainer], hop.reply_bytes, now_);
    push(arrives, Event{EventKind::reply_ok, task.microbatch, e.a, 0, task.attempt});
  }
  p.current.reset();
  if (current && s_.hops == HopMode::peer_to_peer) {
    if (hop.kind == TaskKind::forward) {
      after_forward(e.a, task);
    } else {
      after_backward(e.a, task);
    }
  }
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
    if (s_.hops == HopMode::peer_to_peer && m.hop > s_.stages - 1) return restart_path(e.a);
    router.report(id, hop.kind, s_.microbatch, Outcome::error, now_ - m.sent_at, now_);
    m.tried.push_back(id);
    return attempt_hop(e.a);
  }
  if (s_.hops == HopMode::peer_to_peer) return end_microbatch(e.a, true);  // stage 0's answer: the path is done
  router.report(id, hop.kind, s_.microbatch, Outcome::success, now_ - m.sent_at, now_);
  if (hop.kind == TaskKind::backward && !credits_at_compute()) credit_samples(e.b, hop.stage, e.a);
  if (++m.hop == 2 * s_.stages - 1) return end_microbatch(e.a, true);
  begin_hop(e.a);
}

void Simulation::on_attempt_timeout(const Event& e) {
  Microbatch& m = microbatches_[e.a];
  if (!m.active || m.attempt != e.token) return;
  const Hop hop = hop_of(m.hop);
  ++summary_.timeouts;
  if (s_.hops == HopMode::peer_to_peer) {
    // Past the loss stage the path cannot be rerouted, and a sender that died cannot
    // retry: the trainer's deadline runs out and it sends the microbatch again.
    const bool sender_gone = m.sender >= 0 && !(serves(peers_[m.sender]) && peers_[m.sender].stage == hop.stage - 1);
    if (m.hop > s_.stages - 1 || sender_gone) return restart_path(e.a);
  }
  const PeerId& id = peers_[e.b].id;
  routers_[m.trainer][hop.stage].report(id, hop.kind, s_.microbatch, Outcome::timeout, hop.timeout, now_);
  m.tried.push_back(id);
  attempt_hop(e.a);
}

// The stage counts a microbatch when its backward is accepted (DESIGN §5.2); a peer that
// died or left the stage since it computed has nobody to add the samples to. A retried
// path's stage that counted it before refuses it again, as the replica does by its id.
void Simulation::credit_samples(int peer, int stage, int mb) {
  Microbatch& m = microbatches_[mb];
  if (m.credited[stage]) {
    ++summary_.duplicates_refused;
    return;
  }
  Peer& p = peers_[peer];
  if (serves(p) && p.stage == stage) {
    m.credited[stage] = true;
    p.accumulated += s_.microbatch;
    p.accepted += s_.microbatch;
    summary_.stage_samples[stage] += s_.microbatch;
    if (s_.rounds == RoundTrigger::joins) check_joined_batch(stage, peer);
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
