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
                        {"time", published_at},   {"state", state_name(state)},
                        {"hash", hex64(params_hash)}, {"hashes", hashes},
                        {"mates", stage_mates_seen}, {"group", hex64(committed_group)},
                        {"members", committed_members},
                        {"allreduce_bytes", allreduce_bytes}, {"allreduce_values", allreduce_values},
                        {"departed", departed}, {"banned", banned}}
      .dump();
}

std::string_view ProgressRecord::state_name(State state) {
  switch (state) {
    case State::serving: return "serving";
    case State::averaging: return "averaging";
    case State::resyncing: return "resyncing";
    case State::looking: return "looking";
  }
  return "serving";
}


namespace {

// Type-checked fields: nlohmann's value() turns 1.5 into 1 and 2^64-1 into -1 silently.
// Absent optional fields keep their default; present ones must have the right type.
Status read_integer(const nlohmann::json& j, const char* key, bool required, int64_t* out) {
  const auto it = j.find(key);
  if (it == j.end()) return required ? invalid_argument("progress record lacks '{}'", key) : Status::ok();
  if (!it->is_number_integer() ||
      (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))) {
    return invalid_argument("progress record: '{}' must be a 64-bit integer", key);
  }
  *out = it->get<int64_t>();
  return Status::ok();
}

Status read_number(const nlohmann::json& j, const char* key, bool required, double* out) {
  const auto it = j.find(key);
  if (it == j.end()) return required ? invalid_argument("progress record lacks '{}'", key) : Status::ok();
  if (!it->is_number()) return invalid_argument("progress record: '{}' must be a number", key);
  *out = it->get<double>();
  if (!std::isfinite(*out)) return invalid_argument("progress record: '{}' is not finite", key);
  return Status::ok();
}

Status read_text(const nlohmann::json& j, const char* key, bool required, std::string* out) {
  const auto it = j.find(key);
  if (it == j.end()) return required ? invalid_argument("progress record lacks '{}'", key) : Status::ok();
  if (!it->is_string()) return invalid_argument("progress record: '{}' must be text", key);
  *out = it->get<std::string>();
  return Status::ok();
}

Status read_hash(const nlohmann::json& j, const char* key, uint64_t* out) {
  std::string text = "0";
  SWARM_RETURN_IF_ERROR(read_text(j, key, false, &text));
  SWARM_ASSIGN_OR_RETURN(*out, parse_hex64(text));
  return Status::ok();
}

Status read_recent_hashes(const nlohmann::json& j, ProgressRecord* r) {
  const auto it = j.find("hashes");
  if (it == j.end()) return Status::ok();
  if (!it->is_array() || it->size() > ProgressRecord::kMaxRecentHashes) {
    return invalid_argument("progress record: 'hashes' must be an array of at most {} pairs",
                            ProgressRecord::kMaxRecentHashes);
  }
  for (const auto& entry : *it) {
    if (!entry.is_array() || entry.size() != 2 || !entry[0].is_number_integer() || !entry[1].is_string() ||
        (entry[0].is_number_unsigned() && entry[0].get<uint64_t>() > uint64_t{INT64_MAX}) || entry[0].get<int64_t>() < 0) {
      return invalid_argument("progress record: each of 'hashes' must be [step, hex hash]");
    }
    SWARM_ASSIGN_OR_RETURN(uint64_t h, parse_hex64(entry[1].get<std::string>()));
    r->recent_hashes.emplace_back(entry[0].get<int64_t>(), h);
  }
  return Status::ok();
}

Status read_state(const nlohmann::json& j, ProgressRecord* r) {
  std::string state = "serving";
  SWARM_RETURN_IF_ERROR(read_text(j, "state", false, &state));
  for (auto s : {ProgressRecord::State::serving, ProgressRecord::State::averaging, ProgressRecord::State::resyncing,
                 ProgressRecord::State::looking}) {
    if (ProgressRecord::state_name(s) == state) {
      r->state = s;
      return Status::ok();
    }
  }
  return invalid_argument("progress record: 'state' must be serving, averaging, resyncing or looking");
}

// Ordered by id, each once, bounded: the committed membership of its last round,
// or the stage-mates it banned.
Status read_ids(const nlohmann::json& j, const char* key, std::vector<std::string>* ids) {
  const auto it = j.find(key);
  if (it == j.end()) return Status::ok();
  if (!it->is_array() || it->size() > ProgressRecord::kMaxMembers) {
    return invalid_argument("progress record: '{}' must be an array of at most {} ids", key, ProgressRecord::kMaxMembers);
  }
  for (const auto& id : *it) {
    if (!id.is_string() || id.get<std::string>().empty() || id.get<std::string>().size() > 256 ||
        (!ids->empty() && !(ids->back() < id.get<std::string>()))) {
      return invalid_argument("progress record: '{}' must be distinct ids in order", key);
    }
    ids->push_back(id.get<std::string>());
  }
  return Status::ok();
}

Status read_fields(const nlohmann::json& j, ProgressRecord* r) {
  int64_t stage = 0, mates = 0;
  SWARM_RETURN_IF_ERROR(read_text(j, "peer", true, &r->peer_id));
  if (r->peer_id.empty()) return invalid_argument("progress record: empty 'peer'");
  SWARM_RETURN_IF_ERROR(read_text(j, "address", false, &r->address));
  SWARM_RETURN_IF_ERROR(read_integer(j, "stage", false, &stage));
  SWARM_RETURN_IF_ERROR(read_integer(j, "step", true, &r->step));
  SWARM_RETURN_IF_ERROR(read_integer(j, "samples", false, &r->samples));
  SWARM_RETURN_IF_ERROR(read_number(j, "samples_per_s", false, &r->samples_per_second));
  SWARM_RETURN_IF_ERROR(read_number(j, "time", true, &r->published_at));
  SWARM_RETURN_IF_ERROR(read_integer(j, "mates", false, &mates));
  SWARM_RETURN_IF_ERROR(read_integer(j, "allreduce_bytes", false, &r->allreduce_bytes));
  SWARM_RETURN_IF_ERROR(read_integer(j, "allreduce_values", false, &r->allreduce_values));
  SWARM_RETURN_IF_ERROR(read_hash(j, "hash", &r->params_hash));
  SWARM_RETURN_IF_ERROR(read_hash(j, "group", &r->committed_group));
  SWARM_RETURN_IF_ERROR(read_state(j, r));
  SWARM_RETURN_IF_ERROR(read_ids(j, "members", &r->committed_members));
  SWARM_RETURN_IF_ERROR(read_ids(j, "banned", &r->banned));
  if (const auto it = j.find("departed"); it != j.end()) {
    if (!it->is_boolean()) return invalid_argument("progress record: 'departed' must be true or false");
    r->departed = it->get<bool>();
  }
  if (stage < 0 || stage > INT32_MAX || mates < 0 || mates > INT32_MAX) {
    return invalid_argument("progress record: stage or mates out of range");
  }
  r->stage = static_cast<int>(stage);
  r->stage_mates_seen = static_cast<int>(mates);
  return read_recent_hashes(j, r);
}

}  // namespace

Result<ProgressRecord> ProgressRecord::from_json(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument("progress record is not a JSON object");
  try {
    ProgressRecord r;
    SWARM_RETURN_IF_ERROR(read_fields(j, &r));
    if (r.step < 0 || r.samples < 0 || r.allreduce_bytes < 0 || r.allreduce_values < 0 || r.samples_per_second < 0) {
      return invalid_argument("progress record of {}: negative counts", r.peer_id);
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

std::optional<uint64_t> published_hash(const ProgressRecord& r, int64_t step) {
  if (r.step == step) return r.params_hash;
  for (auto it = r.recent_hashes.rbegin(); it != r.recent_hashes.rend(); ++it) {
    if (it->first == step) return it->second;
  }
  return std::nullopt;
}

std::optional<uint64_t> majority_hash(const std::vector<ProgressRecord>& records, int64_t step, double now,
                                      double stale_after_seconds) {
  std::map<std::string, const ProgressRecord*> newest;
  for (const ProgressRecord& r : records) {
    if (!fresh(r, now, stale_after_seconds)) continue;
    auto [it, inserted] = newest.emplace(r.peer_id, &r);
    if (!inserted && r.published_at > it->second->published_at) it->second = &r;
  }
  std::map<uint64_t, size_t> votes;
  for (const auto& [id, r] : newest) {
    if (auto h = published_hash(*r, step)) ++votes[*h];
  }
  for (const auto& [hash, n] : votes) {
    if (2 * n > newest.size()) return hash;
  }
  return std::nullopt;
}

std::vector<ProgressRecord> donors_freshest_first(std::vector<ProgressRecord> donors) {
  std::sort(donors.begin(), donors.end(), [](const ProgressRecord& a, const ProgressRecord& b) {
    if (a.step != b.step) return a.step > b.step;
    if (a.published_at != b.published_at) return a.published_at > b.published_at;
    return a.peer_id < b.peer_id;
  });
  return donors;
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
