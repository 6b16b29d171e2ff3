// records: what peers publish in the registry for trainers to read, and under
// which keys. Read by trainers and tools, written by peers: one definition for both.
//
// Every record comes from a stranger: from_json checks each field's type and
// answers an error, never an exception.
//
//   registry.announce(swarm::stage_registry_key(0), id, record.to_json(), expiry);
#pragma once

#include <cstdint>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "swarm/core/status.h"

namespace swarm {

inline std::string stage_registry_key(int stage) { return fmt::format("swarm/stage/{}", stage); }

// A peer's announcement in the registry: where it listens and how fast it is.
struct PeerAnnouncementRecord {
  std::string peer_id;
  std::string address;
  int stage = 0;
  double throughput = 0;  // samples per second
  int64_t queue_length = 0;

  std::string to_json() const {
    return nlohmann::json{{"peer", peer_id}, {"address", address}, {"stage", stage},
                          {"throughput", throughput}, {"queue", queue_length}}
        .dump();
  }
  static Result<PeerAnnouncementRecord> from_json(const std::string& text) {
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return invalid_argument("malformed peer announcement");
    PeerAnnouncementRecord record;
    try {
      record.peer_id = j.at("peer").get<std::string>();
      record.address = j.at("address").get<std::string>();
      record.stage = j.value("stage", 0);
      record.throughput = j.value("throughput", 0.0);
      record.queue_length = j.value("queue", int64_t{0});
    } catch (const nlohmann::json::exception& e) {
      return invalid_argument("malformed peer announcement: {}", e.what());
    }
    if (record.peer_id.empty() || record.address.empty() || record.stage < 0 || !(record.throughput >= 0) ||
        record.throughput > 1e12 || record.queue_length < 0) {
      return invalid_argument("peer announcement with an empty id or address, or a field out of range");
    }
    return record;
  }
};

}  // namespace swarm
