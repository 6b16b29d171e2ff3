// Within a stage: peers publish progress records, decide_global_batch (the production
// tracker) says when the stage's global batch is done, and an all-reduce round takes
// time while the peers keep computing; samples arriving meanwhile count toward the next
// step (DESIGN §5.3).
#include <algorithm>
#include <cmath>

#include "swarm/averaging/round_protocol.h"
#include "swarm/sim/swarm_model.h"

namespace swarm::sim::detail {

void Simulation::publish_progress() {
  for (Peer& p : peers_) {
    if (!serves(p)) continue;
    const double recent = static_cast<double>(p.accepted - p.accepted_at_last_tick) / s_.announce_period;
    p.accepted_at_last_tick = p.accepted;
    p.rate = p.has_published ? 0.7 * p.rate + 0.3 * recent : recent;
    p.published.peer_id = p.id;
    p.published.stage = p.stage;
    p.published.step = p.step;
    p.published.samples = p.accumulated;
    p.published.samples_per_second = p.rate;
    p.published.published_at = now_;
    p.has_published = true;
  }
}

// Every peer of a stage sees the same records, so one decision stands for all of them.
void Simulation::check_global_batches() {
  std::vector<ProgressRecord> records;
  for (int st = 0; st < s_.stages; ++st) {
    StageState& stage = stages_[st];
    if (stage.averaging) continue;
    records.clear();
    for (const Peer& p : peers_) {
      // A dead peer's last record stays until it is stale, as in the registry.
      if (p.has_published && p.published.stage == st) records.push_back(p.published);
    }
    const GlobalBatchDecision d = decide_global_batch(s_.global_batch, stage.step, records, now_);
    if (d.ready) start_round(st);
  }
}

// Every serving peer of the stage joins the round with the gradients it holds.
void Simulation::take_round_members(int st) {
  StageState& stage = stages_[st];
  stage.round_members.clear();
  stage.round_samples = 0;
  for (int index = 0; index < static_cast<int>(peers_.size()); ++index) {
    Peer& p = peers_[index];
    if (!serves(p) || p.stage != st) continue;
    stage.round_members.push_back(index);
    stage.round_samples += p.accumulated;
    p.accumulated = 0;
  }
}

// Butterfly all-reduce: reduce-scatter then all-gather move about twice the gradient
// through the slowest member's link, in log2(group) latency-bound rounds.
void Simulation::start_round(int st) {
  StageState& stage = stages_[st];
  take_round_members(st);
  if (stage.round_members.empty()) return;
  double slowest_link = std::numeric_limits<double>::infinity();
  double worst_latency = 0;
  for (int index : stage.round_members) {
    slowest_link = std::min(slowest_link, peers_[index].link.bytes_per_second);
    worst_latency = std::max(worst_latency, peers_[index].link.latency);
  }
  const size_t group = stage.round_members.size();
  const double seconds = group < 2 ? 0.0
                                   : 2.0 * static_cast<double>(s_.gradient_bytes) / slowest_link +
                                         worst_latency * std::ceil(std::log2(static_cast<double>(group)));
  stage.averaging = true;
  stage.round_ends_at = now_ + seconds;
  for (int index : stage.round_members) peers_[index].in_round = true;
  push(now_ + seconds, Event{EventKind::round_done, st, 0, 0, ++stage.round});
}

// Members that died or left are dropped from the round; the rest finish without them.
void Simulation::on_round_done(const Event& e) {
  StageState& stage = stages_[e.a];
  if (e.token != stage.round) return;
  stage.averaging = false;
  for (int index : stage.round_members) {
    peers_[index].in_round = false;
    wake_held(index);  // work that waited for this step goes on
  }
  bool survivor = false;
  for (int index : stage.round_members) survivor |= serves(peers_[index]) && peers_[index].stage == e.a;
  if (!survivor) {
    summary_.lost_samples += stage.round_samples;
    return;
  }
  // A joined round counts the global batches its members took, as the round
  // protocol's COMMIT does (steps_for_samples); a records round is one step.
  stage.step += s_.rounds == RoundTrigger::joins ? steps_for_samples(stage.round_samples, s_.global_batch.target_samples,
                                                                      &stage.step_credit)
                                                 : 1;
  summary_.stepped_samples += stage.round_samples;
  for (Peer& p : peers_) {
    if (serves(p) && p.stage == e.a) p.step = stage.step;
  }
  if (s_.rounds == RoundTrigger::joins) {
    // Samples that came in during the round may already make the next batch.
    for (int index : stage.round_members) {
      if (serves(peers_[index]) && peers_[index].stage == e.a) return check_joined_batch(e.a, index);
    }
  }
}

}  // namespace swarm::sim::detail
