#include "swarm/averaging/progress.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <nlohmann/json.hpp>

#include "swarm/averaging/averaging_messages.h"

namespace swarm {

std::string ProgressRecord::to_json() const {
  nlohmann::json hashes = nlohmann::json::array();
  // Hashes as hex text: JSON numbers lose 64-bit integers in many readers.
  for (const auto& [s, h] : recent_hashes) hashes.push_back({s, hex64(h)});
  return nlohmann::json{{"peer", peer_id},        {"address", address},
                        {"stage", stage},         {"step", step},
                        {"samples", samples},     {"samples_per_s", samples_per_second},
                        {"time", published_at},   {"averaging", averaging},
                        {"hash", hex64(params_hash)}, {"hashes", hashes},
                        {"mates", stage_mates_seen}, {"nonce", hex64(round_nonce)},
                        {"allreduce_bytes", allreduce_bytes}, {"allreduce_values", allreduce_values}}
      .dump();
}


Result<ProgressRecord> ProgressRecord::from_json(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument("progress record is not a JSON object");
  try {
    ProgressRecord r;
    r.peer_id = j.at("peer").get<std::string>();
    r.address = j.value("address", "");
    r.stage = j.value("stage", 0);
    r.step = j.at("step").get<int64_t>();
    r.samples = j.value("samples", int64_t{0});
    r.samples_per_second = j.value("samples_per_s", 0.0);
    r.published_at = j.at("time").get<double>();
    r.averaging = j.value("averaging", false);
    r.stage_mates_seen = j.value("mates", 0);
    r.allreduce_bytes = j.value("allreduce_bytes", int64_t{0});
    r.allreduce_values = j.value("allreduce_values", int64_t{0});
    SWARM_ASSIGN_OR_RETURN(r.round_nonce, parse_hex64(j.value("nonce", "0")));
    SWARM_ASSIGN_OR_RETURN(r.params_hash, parse_hex64(j.value("hash", "0")));
    if (j.contains("hashes")) {
      for (const auto& entry : j.at("hashes")) {
        SWARM_ASSIGN_OR_RETURN(uint64_t h, parse_hex64(entry.at(1).get<std::string>()));
        r.recent_hashes.emplace_back(entry.at(0).get<int64_t>(), h);
      }
    }
    if (r.step < 0 || r.samples < 0 || r.allreduce_bytes < 0 || r.allreduce_values < 0 || !std::isfinite(r.samples_per_second) || r.samples_per_second < 0) {
      return invalid_argument("progress record of {}: negative or non-finite counts", r.peer_id);
    }
    return r;
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument("malformed progress record: {}", e.what());
  }
}

Status GlobalBatchConfig::validate() const {
  if (target_samples < 1) return invalid_argument("the global batch must be >= 1 sample, got {}", target_samples);
  if (!(stale_after_seconds > 0)) return invalid_argument("stale_after_seconds must be > 0");
  return Status::ok();
}

namespace {
bool fresh(const ProgressRecord& r, double now, double stale_after) { return r.published_at >= now - stale_after; }
}  // namespace

GlobalBatchDecision decide_global_batch(const GlobalBatchConfig& config, int64_t my_step,
                                        const std::vector<ProgressRecord>& records, double now) {
  GlobalBatchDecision d;
  d.newest_step = my_step;
  double rate = 0;
  for (const ProgressRecord& r : records) {
    if (!fresh(r, now, config.stale_after_seconds)) continue;
    d.newest_step = std::max(d.newest_step, r.step);
    if (r.step != my_step) continue;
    ++d.peers_counted;
    d.reported_samples += r.samples;
    rate += r.samples_per_second;
    // A record from "the future" (clock skew) is not extrapolated backwards.
    d.expected_samples += static_cast<double>(r.samples) + r.samples_per_second * std::max(0.0, now - r.published_at);
  }
  d.behind = d.newest_step > my_step;
  const double target = static_cast<double>(config.target_samples);
  if (d.expected_samples >= target) {
    d.estimated_arrival = now;
  } else if (rate > 0) {
    d.estimated_arrival = now + (target - d.expected_samples) / rate;
  }
  d.ready = !d.behind && (d.reported_samples >= config.target_samples ||
                          (config.use_estimated_arrival && d.reported_samples > 0 && d.estimated_arrival <= now));
  return d;
}

std::vector<ProgressRecord> round_members(const std::vector<ProgressRecord>& records, int64_t step, double now,
                                          double stale_after_seconds) {
  std::map<std::string, ProgressRecord> by_id;
  for (const ProgressRecord& r : records) {
    if (r.step == step && fresh(r, now, stale_after_seconds)) by_id[r.peer_id] = r;
  }
  std::vector<ProgressRecord> out;
  for (auto& [id, r] : by_id) out.push_back(std::move(r));
  return out;
}

GroupReadiness group_readiness(const std::vector<ProgressRecord>& records, int64_t step, double now,
                               double stale_after_seconds) {
  GroupReadiness out = GroupReadiness::complete;
  for (const ProgressRecord& r : records) {
    if (!fresh(r, now, stale_after_seconds)) continue;
    if (r.step > step) return GroupReadiness::someone_ahead;
    if (r.step < step || !r.averaging) out = GroupReadiness::waiting;
  }
  return out;
}

uint64_t consensus_hash(const std::vector<std::pair<std::string, uint64_t>>& hashes_by_peer) {
  if (hashes_by_peer.empty()) return 0;
  std::map<uint64_t, int> votes;
  for (const auto& [peer, hash] : hashes_by_peer) ++votes[hash];
  int best_votes = 0;
  for (const auto& [hash, n] : votes) best_votes = std::max(best_votes, n);
  const std::pair<std::string, uint64_t>* lowest = nullptr;
  for (const auto& entry : hashes_by_peer) {
    if (votes[entry.second] != best_votes) continue;
    if (lowest == nullptr || entry.first < lowest->first) lowest = &entry;
  }
  return lowest->second;
}

}  // namespace swarm
