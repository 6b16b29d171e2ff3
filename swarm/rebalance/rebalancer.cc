#include "swarm/rebalance/rebalancer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string_view>
#include <utility>

#include "swarm/core/check.h"

namespace swarm::rebalance {
namespace {

// Stage totals are sums of doubles, and peers adding them in another order must still
// agree on which stages tie, so totals compare with a relative tolerance.
constexpr double kRelativeTolerance = 1e-9;

bool nearly_equal(double a, double b) {
  return std::abs(a - b) <= kRelativeTolerance * std::max(std::abs(a), std::abs(b));
}

bool clearly_less(double a, double b) { return a < b && !nearly_equal(a, b); }

// Throughputs come from strangers: NaN, infinite or non-positive claims count as unmeasured.
bool is_measured(double throughput) { return throughput > 0 && std::isfinite(throughput); }

// The throughput an unmeasured peer is planned with: the median of the measured ones, or 1.
double fallback_throughput(const std::vector<PeerLoad>& peers) {
  std::vector<double> measured;
  measured.reserve(peers.size());
  for (const PeerLoad& p : peers) {
    if (is_measured(p.throughput)) measured.push_back(p.throughput);
  }
  if (measured.empty()) return 1.0;
  const size_t mid = measured.size() / 2;
  std::nth_element(measured.begin(), measured.begin() + mid, measured.end());
  const double upper = measured[mid];
  if (measured.size() % 2 == 1) return upper;
  const double lower = *std::max_element(measured.begin(), measured.begin() + mid);
  return lower + (upper - lower) / 2;  // no overflow for huge values
}

double planned_with(double own, double fallback) { return is_measured(own) ? own : fallback; }

bool in_range(int stage, int num_stages) { return stage >= 0 && stage < num_stages; }

// Queue lengths are strangers' claims: a negative one counts as empty, and the sum saturates.
int64_t add_queue(int64_t total, int64_t queue_length) {
  const int64_t q = std::max<int64_t>(0, queue_length);
  return q > std::numeric_limits<int64_t>::max() - total ? std::numeric_limits<int64_t>::max() : total + q;
}

std::vector<StageLoad> loads_with(const std::vector<PeerLoad>& peers, int num_stages, double fallback) {
  std::vector<StageLoad> loads(static_cast<size_t>(std::max(0, num_stages)));
  for (int s = 0; s < num_stages; ++s) loads[static_cast<size_t>(s)].stage = s;
  for (const PeerLoad& p : peers) {
    if (!in_range(p.stage, num_stages)) continue;
    StageLoad& load = loads[static_cast<size_t>(p.stage)];
    ++load.peers;
    load.throughput += planned_with(p.throughput, fallback);
    load.queued = add_queue(load.queued, p.queue_length);
  }
  return loads;
}

double queued_per_throughput(const StageLoad& load) {
  if (load.throughput > 0) return static_cast<double>(load.queued) / load.throughput;
  return load.queued > 0 ? std::numeric_limits<double>::infinity() : 0;
}

// Among stages other than `bottleneck` that keep a peer after giving one, the one with the
// most spare throughput over the bottleneck (ties: lowest index). -1 when there is none.
int donor_stage(const std::vector<StageLoad>& loads, int bottleneck) {
  int donor = -1;
  const double limit = loads[static_cast<size_t>(bottleneck)].throughput;
  for (const StageLoad& load : loads) {
    if (load.stage == bottleneck || load.peers < 2) continue;
    if (donor < 0 || clearly_less(loads[static_cast<size_t>(donor)].throughput - limit, load.throughput - limit)) {
      donor = load.stage;
    }
  }
  return donor;
}

// The donor's slowest peer. Throughputs are measured, so peers of equal machines differ
// by noise: all within `tolerance` of the slowest count as tied, and the lowest id of
// those moves. Otherwise the elected mover would change from check to check.
const PeerLoad* slowest_peer(const std::vector<PeerLoad>& peers, int stage, double fallback, double tolerance) {
  double slowest_throughput = std::numeric_limits<double>::infinity();
  for (const PeerLoad& p : peers) {
    if (p.stage == stage) slowest_throughput = std::min(slowest_throughput, planned_with(p.throughput, fallback));
  }
  const double tied = slowest_throughput * (1 + tolerance);
  const PeerLoad* slowest = nullptr;
  for (const PeerLoad& p : peers) {
    if (p.stage != stage || planned_with(p.throughput, fallback) > tied) continue;
    if (slowest == nullptr || p.peer_id < slowest->peer_id) slowest = &p;
  }
  return slowest;
}

double pipeline_with_extra(std::vector<StageLoad> loads, int stage, double extra) {
  StageLoad& load = loads[static_cast<size_t>(stage)];
  ++load.peers;
  load.throughput += extra;
  return pipeline_throughput(loads);
}

// FNV-1a: a string hash that, unlike std::hash, is the same in every build.
uint64_t fnv1a(std::string_view text) {
  uint64_t hash = 0xCBF29CE484222325ull;
  for (const char c : text) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001B3ull;
  }
  return hash;
}

// The same move between the same stages; the mover may differ between two views
// (it is confirmed that the swarm needs the move, and elected at the last check).
bool same_move(const PlannedMove& a, const PlannedMove& b) {
  return a.from_stage == b.from_stage && a.to_stage == b.to_stage;
}

}  // namespace

Status RebalanceConfig::validate() const {
  if (!(period_seconds > 0) || !std::isfinite(period_seconds)) {
    return invalid_argument("period_seconds must be positive and finite, got {}", period_seconds);
  }
  if (!(jitter_fraction >= 0 && jitter_fraction < 1)) {
    return invalid_argument("jitter_fraction must be in [0, 1), got {}", jitter_fraction);
  }
  if (!(min_gain >= 0) || !std::isfinite(min_gain)) {
    return invalid_argument("min_gain must be non-negative and finite, got {}", min_gain);
  }
  if (!(mover_tie_tolerance >= 0) || !std::isfinite(mover_tie_tolerance)) {
    return invalid_argument("mover_tie_tolerance must be >= 0 and finite, got {}", mover_tie_tolerance);
  }
  if (confirmations < 1) return invalid_argument("confirmations must be at least 1, got {}", confirmations);
  return Status::ok();
}

double planned_throughput(const PeerLoad& peer, const std::vector<PeerLoad>& peers) {
  return is_measured(peer.throughput) ? peer.throughput : fallback_throughput(peers);
}

std::vector<StageLoad> stage_loads(const std::vector<PeerLoad>& peers, int num_stages) {
  return loads_with(peers, num_stages, fallback_throughput(peers));
}

double pipeline_throughput(const std::vector<StageLoad>& loads) {
  if (loads.empty()) return 0;
  double slowest = std::numeric_limits<double>::infinity();
  for (const StageLoad& load : loads) {
    if (load.peers == 0) return 0;
    slowest = std::min(slowest, load.throughput);
  }
  return slowest;
}

int bottleneck_stage(const std::vector<StageLoad>& loads) {
  if (loads.empty()) return -1;
  for (const StageLoad& load : loads) {
    if (load.peers == 0) return load.stage;
  }
  double least = std::numeric_limits<double>::infinity();
  for (const StageLoad& load : loads) least = std::min(least, load.throughput);
  // Among the stages tied at the least throughput, the one with the longest backlog.
  const StageLoad* bottleneck = nullptr;
  for (const StageLoad& load : loads) {
    if (!nearly_equal(load.throughput, least)) continue;
    if (bottleneck == nullptr || queued_per_throughput(load) > queued_per_throughput(*bottleneck)) {
      bottleneck = &load;
    }
  }
  return bottleneck != nullptr ? bottleneck->stage : loads.front().stage;
}

std::vector<PeerLoad> planning_view(std::vector<PeerLoad> announced, const PeerLoad& self) {
  const auto own = std::find_if(announced.begin(), announced.end(),
                                [&](const PeerLoad& p) { return p.peer_id == self.peer_id; });
  if (own != announced.end() && own->stage == self.stage) return announced;
  std::erase_if(announced, [&](const PeerLoad& p) { return p.peer_id == self.peer_id; });
  announced.push_back(self);
  return announced;
}

std::optional<PlannedMove> plan_move(const RebalanceConfig& config, const std::vector<PeerLoad>& peers,
                                     int num_stages) {
  if (num_stages < 2) return std::nullopt;
  const double fallback = fallback_throughput(peers);
  std::vector<StageLoad> loads = loads_with(peers, num_stages, fallback);
  const int to = bottleneck_stage(loads);
  const int from = donor_stage(loads, to);
  if (from < 0) return std::nullopt;
  const PeerLoad* mover = slowest_peer(peers, from, fallback, config.mover_tie_tolerance);
  const double moved = planned_with(mover->throughput, fallback);

  const double before = pipeline_throughput(loads);
  StageLoad& donor = loads[static_cast<size_t>(from)];
  --donor.peers;
  donor.throughput -= moved;
  const double after = pipeline_with_extra(std::move(loads), to, moved);
  // Filling an empty stage always helps, even while another stage is still empty:
  // nothing flows until every stage has a peer.
  const bool worth_it = (before == 0 && after > 0) || after >= before * (1 + config.min_gain);
  if (!worth_it) return std::nullopt;
  return PlannedMove{mover->peer_id, from, to, before, after};
}

int stage_most_needed(const std::vector<PeerLoad>& peers, int num_stages, double own_throughput) {
  if (num_stages <= 0) return -1;
  const double fallback = fallback_throughput(peers);
  const double own = planned_with(own_throughput, fallback);
  const std::vector<StageLoad> loads = loads_with(peers, num_stages, fallback);
  for (const StageLoad& load : loads) {
    if (load.peers == 0) return load.stage;
  }
  int best = 0;
  double best_pipeline = pipeline_with_extra(loads, 0, own);
  for (int s = 1; s < num_stages; ++s) {
    const double pipeline = pipeline_with_extra(loads, s, own);
    const bool ties = nearly_equal(pipeline, best_pipeline);
    const auto& best_load = loads[static_cast<size_t>(best)];
    const auto& load = loads[static_cast<size_t>(s)];
    if ((!ties && pipeline > best_pipeline) || (ties && clearly_less(load.throughput, best_load.throughput))) {
      best = s;
      best_pipeline = pipeline;
    }
  }
  return best;
}

Rebalancer::Rebalancer(RebalanceConfig config, std::string self_id, uint64_t seed, double now)
    : config_(config), self_id_(std::move(self_id)), random_(seed ^ fnv1a(self_id_)) {
  // The config is user input: the caller validates it and reports the Status; a bad one here is a bug.
  SWARM_CHECK(config_.validate().is_ok(), "{}", config_.validate().to_string());
  next_check_at_ = now + next_interval();
}

double Rebalancer::next_interval() {
  const double j = config_.jitter_fraction;
  return config_.period_seconds * (1 - j + 2 * j * random_.next_unit());
}

Decision Rebalancer::check(const std::vector<PeerLoad>& peers, int num_stages, double now) {
  next_check_at_ = now + next_interval();
  Decision decision;
  decision.plan = plan_move(config_, peers, num_stages);
  if (!decision.plan) {
    confirmations_ = 0;
    last_plan_.reset();
    return decision;
  }
  const PlannedMove& plan = *decision.plan;
  const bool repeated = last_plan_ && same_move(*last_plan_, plan);
  confirmations_ = repeated ? std::min(confirmations_, std::numeric_limits<int>::max() - 1) + 1 : 1;
  last_plan_ = plan;
  decision.confirmations = confirmations_;
  // An empty stage stops the whole pipeline: filling it cannot wait for a second look.
  const int required = plan.pipeline_before == 0 ? 1 : config_.confirmations;
  if (plan.peer_id == self_id_ && confirmations_ >= required) {
    decision.move = true;
    decision.to_stage = plan.to_stage;
    confirmations_ = 0;  // a stale view must not confirm a second move
  }
  return decision;
}

void Rebalancer::reset(double now) {
  confirmations_ = 0;
  last_plan_.reset();
  next_check_at_ = now + next_interval();
}

}  // namespace swarm::rebalance
