// records: what peers publish in the registry for trainers to read, and under
// which keys. Read by trainers and tools, written by peers: one definition for both.
//
// Every record comes from a stranger: from_json checks each field's type and
// range and answers an error, never an exception. A field of the wrong JSON type
// is an error, not a conversion (nlohmann's get<int> would take true as 1, 1.5 as
// 1, 2^64-1 as -1, and 1e300 as undefined behaviour).
//
//   registry.announce(swarm::stage_registry_key(0), id, record.to_json(), expiry);
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "swarm/core/status.h"

namespace swarm {

inline std::string stage_registry_key(int stage) { return fmt::format("swarm/stage/{}", stage); }

namespace records_detail {

// A present field must be text; an absent one is an error when required.
inline Status read_text(const nlohmann::json& j, const char* key, bool required, std::string* out) {
  const auto it = j.find(key);
  if (it == j.end()) return required ? invalid_argument("record lacks '{}'", key) : Status::ok();
  if (!it->is_string()) return invalid_argument("record: '{}' must be text", key);
  *out = it->get<std::string>();
  return Status::ok();
}

// A present field must be a JSON integer within [low, high]; an absent one keeps *out.
inline Status read_integer(const nlohmann::json& j, const char* key, int64_t low, int64_t high, int64_t* out) {
  const auto it = j.find(key);
  if (it == j.end()) return Status::ok();
  if (!it->is_number_integer()) return invalid_argument("record: '{}' must be an integer", key);
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(high)) {
    return invalid_argument("record: '{}' is out of range", key);
  }
  const int64_t value = it->get<int64_t>();
  if (value < low || value > high) return invalid_argument("record: '{}' {} is outside [{}, {}]", key, value, low, high);
  *out = value;
  return Status::ok();
}

// A present field must be a finite JSON number within [low, high]; an absent one keeps *out.
inline Status read_number(const nlohmann::json& j, const char* key, double low, double high, double* out) {
  const auto it = j.find(key);
  if (it == j.end()) return Status::ok();
  if (!it->is_number()) return invalid_argument("record: '{}' must be a number", key);
  const double value = it->get<double>();
  if (!std::isfinite(value) || value < low || value > high) {
    return invalid_argument("record: '{}' is not a finite number in [{}, {}]", key, low, high);
  }
  *out = value;
  return Status::ok();
}

}  // namespace records_detail

// A peer's announcement in the registry: where it listens and how fast it is.
struct PeerAnnouncementRecord {
  // Beyond these a record is refused: no honest peer is that fast.
  static constexpr double kMaxThroughput = 1e12;

  std::string peer_id;
  std::string address;
  int stage = 0;
  double throughput = 0;  // samples per second
  int64_t queue_length = 0;
  // False while it downloads the stage's state (joining, re-syncing or just moved
  // here): trainers do not route to it, but rebalancers count it, so a second peer
  // does not move to fill a vacancy that one is already filling.
  bool serving = true;
  // Where its replica steps its parameters: "cpu" or "cuda". Replicas of one
  // stage must step on one device (see Peer::check_device_of_stage).
  std::string device = "cpu";

  std::string to_json() const {
    return nlohmann::json{{"peer", peer_id},         {"address", address},     {"stage", stage},
                          {"throughput", throughput}, {"queue", queue_length}, {"serving", serving},
                          {"device", device}}
        .dump();
  }

  // peer and address: non-empty text, required; stage: an integer in [0, 2^31);
  // throughput: a finite number in [0, 1e12]; queue: an integer >= 0. The last
  // three may be absent (0); serving: true or false, absent: true; device: "cpu" or
  // "cuda", absent: "cpu" (peers from before devices). Unknown fields are ignored.
  static Result<PeerAnnouncementRecord> from_json(const std::string& text) {
    using namespace records_detail;
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return invalid_argument("malformed peer announcement");
    PeerAnnouncementRecord record;
    int64_t stage = 0;
    Status read = [&]() -> Status {
      SWARM_RETURN_IF_ERROR(read_text(j, "peer", true, &record.peer_id));
      SWARM_RETURN_IF_ERROR(read_text(j, "address", true, &record.address));
      SWARM_RETURN_IF_ERROR(read_integer(j, "stage", 0, std::numeric_limits<int>::max(), &stage));
      SWARM_RETURN_IF_ERROR(read_number(j, "throughput", 0.0, kMaxThroughput, &record.throughput));
      SWARM_RETURN_IF_ERROR(
          read_integer(j, "queue", 0, std::numeric_limits<int64_t>::max(), &record.queue_length));
      if (const auto it = j.find("serving"); it != j.end()) {
        if (!it->is_boolean()) return invalid_argument("record: 'serving' must be true or false");
        record.serving = it->get<bool>();
      }
      SWARM_RETURN_IF_ERROR(read_text(j, "device", false, &record.device));
      if (record.device != "cpu" && record.device != "cuda") {
        return invalid_argument("record: 'device' must be \"cpu\" or \"cuda\"");
      }
      return Status::ok();
    }();
    if (!read.is_ok()) return read.with_context("malformed peer announcement");
    if (record.peer_id.empty() || record.address.empty()) {
      return invalid_argument("peer announcement with an empty id or address");
    }
    record.stage = static_cast<int>(stage);
    return record;
  }
};

// Every stage's announced peers, newest record per peer id (a peer that just moved
// may still have a record under its old stage); records that do not parse, or sit
// under another stage's key, are counted in *refused when given.
template <typename Registry>
std::map<std::string, PeerAnnouncementRecord> read_stage_announcements(Registry& registry, int num_stages,
                                                                       int64_t* refused = nullptr) {
  std::map<std::string, PeerAnnouncementRecord> peers;
  std::map<std::string, double> expiry;
  for (int s = 0; s < num_stages; ++s) {
    auto records = registry.get(stage_registry_key(s));
    if (!records.is_ok()) continue;
    for (const auto& record : *records) {
      auto announcement = PeerAnnouncementRecord::from_json(record.value);
      if (!announcement.is_ok() || announcement->stage != s) {
        if (refused != nullptr) ++*refused;
        continue;
      }
      auto [it, fresh] = expiry.try_emplace(announcement->peer_id, record.expires_at);
      if (!fresh && record.expires_at <= it->second) continue;
      it->second = record.expires_at;
      peers[announcement->peer_id] = *std::move(announcement);
    }
  }
  return peers;
}

}  // namespace swarm
