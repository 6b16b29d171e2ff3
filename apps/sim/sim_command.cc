#include "apps/sim/sim_command.h"

#include <charconv>
#include <cstdio>
#include <fstream>
#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "swarm/sim/simulator.h"

namespace swarm::apps {
namespace {

Result<std::vector<int>> parse_counts(const std::string& text) {
  std::vector<int> counts;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, end - start);
    int n = 0;
    auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), n);
    if (item.empty() || ec != std::errc() || ptr != item.data() + item.size()) {
      return invalid_argument("--peers-per-stage: '{}' is not a peer count (expected A,B,...)", item);
    }
    counts.push_back(n);
    start = end + 1;
  }
  return counts;
}

Result<sim::Distribution> distribution_flag(const std::string& text, const char* flag) {
  auto d = sim::parse_distribution(text);
  if (!d.is_ok()) return d.status().with_context(flag);
  return d;
}

Status apply_time(const SimFlags& f, sim::Scenario* s) {
  if (f.hours != 0 && f.seconds != 0) return invalid_argument("give --hours or --seconds, not both");
  if (f.hours != 0) s->seconds = f.hours * 3600;
  if (f.seconds != 0) s->seconds = f.seconds;
  if (f.hours < 0 || f.seconds < 0) return invalid_argument("--hours and --seconds must be > 0");
  return Status::ok();
}

void add_swarm_flags(CLI::App* c, SimFlags* f) {
  sim::Scenario& s = f->scenario;
  c->add_option("--peers", s.peers, "Peers at the start")->capture_default_str();
  c->add_option("--stages", s.stages, "Pipeline stages")->capture_default_str();
  c->add_option("--peers-per-stage", f->peers_per_stage, "Initial peers per stage, A,B,... (default: round robin)");
  c->add_option("--trainers", s.trainers, "Trainers (0: ceil(peers / 100))")->capture_default_str();
  c->add_option("--in-flight", s.in_flight, "Microbatches each trainer keeps going (0: ceil(4 peers / trainers))")
      ->capture_default_str();
  c->add_option("--microbatch", s.microbatch, "Samples per microbatch")->capture_default_str();
  c->add_option("--throughput", f->throughput, "Peer throughput, forward samples/s: const:X, uniform:A:B, "
                "lognormal:MU:SIGMA or choice:A,B,...")->capture_default_str();
  c->add_option("--backward-cost", s.backward_cost, "Forward units per backward sample")->capture_default_str();
  c->add_option("--last-stage-cost", s.last_stage_cost, "Forward units per sample of the last stage's fused task")
      ->capture_default_str();
  c->add_option("--compute-jitter", s.compute_jitter, "Each task takes its nominal time x U[1 - j, 1 + j]")
      ->capture_default_str();
  c->add_option("--announce-throughput", f->announce_throughput,
                "What peers announce: stage (own stage's samples/s, comparable across stages) or runtime "
                "(StageService's forward units)")->capture_default_str();
}

void add_link_flags(CLI::App* c, SimFlags* f) {
  sim::Scenario& s = f->scenario;
  c->add_option("--latency-ms", f->latency_ms, "One-way latency per peer (a distribution)")->capture_default_str();
  c->add_option("--bandwidth-mbps", f->bandwidth_mbps, "Link bandwidth per peer (a distribution)")
      ->capture_default_str();
  c->add_option("--seq-len", s.seq_len, "Tokens per sample")->capture_default_str();
  c->add_option("--d-model", s.d_model, "Hidden width")->capture_default_str();
  c->add_option("--activation-bytes", s.activation_bytes,
                "Bytes per hidden tensor (0: 8-bit codec of microbatch x seq-len x d-model)")->capture_default_str();
  c->add_option("--activation-gradient-bytes", s.activation_gradient_bytes,
                "Bytes per gradient of a hidden tensor (0: --activation-bytes)")->capture_default_str();
  c->add_option("--stage-params", s.stage_params, "Parameters per stage")->capture_default_str();
  c->add_option("--state-bytes", s.state_bytes, "State a joining or moving peer downloads (0: 12 x stage-params)")
      ->capture_default_str();
  c->add_option("--gradient-bytes", s.gradient_bytes, "Gradient bytes all-reduced per step (0: stage-params)")
      ->capture_default_str();
  c->add_option("--token-bytes", s.token_bytes, "Bytes of a microbatch's tokens, and again of its targets "
                "(0: 4 x microbatch x seq-len)")->capture_default_str();
  c->add_option("--loss-bytes", s.loss_bytes, "Stage 0's answer to its trainer in p2p mode")->capture_default_str();
  c->add_option("--hops", f->hops, "hub (the trainer sends every hop) or p2p (peers send each other the activations)")
      ->capture_default_str();
  c->add_option("--trainer-bandwidth-mbps", s.trainer_bandwidth_mbps, "Each trainer's link (0: unlimited)")
      ->capture_default_str();
  c->add_option("--trainer-latency-ms", s.trainer_latency_ms, "Each trainer's one-way latency")->capture_default_str();
}

void add_trainer_flags(CLI::App* c, SimFlags* f) {
  sim::Scenario& s = f->scenario;
  c->add_option("--router", f->router, "stochastic, round_robin, random or least_loaded")->capture_default_str();
  c->add_option("--timeout", s.forward_timeout, "Seconds a trainer waits for a forward reply")->capture_default_str();
  c->add_option("--backward-timeout", s.backward_timeout, "Seconds a trainer waits for a backward reply")
      ->capture_default_str();
  c->add_option("--abandon-after", s.abandon_after, "Seconds a hop may find no usable peer")->capture_default_str();
  c->add_option("--announce-period", s.announce_period, "Seconds between announcements")->capture_default_str();
  c->add_option("--announce-ttl", s.announce_ttl, "Seconds a record lives")->capture_default_str();
  c->add_option("--refresh-period", s.refresh_period, "Seconds between router refreshes")->capture_default_str();
  c->add_option("--global-batch", f->global_batch, "Samples per global step")->capture_default_str();
  c->add_option("--rounds", f->rounds, "When a stage's round starts: records (progress records, each announce period) "
                "or joins (the round protocol's JOIN and BEGIN, each a link crossing)")->capture_default_str();
  c->add_option("--forward-hold", s.forward_hold, "Seconds a forward waits for a round to take gradients pending "
                "at its peer (as swarm local's --forward-hold)")->capture_default_str();
  c->add_option("--round-wait", s.round_wait, "Seconds work arriving during a round waits for its step "
                "(as swarm local's --round-wait; 0: none)")->capture_default_str();
}

void add_churn_flags(CLI::App* c, SimFlags* f) {
  sim::Scenario& s = f->scenario;
  c->add_option("--churn", s.churn, "Fraction of the initial peers leaving over the run")->capture_default_str();
  c->add_option("--join-rate", s.join_rate, "Peers joining per hour")->capture_default_str();
  c->add_option("--preempt-rate", s.preempt_rate, "Peers preempted per hour (they rejoin after --downtime)")
      ->capture_default_str();
  c->add_option("--downtime", f->downtime, "Seconds a preempted peer is away (a distribution)")->capture_default_str();
  c->add_option("--schedule", f->schedule, "kill:STAGE:AT_S,join:AT_S,...");
  c->add_flag("--no-rebalance", f->no_rebalance, "Peers never move between stages");
  rebalance::RebalanceConfig& r = s.rebalance_config;
  c->add_option("--rebalance-period", r.period_seconds, "Seconds between a peer's checks")->capture_default_str();
  c->add_option("--rebalance-jitter", r.jitter_fraction, "Jitter of the period, a fraction")->capture_default_str();
  c->add_option("--rebalance-min-gain", r.min_gain, "Relative gain a move must promise")->capture_default_str();
  c->add_option("--rebalance-confirmations", r.confirmations, "Consecutive checks planning the same move")
      ->capture_default_str();
}

void add_run_flags(CLI::App* c, SimFlags* f) {
  sim::Scenario& s = f->scenario;
  c->add_option("--hours", f->hours, "Simulated hours (default 1)");
  c->add_option("--seconds", f->seconds, "Simulated seconds, instead of --hours");
  c->add_option("--sample-every", s.sample_every, "Seconds per time-series sample (0: min(60, run / 20))")
      ->capture_default_str();
  c->add_option("--seed", s.seed, "Seed of every random draw")->capture_default_str();
  c->add_option("--out", f->out, "Where the JSON lines go")->required();
}

}  // namespace

void add_sim_flags(CLI::App* command, SimFlags* flags) {
  add_swarm_flags(command, flags);
  add_link_flags(command, flags);
  add_trainer_flags(command, flags);
  add_churn_flags(command, flags);
  add_run_flags(command, flags);
}

Result<sim::Scenario> scenario_from(const SimFlags& f) {
  sim::Scenario s = f.scenario;
  SWARM_RETURN_IF_ERROR(apply_time(f, &s));
  if (!f.peers_per_stage.empty()) {
    SWARM_ASSIGN_OR_RETURN(s.peers_per_stage, parse_counts(f.peers_per_stage));
  }
  SWARM_ASSIGN_OR_RETURN(s.throughput, distribution_flag(f.throughput, "--throughput"));
  SWARM_ASSIGN_OR_RETURN(s.latency_ms, distribution_flag(f.latency_ms, "--latency-ms"));
  SWARM_ASSIGN_OR_RETURN(s.bandwidth_mbps, distribution_flag(f.bandwidth_mbps, "--bandwidth-mbps"));
  SWARM_ASSIGN_OR_RETURN(s.downtime, distribution_flag(f.downtime, "--downtime"));
  SWARM_ASSIGN_OR_RETURN(s.router, sim::parse_router(f.router));
  SWARM_ASSIGN_OR_RETURN(s.announce_throughput, sim::parse_throughput_report(f.announce_throughput));
  SWARM_ASSIGN_OR_RETURN(s.schedule, sim::parse_schedule(f.schedule));
  SWARM_ASSIGN_OR_RETURN(s.hops, sim::parse_hop_mode(f.hops));
  SWARM_ASSIGN_OR_RETURN(s.rounds, sim::parse_round_trigger(f.rounds));
  s.rebalance = !f.no_rebalance;
  s.global_batch.target_samples = f.global_batch;
  return s.resolved();
}

int run_sim(const SimFlags& flags) {
  auto scenario = scenario_from(flags);
  if (!scenario.is_ok()) {
    fmt::print(stderr, "swarm sim: {}\n", scenario.status().message());
    return 2;
  }
  std::ofstream out(flags.out, std::ios::binary | std::ios::trunc);
  if (!out) {
    fmt::print(stderr, "swarm sim: cannot write --out {}\n", flags.out);
    return 1;
  }
  const bool long_run = scenario->seconds >= 600;
  auto progress = [&](double t, double total) {
    if (long_run) fmt::print(stderr, "swarm sim: {:.0f}% ({:.0f} of {:.0f} simulated s)\n", 100 * t / total, t, total);
  };
  auto summary = sim::simulate(*scenario, out, progress);
  out.close();
  if (!summary.is_ok() || !out) {
    fmt::print(stderr, "swarm sim: {}\n", summary.is_ok() ? "writing --out failed" : summary.status().message());
    return 1;
  }
  fmt::print("sim: {} peers, {} stages, {:.0f} s, router {}, hops {}, rebalance {}: throughput {:.1f} samples/s "
             "({:.1f} at the end), oracle {:.1f}, efficiency {:.3f}, {} moves, {} completed, {} abandoned, "
             "global steps {} -> {}\n",
             scenario->peers, scenario->stages, scenario->seconds, sim::router_name(scenario->router),
             sim::hop_mode_name(scenario->hops), scenario->rebalance ? "on" : "off", summary->throughput_mean,
             summary->throughput_end, summary->oracle_mean, summary->efficiency, summary->moves,
             summary->microbatches_completed, summary->microbatches_abandoned, fmt::join(summary->global_steps, ","),
             flags.out);
  return 0;
}

void add_sim_command(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<SimFlags>();
  CLI::App* command = app.add_subcommand("sim", "Simulate a swarm (deterministic; see docs/SIMULATOR.md)");
  add_sim_flags(command, flags.get());
  command->callback([flags, exit_code] { *exit_code = run_sim(*flags); });
}

}  // namespace swarm::apps
