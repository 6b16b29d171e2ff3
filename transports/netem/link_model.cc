#include "transports/netem/link_model.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <initializer_list>
#include <string>
#include <utility>

namespace swarm::netem {
namespace {

// Past this a duration in nanoseconds nears int64 overflow; no real link waits this long.
constexpr double kMaxSeconds = 1e8;

Duration seconds_to_duration(double seconds) {
  if (!(seconds > 0)) return Duration::zero();
  seconds = std::min(seconds, kMaxSeconds);
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(seconds));
}

// A finite, non-negative number followed by one of `units` (name, scale); "0" alone is zero.
Result<double> scaled_number(std::string_view text, std::initializer_list<std::pair<std::string_view, double>> units,
                             std::string_view what) {
  if (text == "0") return 0.0;
  for (const auto& [unit, scale] : units) {
    if (text.size() <= unit.size() || !text.ends_with(unit)) continue;
    const std::string_view digits = text.substr(0, text.size() - unit.size());
    double value = 0;
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    if (error != std::errc() || end != digits.data() + digits.size() || !std::isfinite(value) || value < 0) break;
    return value * scale;
  }
  std::string names;
  for (const auto& [unit, scale] : units) names += (names.empty() ? "" : ", ") + std::string(unit);
  return invalid_argument("the link's {} '{}' is not a number followed by one of {}", what, text, names);
}

}  // namespace

Result<EmulatedLink> parse_link(std::string_view text) {
  const size_t comma = text.find(',');
  if (comma == std::string_view::npos || text.find(',', comma + 1) != std::string_view::npos) {
    return invalid_argument("a link is BANDWIDTH,LATENCY (for example 200mbit,50ms), got '{}'", text);
  }
  // Longest unit first, so "mbit" is not read as "bit".
  SWARM_ASSIGN_OR_RETURN(const double bits_per_s,
                         scaled_number(text.substr(0, comma), {{"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}, {"bit", 1}},
                                       "bandwidth"));
  SWARM_ASSIGN_OR_RETURN(const double seconds,
                         scaled_number(text.substr(comma + 1), {{"ms", 1e-3}, {"us", 1e-6}, {"s", 1}}, "latency"));
  if (seconds > kMaxSeconds) return invalid_argument("the link's latency '{}' is too long", text.substr(comma + 1));
  EmulatedLink link;
  link.bandwidth_bytes_per_s = bits_per_s / 8;
  link.latency = std::chrono::microseconds(static_cast<int64_t>(std::llround(seconds * 1e6)));
  return link;
}

Status LinkSpec::validate() const {
  if (!(bandwidth_bytes_per_s >= 0) || std::isinf(bandwidth_bytes_per_s)) {
    return invalid_argument("bandwidth must be finite and >= 0 (0 = unlimited), got {}",
                            bandwidth_bytes_per_s);
  }
  if (latency < Duration::zero()) return invalid_argument("latency must be >= 0");
  if (jitter < Duration::zero()) return invalid_argument("jitter must be >= 0");
  if (!(loss_probability >= 0 && loss_probability <= 1)) {
    return invalid_argument("loss probability must be in [0, 1], got {}", loss_probability);
  }
  return Status::ok();
}

LinkModel::LinkModel(LinkSpec spec, uint64_t seed) : spec_(spec), rng_(seed) {
  if (!(spec_.bandwidth_bytes_per_s > 0) || std::isinf(spec_.bandwidth_bytes_per_s)) {
    spec_.bandwidth_bytes_per_s = 0;
  }
  spec_.latency = std::max(spec_.latency, Duration::zero());
  spec_.jitter = std::max(spec_.jitter, Duration::zero());
  if (!(spec_.loss_probability >= 0)) spec_.loss_probability = 0;
  spec_.loss_probability = std::min(spec_.loss_probability, 1.0);
}

Duration LinkModel::transmission_time(uint64_t bytes) const {
  if (spec_.bandwidth_bytes_per_s == 0) return Duration::zero();
  return seconds_to_duration(static_cast<double>(bytes) / spec_.bandwidth_bytes_per_s);
}

LinkModel::Delivery LinkModel::schedule(Clock::time_point now, uint64_t bytes) {
  // Both draws happen for every message, so whether one message is lost never
  // shifts the random stream of the ones after it.
  const bool lost = rng_.next_unit() < spec_.loss_probability;
  const double jitter_fraction = rng_.next_unit();

  const Clock::time_point start = std::max(now, busy_until_);
  busy_until_ = start + transmission_time(bytes);
  const auto jitter = Duration(static_cast<Duration::rep>(
      static_cast<double>(spec_.jitter.count()) * jitter_fraction));
  return Delivery{lost, busy_until_ + spec_.latency + jitter};
}

FaultSchedule::FaultSchedule(std::vector<Fault> faults) {
  for (Fault& fault : faults) add(std::move(fault));
}

FaultSchedule& FaultSchedule::add(Fault fault) {
  auto after = std::upper_bound(faults_.begin(), faults_.end(), fault.at,
                                [](Clock::time_point at, const Fault& f) { return at < f.at; });
  faults_.insert(after, std::move(fault));
  return *this;
}

FaultSchedule& FaultSchedule::drop_between(std::string peer, Clock::time_point from,
                                           Clock::time_point until) {
  add(Fault{Fault::drop_all, from, peer});
  return add(Fault{Fault::restore, until, std::move(peer)});
}

bool FaultSchedule::dropped(std::string_view peer, Clock::time_point t) const {
  for (auto it = faults_.rbegin(); it != faults_.rend(); ++it) {
    if (it->at > t) continue;
    if (it->peer.empty() || it->peer == peer) return it->kind == Fault::drop_all;
  }
  return false;
}

}  // namespace swarm::netem
