#include "swarm/registry/in_process_registry.h"

#include <chrono>
#include <utility>

namespace swarm {

double InProcessRegistry::steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

InProcessRegistry::InProcessRegistry(ClockFn clock) : clock_(std::move(clock)) {}

double InProcessRegistry::now() const { return clock_(); }

Status InProcessRegistry::announce(const std::string& key, const std::string& subkey,
                                   std::string value, double expires_at) {
  double t = now();
  std::lock_guard lock(mutex_);
  purge_expired_locked(key, t);
  records_[key][subkey] = Record{key, subkey, std::move(value), expires_at};
  return Status::ok();
}

Result<std::vector<Record>> InProcessRegistry::get(const std::string& key) {
  double t = now();
  std::lock_guard lock(mutex_);
  purge_expired_locked(key, t);
  std::vector<Record> out;
  auto it = records_.find(key);
  if (it == records_.end()) return out;
  out.reserve(it->second.size());
  for (const auto& [subkey, record] : it->second) out.push_back(record);
  return out;
}

Status InProcessRegistry::withdraw(const std::string& key, const std::string& subkey) {
  std::lock_guard lock(mutex_);
  auto it = records_.find(key);
  if (it == records_.end()) return Status::ok();
  it->second.erase(subkey);
  if (it->second.empty()) records_.erase(it);
  return Status::ok();
}

size_t InProcessRegistry::stored_records() const {
  std::lock_guard lock(mutex_);
  size_t n = 0;
  for (const auto& [key, by_subkey] : records_) n += by_subkey.size();
  return n;
}

void InProcessRegistry::purge_expired_locked(const std::string& key, double t) {
  auto it = records_.find(key);
  if (it == records_.end()) return;
  std::erase_if(it->second, [t](const auto& entry) { return entry.second.expires_at <= t; });
  if (it->second.empty()) records_.erase(it);
}

}  // namespace swarm
