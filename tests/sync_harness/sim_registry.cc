#include "tests/sync_harness/sim_registry.h"

namespace swarm::sync {

bool SimRegistry::publish(ProgressRecord record, double now) {
  record.published_at = now;
  auto parsed = ProgressRecord::from_json(record.to_json());
  if (!parsed.is_ok()) return false;
  by_peer_[record.peer_id].push_back(std::move(parsed).value());
  return true;
}

std::vector<ProgressRecord> SimRegistry::read(double as_of) const {
  std::vector<ProgressRecord> out;
  for (const auto& [id, records] : by_peer_) {
    for (auto it = records.rbegin(); it != records.rend(); ++it) {
      if (it->published_at > as_of) continue;
      if (it->published_at + ttl_ > as_of) out.push_back(*it);
      break;  // older ones are hidden by this one, or expired before it did
    }
  }
  return out;
}

void SimRegistry::prune(double now) {
  for (auto& [id, records] : by_peer_) {
    // Keep the newest record older than the horizon: a lagging reader still needs it.
    while (records.size() > 1 && records[1].published_at < now - history_) records.pop_front();
  }
}

}  // namespace swarm::sync
