#include "swarm/sim/scenario.h"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace swarm::sim {
namespace {

constexpr int kMaxStages = 1000;
constexpr int kMaxPeers = 1'000'000;
constexpr int64_t kMaxInFlightTotal = 10'000'000;  // bounds the simulator's memory
constexpr double kMaxSeconds = 1e7;                // about 116 days of sim time
constexpr double kMaxWindows = 1e6;                // samples per run
constexpr int64_t kMaxDimension = 1'000'000;       // microbatch, seq_len, d_model: products fit int64
constexpr int64_t kMaxParams = 1'000'000'000'000;  // 12 x params fits int64

bool positive(double x) { return x > 0 && std::isfinite(x); }
bool non_negative(double x) { return x >= 0 && std::isfinite(x); }

Result<double> parse_seconds(const std::string& text, const std::string& item) {
  double value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || !non_negative(value)) {
    return invalid_argument("--schedule item '{}': '{}' is not a time in seconds >= 0", item, text);
  }
  return value;
}

Result<int> parse_stage(const std::string& text, const std::string& item) {
  int value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || value < 0) {
    return invalid_argument("--schedule item '{}': '{}' is not a stage index >= 0", item, text);
  }
  return value;
}

Result<ScheduledEvent> parse_schedule_item(const std::string& item) {
  const std::vector<std::string> parts = split(item, ':');
  if (parts[0] == "kill" && parts.size() == 3) {
    ScheduledEvent e{ScheduledEvent::Kind::kill, 0, 0};
    SWARM_ASSIGN_OR_RETURN(e.stage, parse_stage(parts[1], item));
    SWARM_ASSIGN_OR_RETURN(e.at, parse_seconds(parts[2], item));
    return e;
  }
  if (parts[0] == "join" && parts.size() == 2) {
    ScheduledEvent e{ScheduledEvent::Kind::join, -1, 0};
    SWARM_ASSIGN_OR_RETURN(e.at, parse_seconds(parts[1], item));
    return e;
  }
  return invalid_argument("--schedule item '{}': expected kill:STAGE:AT_SECONDS or join:AT_SECONDS", item);
}

Status validate_counts(const Scenario& s) {
  if (s.stages < 1 || s.stages > kMaxStages) return invalid_argument("--stages must be in [1, {}], got {}", kMaxStages, s.stages);
  if (s.peers < 1 || s.peers > kMaxPeers) return invalid_argument("--peers must be in [1, {}], got {}", kMaxPeers, s.peers);
  if (s.trainers < 0) return invalid_argument("--trainers must be >= 1 (or 0 for auto), got {}", s.trainers);
  if (s.in_flight < 0) return invalid_argument("--in-flight must be >= 1 (or 0 for auto), got {}", s.in_flight);
  if (static_cast<int64_t>(s.trainers) * s.in_flight > kMaxInFlightTotal) {
    return invalid_argument("--trainers x --in-flight must be at most {}", kMaxInFlightTotal);
  }
  if (s.microbatch < 1 || s.microbatch > kMaxDimension) {
    return invalid_argument("--microbatch must be in [1, {}] samples, got {}", kMaxDimension, s.microbatch);
  }
  if (!s.peers_per_stage.empty()) {
    if (static_cast<int>(s.peers_per_stage.size()) != s.stages) {
      return invalid_argument("--peers-per-stage lists {} stages, but --stages is {}", s.peers_per_stage.size(), s.stages);
    }
    int64_t sum = 0;
    for (int n : s.peers_per_stage) {
      if (n < 0) return invalid_argument("--peers-per-stage: counts must be >= 0, got {}", n);
      sum += n;
    }
    if (sum != s.peers) return invalid_argument("--peers-per-stage adds up to {}, but --peers is {}", sum, s.peers);
  }
  return Status::ok();
}

Status validate_times(const Scenario& s) {
  if (!positive(s.seconds) || s.seconds > kMaxSeconds) {
    return invalid_argument("the simulated time (--seconds or --hours) must be in (0, {}] s, got {}", kMaxSeconds, s.seconds);
  }
  if (!non_negative(s.sample_every) || s.sample_every > s.seconds) {
    return invalid_argument("--sample-every must be in (0, the simulated time], got {}", s.sample_every);
  }
  if (s.sample_every > 0 && s.seconds / s.sample_every > kMaxWindows) {
    return invalid_argument("--sample-every {} s makes more than {} samples: the output would not fit", s.sample_every, kMaxWindows);
  }
  if (!positive(s.forward_timeout)) return invalid_argument("--timeout must be > 0 s, got {}", s.forward_timeout);
  if (!positive(s.backward_timeout)) return invalid_argument("--backward-timeout must be > 0 s, got {}", s.backward_timeout);
  if (!positive(s.abandon_after)) return invalid_argument("--abandon-after must be > 0 s, got {}", s.abandon_after);
  if (!positive(s.announce_period)) return invalid_argument("--announce-period must be > 0 s, got {}", s.announce_period);
  if (!(s.announce_ttl > s.announce_period) || !std::isfinite(s.announce_ttl)) {
    return invalid_argument("--announce-ttl must exceed --announce-period ({} s), got {}: records would lapse between announcements",
                            s.announce_period, s.announce_ttl);
  }
  if (!positive(s.refresh_period)) return invalid_argument("--refresh-period must be > 0 s, got {}", s.refresh_period);
  return Status::ok();
}

Status validate_positive_distribution(const Distribution& d, const char* flag, bool allow_zero) {
  const double lowest = d.min_value();
  const bool ok = d.kind() == Distribution::Kind::lognormal || (allow_zero ? lowest >= 0 : lowest > 0);
  if (!ok) return invalid_argument("{} must draw values {} 0, got {}", flag, allow_zero ? ">=" : ">", d.to_string());
  return Status::ok();
}

Status validate_model(const Scenario& s) {
  SWARM_RETURN_IF_ERROR(validate_positive_distribution(s.throughput, "--throughput", false));
  SWARM_RETURN_IF_ERROR(validate_positive_distribution(s.latency_ms, "--latency-ms", true));
  SWARM_RETURN_IF_ERROR(validate_positive_distribution(s.bandwidth_mbps, "--bandwidth-mbps", false));
  SWARM_RETURN_IF_ERROR(validate_positive_distribution(s.downtime, "--downtime", true));
  if (!positive(s.backward_cost)) return invalid_argument("--backward-cost must be > 0, got {}", s.backward_cost);
  if (!positive(s.last_stage_cost)) return invalid_argument("--last-stage-cost must be > 0, got {}", s.last_stage_cost);
  if (!(s.compute_jitter >= 0 && s.compute_jitter < 1)) {
    return invalid_argument("--compute-jitter must be in [0, 1), got {}", s.compute_jitter);
  }
  if (s.seq_len < 1 || s.seq_len > kMaxDimension) return invalid_argument("--seq-len must be in [1, {}], got {}", kMaxDimension, s.seq_len);
  if (s.d_model < 1 || s.d_model > kMaxDimension) return invalid_argument("--d-model must be in [1, {}], got {}", kMaxDimension, s.d_model);
  if (s.activation_bytes < 0) return invalid_argument("--activation-bytes must be >= 0, got {}", s.activation_bytes);
  if (s.activation_gradient_bytes < 0) {
    return invalid_argument("--activation-gradient-bytes must be >= 0, got {}", s.activation_gradient_bytes);
  }
  if (s.stage_params < 1 || s.stage_params > kMaxParams) {
    return invalid_argument("--stage-params must be in [1, {}], got {}", kMaxParams, s.stage_params);
  }
  if (s.state_bytes < 0) return invalid_argument("--state-bytes must be >= 0, got {}", s.state_bytes);
  if (s.gradient_bytes < 0) return invalid_argument("--gradient-bytes must be >= 0, got {}", s.gradient_bytes);
  if (s.token_bytes < 0) return invalid_argument("--token-bytes must be >= 0, got {}", s.token_bytes);
  if (s.loss_bytes < 0) return invalid_argument("--loss-bytes must be >= 0, got {}", s.loss_bytes);
  if (!non_negative(s.trainer_bandwidth_mbps)) {
    return invalid_argument("--trainer-bandwidth-mbps must be >= 0 (0: unlimited), got {}", s.trainer_bandwidth_mbps);
  }
  if (!non_negative(s.trainer_latency_ms)) return invalid_argument("--trainer-latency-ms must be >= 0, got {}", s.trainer_latency_ms);
  if (!non_negative(s.forward_hold)) return invalid_argument("--forward-hold must be >= 0 s, got {}", s.forward_hold);
  if (!non_negative(s.round_wait)) return invalid_argument("--round-wait must be >= 0 s, got {}", s.round_wait);
  return Status::ok();
}

Status validate_churn(const Scenario& s) {
  if (!(s.churn >= 0 && s.churn <= 1)) return invalid_argument("--churn is a fraction of the peers: it must be in [0, 1], got {}", s.churn);
  if (!non_negative(s.join_rate)) return invalid_argument("--join-rate must be >= 0 peers/hour, got {}", s.join_rate);
  if (!non_negative(s.preempt_rate)) return invalid_argument("--preempt-rate must be >= 0 peers/hour, got {}", s.preempt_rate);
  for (const ScheduledEvent& e : s.schedule) {
    if (e.kind == ScheduledEvent::Kind::kill && (e.stage < 0 || e.stage >= s.stages)) {
      return invalid_argument("--schedule: kill names stage {}, but there are {} stages", e.stage, s.stages);
    }
    if (!non_negative(e.at) || e.at > s.seconds) {
      return invalid_argument("--schedule: time {} s is outside the simulated [0, {}] s", e.at, s.seconds);
    }
  }
  return Status::ok();
}

}  // namespace

Result<RouterKind> parse_router(const std::string& name) {
  if (name == "stochastic") return RouterKind::stochastic;
  if (name == "round_robin") return RouterKind::round_robin;
  if (name == "random") return RouterKind::random;
  if (name == "least_loaded") return RouterKind::least_loaded;
  return invalid_argument("unknown --router '{}': expected stochastic, round_robin, random or least_loaded", name);
}

Result<ThroughputReport> parse_throughput_report(const std::string& name) {
  if (name == "stage") return ThroughputReport::stage;
  if (name == "runtime") return ThroughputReport::runtime;
  return invalid_argument("unknown --announce-throughput '{}': expected stage or runtime", name);
}

const char* throughput_report_name(ThroughputReport report) {
  return report == ThroughputReport::stage ? "stage" : "runtime";
}

const char* router_name(RouterKind kind) {
  switch (kind) {
    case RouterKind::stochastic: return "stochastic";
    case RouterKind::round_robin: return "round_robin";
    case RouterKind::random: return "random";
    case RouterKind::least_loaded: return "least_loaded";
  }
  return "?";
}

Result<HopMode> parse_hop_mode(const std::string& name) {
  if (name == "hub") return HopMode::hub;
  if (name == "p2p") return HopMode::peer_to_peer;
  return invalid_argument("unknown --hops '{}': expected hub or p2p", name);
}

const char* hop_mode_name(HopMode mode) { return mode == HopMode::hub ? "hub" : "p2p"; }

Result<RoundTrigger> parse_round_trigger(const std::string& name) {
  if (name == "records") return RoundTrigger::records;
  if (name == "joins") return RoundTrigger::joins;
  return invalid_argument("unknown --rounds '{}': expected records or joins", name);
}

const char* round_trigger_name(RoundTrigger trigger) { return trigger == RoundTrigger::records ? "records" : "joins"; }

Result<std::vector<ScheduledEvent>> parse_schedule(const std::string& text) {
  std::vector<ScheduledEvent> events;
  if (text.empty()) return events;
  for (const std::string& item : split(text, ',')) {
    SWARM_ASSIGN_OR_RETURN(ScheduledEvent e, parse_schedule_item(item));
    events.push_back(e);
  }
  std::stable_sort(events.begin(), events.end(), [](const auto& a, const auto& b) { return a.at < b.at; });
  return events;
}

Status Scenario::validate() const {
  SWARM_RETURN_IF_ERROR(validate_counts(*this));
  SWARM_RETURN_IF_ERROR(validate_times(*this));
  SWARM_RETURN_IF_ERROR(validate_model(*this));
  SWARM_RETURN_IF_ERROR(validate_churn(*this));
  SWARM_RETURN_IF_ERROR(rebalance_config.validate().with_context("rebalancing (--rebalance-*)"));
  SWARM_RETURN_IF_ERROR(global_batch.validate().with_context("--global-batch"));
  return Status::ok();
}

Result<Scenario> Scenario::resolved() const {
  SWARM_RETURN_IF_ERROR(validate());
  Scenario r = *this;
  if (r.trainers == 0) r.trainers = std::max(1, (r.peers + 99) / 100);
  if (r.in_flight == 0) r.in_flight = std::max(1, (4 * r.peers + r.trainers - 1) / r.trainers);
  if (r.sample_every == 0) r.sample_every = std::min(60.0, r.seconds / 20);
  if (r.activation_bytes == 0) {
    // The 8-bit blockwise codec: one code byte per value plus a float absmax per 4096.
    const int64_t values = r.microbatch * r.seq_len * r.d_model;
    r.activation_bytes = values + 4 * ((values + 4095) / 4096);
  }
  if (r.activation_gradient_bytes == 0) r.activation_gradient_bytes = r.activation_bytes;
  if (r.state_bytes == 0) r.state_bytes = 12 * r.stage_params;  // fp32 weights and two optimizer moments
  if (r.gradient_bytes == 0) r.gradient_bytes = r.stage_params;  // 8-bit all-reduce parts
  if (r.token_bytes == 0) r.token_bytes = 4 * r.microbatch * r.seq_len;  // int32 token ids
  SWARM_RETURN_IF_ERROR(r.validate());
  return r;
}

std::vector<double> Scenario::stage_costs() const {
  std::vector<double> costs(static_cast<size_t>(stages), 1.0 + backward_cost);
  costs.back() = last_stage_cost;
  return costs;
}

}  // namespace swarm::sim
