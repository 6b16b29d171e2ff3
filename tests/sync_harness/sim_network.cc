#include "tests/sync_harness/sim_network.h"

namespace swarm::sync {

void SimNetwork::push(Flight f) {
  f.seq = ++seq_;
  queue_.push(std::move(f));
}

std::optional<Flight> SimNetwork::pop_due(double now) {
  if (queue_.empty() || queue_.top().due > now) return std::nullopt;
  Flight f = queue_.top();
  queue_.pop();
  return f;
}

int SimNetwork::add_rule(FaultRule rule) {
  rules_.push_back(rule);
  return static_cast<int>(rules_.size()) - 1;
}

bool SimNetwork::needs_phase() const {
  for (const auto& r : rules_) {
    if (r.phase >= 0) return true;
  }
  return false;
}

FaultVerdict SimNetwork::judge(RoundOp op, int phase, int from, int to, double now, SplitMix64& rng) const {
  FaultVerdict v;
  for (const auto& r : rules_) {
    if (now < r.start || now >= r.end) continue;
    if (r.op && *r.op != op) continue;
    if (r.phase >= 0 && (op != RoundOp::part || r.phase != phase)) continue;
    if ((r.from >= 0 && r.from != from) || (r.to >= 0 && r.to != to)) continue;
    // Every rule draws the same numbers whether it fires or not: a schedule's
    // other faults do not shift when one rule's probability changes.
    const double d = rng.next_unit(), u = rng.next_unit(), j = rng.next_unit();
    v.drop = v.drop || d < r.drop;
    v.duplicate = v.duplicate || u < r.duplicate;
    v.extra_delay += r.delay + j * r.jitter;
  }
  return v;
}

}  // namespace swarm::sync
