#include "swarm/sim/simulator.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "swarm/sim/oracle.h"
#include "swarm/sim/swarm_model.h"

namespace swarm::sim {
namespace detail {
namespace {

// Each purpose gets its own stream, so adding a draw for one (say, another churn event)
// does not shift every other (the peers' hardware, the routers' seeds).
uint64_t seed_for(uint64_t seed, uint64_t purpose) {
  SplitMix64 mix(seed ^ (0x9E3779B97F4A7C15ull * (purpose + 1)));
  return mix.next();
}

}  // namespace

Simulation::Simulation(const Scenario& resolved, std::ostream& out, const ProgressFn& progress)
    : s_(resolved),
      out_(out),
      progress_(progress),
      stage_costs_(resolved.stage_costs()),
      hardware_rng_(seed_for(resolved.seed, 1)),
      churn_rng_(seed_for(resolved.seed, 2)),
      router_seed_rng_(seed_for(resolved.seed, 3)),
      phase_rng_(seed_for(resolved.seed, 5)),
      compute_rng_(seed_for(resolved.seed, 6)),
      rebalance_seed_(seed_for(resolved.seed, 4)),
      stages_(static_cast<size_t>(resolved.stages)) {
  summary_.stage_samples.assign(static_cast<size_t>(resolved.stages), 0);
  windows_expected_ = static_cast<int64_t>(std::ceil(s_.seconds / s_.sample_every - 1e-9));
  tenth_ = std::max<int64_t>(1, windows_expected_ / 10);
}

int Simulation::add_peer(int stage, PeerState state) {
  const int index = static_cast<int>(peers_.size());
  Peer& p = peers_.emplace_back();
  p.id = fmt::format("p{:06d}", index);
  p.throughput = s_.throughput.sample(hardware_rng_);
  // A lognormal draw can underflow to 0; a peer that never finishes a task is no peer.
  p.throughput = std::max(p.throughput, 1e-9);
  p.link.latency = s_.latency_ms.sample(hardware_rng_) / 1000.0;
  p.link.bytes_per_second = std::max(s_.bandwidth_mbps.sample(hardware_rng_), 1e-9) * 1e6 / 8;
  p.state = state;
  p.stage = stage;
  p.announce_phase = s_.announce_period * phase_rng_.next_unit();
  if (s_.rebalance) p.rebalancer.emplace(s_.rebalance_config, p.id, rebalance_seed_, now_);
  alive_position_.push_back(-1);
  mark_alive(index, true);
  return index;
}

void Simulation::create_initial_peers() {
  std::vector<int> stage_of;
  if (s_.peers_per_stage.empty()) {
    for (int i = 0; i < s_.peers; ++i) stage_of.push_back(i % s_.stages);
  } else {
    for (int st = 0; st < s_.stages; ++st) stage_of.insert(stage_of.end(), s_.peers_per_stage[st], st);
  }
  // The initial peers hold their stage's state already: they serve from t = 0.
  for (int st : stage_of) {
    const int p = add_peer(st, PeerState::serving);
    announce(p);
    start_announcing(p);
    schedule_check(p);
  }
}

void Simulation::create_trainers() {
  routers_.resize(static_cast<size_t>(s_.trainers));
  Link trainer_link;
  if (s_.trainer_bandwidth_mbps > 0) trainer_link.bytes_per_second = s_.trainer_bandwidth_mbps * 1e6 / 8;
  trainer_link.latency = s_.trainer_latency_ms / 1000.0;
  trainer_links_.assign(static_cast<size_t>(s_.trainers), trainer_link);
  for (auto& per_stage : routers_) {
    for (int st = 0; st < s_.stages; ++st) per_stage.emplace_back(s_.router, router_seed_rng_.next(), s_.backward_cost);
  }
  for (int t = 0; t < s_.trainers; ++t) {
    refresh_phase_.push_back(s_.refresh_period * phase_rng_.next_unit());
    refresh_trainer(t);  // trainers read the registry before their first microbatch
    push(refresh_phase_[t], Event{EventKind::refresh, t});
  }
  microbatches_.resize(static_cast<size_t>(s_.trainers) * s_.in_flight);
  for (int i = static_cast<int>(microbatches_.size()) - 1; i >= 0; --i) free_microbatches_.push_back(i);
}

void Simulation::schedule_first_events() {
  push(0, Event{EventKind::tick});
  push(std::min(s_.sample_every, s_.seconds), Event{EventKind::sample});
  schedule_poisson(EventKind::departure);
  schedule_poisson(EventKind::join);
  schedule_poisson(EventKind::preemption);
  for (size_t i = 0; i < s_.schedule.size(); ++i) {
    push(s_.schedule[i].at, Event{EventKind::scheduled, static_cast<int32_t>(i)});
  }
}

Summary Simulation::run() {
  create_initial_peers();
  rebuild_loads_view();
  create_trainers();
  schedule_first_events();
  for (int t = 0; t < s_.trainers; ++t) {
    for (int k = 0; k < s_.in_flight; ++k) start_microbatch(t);
  }
  while (!queue_.empty() && queue_.next_time() <= s_.seconds) {
    auto [t, e] = queue_.pop();
    advance_clock(t);
    dispatch(e);
    ++summary_.events;
  }
  advance_clock(s_.seconds);
  if (s_.seconds - window_start_ > 1e-9) on_sample();
  return summarize();
}

void Simulation::dispatch(const Event& e) {
  switch (e.kind) {
    case EventKind::tick: return on_tick();
    case EventKind::announce: return on_announce(e);
    case EventKind::refresh: return on_refresh(e);
    case EventKind::sample: return on_sample();
    case EventKind::task_arrives: return on_task_arrives(e);
    case EventKind::task_done: return on_task_done(e);
    case EventKind::reply_ok: return on_reply(e, true);
    case EventKind::reply_error: return on_reply(e, false);
    case EventKind::attempt_timeout: return on_attempt_timeout(e);
    case EventKind::rebalance_check: return on_rebalance_check(e);
    case EventKind::download_done: return on_download_done(e);
    case EventKind::round_done: return on_round_done(e);
    case EventKind::round_begins: return on_round_begins(e);
    case EventKind::parts_reduced: return on_parts_reduced(e);
    case EventKind::resume_serving: return on_resume_serving(e);
    case EventKind::departure: return on_departure();
    case EventKind::join: return on_join();
    case EventKind::preemption: return on_preemption();
    case EventKind::rejoin: return on_rejoin(e.a);
    case EventKind::scheduled: return on_scheduled(e.a);
  }
}

// Integrates the bounds up to `t` with the values they held since the last change;
// a change at the current time is folded in before time moves on.
void Simulation::advance_clock(double t) {
  if (t > integrated_to_) {
    if (bounds_dirty_) recompute_bounds();
    oracle_integral_ += oracle_now_ * (t - integrated_to_);
    assignment_integral_ += assignment_now_ * (t - integrated_to_);
    integrated_to_ = t;
  }
  now_ = t;
  report_progress();
}

// The oracle over every alive peer (downloading ones included), floored by the swarm's
// own assignment of its serving peers, so a weak heuristic never reads as efficiency > 1.
void Simulation::recompute_bounds() {
  std::vector<double> alive_throughputs;
  std::vector<double> stage_totals(static_cast<size_t>(s_.stages), 0.0);
  for (int index : alive_) {
    const Peer& p = peers_[index];
    alive_throughputs.push_back(p.throughput);
    if (serves(p)) stage_totals[p.stage] += p.throughput;
  }
  // alive_ is in no meaningful order; sorting makes the heuristic's input canonical.
  std::sort(alive_throughputs.begin(), alive_throughputs.end());
  assignment_now_ = assignment_throughput(stage_totals, stage_costs_);
  oracle_now_ = std::max(best_assignment(alive_throughputs, stage_costs_).throughput, assignment_now_);
  bounds_dirty_ = false;
}

void Simulation::on_sample() {
  const double span = now_ - window_start_;
  const double throughput = static_cast<double>(window_completed_samples_) / span;
  const double oracle = (oracle_integral_ - window_oracle_start_) / span;
  const double assignment = (assignment_integral_ - window_assignment_start_) / span;
  const int64_t window = summary_.windows++;
  throughput_sum_ += throughput;
  oracle_sum_ += oracle;
  assignment_sum_ += assignment;
  if (oracle > 0) {
    efficiency_sum_ += throughput / oracle;
    ++efficiency_windows_;
  }
  if (window >= 1 && window <= tenth_) start_sum_ += throughput, ++start_windows_;
  if (window >= windows_expected_ - tenth_) end_sum_ += throughput, ++end_windows_;

  nlohmann::ordered_json record = {{"kind", "sample"},
                                   {"t", fixed(now_)},
                                   {"throughput", fixed(throughput)},
                                   {"oracle", fixed(oracle)},
                                   {"assignment", fixed(assignment)}};
  const nlohmann::ordered_json counts = stage_counts();
  for (const auto& [key, value] : counts.items()) record[key] = value;
  record["abandoned"] = summary_.microbatches_abandoned;
  record["completed"] = summary_.microbatches_completed;
  record["timeouts"] = summary_.timeouts;
  record["moves"] = summary_.moves;
  emit(record);

  window_start_ = now_;
  window_oracle_start_ = oracle_integral_;
  window_assignment_start_ = assignment_integral_;
  window_completed_samples_ = 0;
  const double next = static_cast<double>(++sample_index_ + 1) * s_.sample_every;
  if (next <= s_.seconds + 1e-9) push(std::min(next, s_.seconds), Event{EventKind::sample});
}

nlohmann::ordered_json Simulation::stage_counts() const {
  std::vector<int> serving(static_cast<size_t>(s_.stages), 0);
  int downloading = 0;
  for (int index : alive_) {
    const Peer& p = peers_[index];
    if (serves(p)) ++serving[p.stage];
    if (p.state == PeerState::downloading) ++downloading;
  }
  std::vector<int64_t> steps;
  for (const StageState& st : stages_) steps.push_back(st.step);
  return {{"alive", alive_.size()}, {"downloading", downloading}, {"peers_per_stage", serving}, {"global_steps", steps}};
}

void Simulation::on_tick() {
  lapse_records();
  rebuild_loads_view();
  retry_waiting();
  publish_progress();
  if (s_.rounds == RoundTrigger::records) check_global_batches();
  const double next = static_cast<double>(++tick_index_) * s_.announce_period;
  if (next <= s_.seconds) push(next, Event{EventKind::tick});
}

// The first time >= now of a periodic event with this phase.
double Simulation::next_phase_time(double phase, double period) const {
  if (now_ <= phase) return phase;
  return phase + std::ceil((now_ - phase) / period) * period;
}

void Simulation::emit(const nlohmann::ordered_json& record) { out_ << record.dump() << '\n'; }

void Simulation::report_progress() {
  if (!progress_) return;
  while (progress_tenths_ < 10 && now_ >= s_.seconds * (progress_tenths_ + 1) / 10.0) {
    ++progress_tenths_;
    progress_(now_, s_.seconds);
  }
}

Summary Simulation::summarize() {
  Summary& r = summary_;
  const double n = std::max(1, r.windows);
  r.throughput_mean = throughput_sum_ / n;
  r.oracle_mean = oracle_sum_ / n;
  r.assignment_mean = assignment_sum_ / n;
  r.efficiency = efficiency_windows_ > 0 ? efficiency_sum_ / static_cast<double>(efficiency_windows_) : 0;
  r.throughput_start = start_windows_ > 0 ? start_sum_ / static_cast<double>(start_windows_) : throughput_sum_ / n;
  r.throughput_end = end_windows_ > 0 ? end_sum_ / static_cast<double>(end_windows_) : 0;
  r.microbatches_in_flight = r.microbatches_started - r.microbatches_completed - r.microbatches_abandoned;
  r.global_steps.clear();
  for (const StageState& st : stages_) r.global_steps.push_back(st.step);
  r.peers_per_stage = stage_counts()["peers_per_stage"].get<std::vector<int>>();

  nlohmann::ordered_json record = {
      {"kind", "summary"},
      {"seconds", fixed(s_.seconds)},
      {"peers", s_.peers},
      {"stages", s_.stages},
      {"trainers", s_.trainers},
      {"in_flight", s_.in_flight},
      {"microbatch", s_.microbatch},
      {"router", router_name(s_.router)},
      {"rebalance", s_.rebalance},
      {"seed", s_.seed},
      {"oracle", kOracleMethod},
      {"oracle_scope", "compute bound of the alive peers; ignores in-flight limits, links and state downloads"},
      {"stage_costs", stage_costs_},
      {"throughput_mean", fixed(r.throughput_mean)},
      {"oracle_mean", fixed(r.oracle_mean)},
      {"assignment_mean", fixed(r.assignment_mean)},
      {"efficiency", fixed(r.efficiency)},
      {"throughput_start", fixed(r.throughput_start)},
      {"throughput_end", fixed(r.throughput_end)},
      {"windows", r.windows},
      {"started", r.microbatches_started},
      {"completed", r.microbatches_completed},
      {"abandoned", r.microbatches_abandoned},
      {"in_flight_at_end", r.microbatches_in_flight},
      {"moves", r.moves},
      {"departures", r.departures},
      {"kills", r.kills},
      {"preemptions", r.preemptions},
      {"joins", r.joins},
      {"timeouts", r.timeouts},
      {"errors", r.errors},
      {"expired_dropped", r.expired_dropped},
      {"lost_samples", r.lost_samples},
      {"stepped_samples", r.stepped_samples},
      {"hops", hop_mode_name(s_.hops)},
      {"rounds", round_trigger_name(s_.rounds)},
      {"stage_samples", r.stage_samples},
      {"path_restarts", r.path_restarts},
      {"duplicates_refused", r.duplicates_refused},
      {"trainer_up_bytes", fixed(r.trainer_up_bytes)},
      {"trainer_down_bytes", fixed(r.trainer_down_bytes)},
      {"global_steps", r.global_steps},
      {"peers_per_stage", r.peers_per_stage},
      {"events", r.events}};
  emit(record);
  return r;
}

}  // namespace detail

Result<Summary> simulate(const Scenario& scenario, std::ostream& out, const ProgressFn& progress) {
  SWARM_ASSIGN_OR_RETURN(Scenario resolved, scenario.resolved());
  detail::Simulation simulation(resolved, out, progress);
  return simulation.run();
}

}  // namespace swarm::sim
