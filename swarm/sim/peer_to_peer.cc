// Peer-to-peer paths (--hops p2p): a peer that finished a forward sends its output on to
// a peer of the next stage; the loss stage's gradient and each backward's go back to the
// peer that ran the stage before, which kept the activations; stage 0 answers the
// trainer. A sender retries a next hop that fails; a path broken on its way back is sent
// again from the trainer under the same microbatch, and each stage counts it once.
#include "swarm/sim/swarm_model.h"

namespace swarm::sim::detail {

void Simulation::after_forward(int peer, const QueuedTask& task) {
  Microbatch& m = microbatches_[task.microbatch];
  const Hop hop = hop_of(task.hop);
  // The sender learns of the hop once the next peer took it on (it answers at once).
  routers_[m.trainer][hop.stage].report(peers_[peer].id, hop.kind, s_.microbatch, Outcome::success, now_ - m.sent_at,
                                        now_);
  m.path[hop.stage] = peer;
  m.sender = peer;
  ++m.hop;
  begin_hop(task.microbatch);
}

void Simulation::after_backward(int peer, const QueuedTask& task) {
  Microbatch& m = microbatches_[task.microbatch];
  const Hop hop = hop_of(task.hop);
  if (hop.stage == s_.stages - 1) {
    routers_[m.trainer][hop.stage].report(peers_[peer].id, hop.kind, s_.microbatch, Outcome::success,
                                          now_ - m.sent_at, now_);
    m.path[hop.stage] = peer;
  }
  credit_samples(peer, hop.stage, task.microbatch);
  Peer& p = peers_[peer];
  if (hop.stage == 0) {
    summary_.trainer_down_bytes += static_cast<double>(hop.reply_bytes);
    const double arrives = cross(p.link, trainer_links_[m.trainer], hop.reply_bytes, now_);
    push(arrives, Event{EventKind::reply_ok, task.microbatch, peer, 0, task.attempt});
    return;
  }
  const int next = m.path[hop.stage - 1];
  ++m.hop;
  m.attempt = ++next_attempt_;
  m.peer = next;
  m.sent_at = now_;
  push(now_ + s_.backward_timeout, Event{EventKind::attempt_timeout, task.microbatch, next, 0, m.attempt});
  Peer& back = peers_[next];
  if (back.state == PeerState::dead) return;  // the path is broken: the deadline restarts it
  const double arrives = cross(p.link, back.link, hop.reply_bytes, now_);
  push(arrives, Event{EventKind::task_arrives, next, task.microbatch, back.life, m.attempt});
}

void Simulation::restart_path(int mb) {
  Microbatch& m = microbatches_[mb];
  ++summary_.path_restarts;
  m.hop = 0;
  m.sender = -1;
  std::fill(m.path.begin(), m.path.end(), -1);
  begin_hop(mb);
}

}  // namespace swarm::sim::detail
