// in_process_registry: a Registry inside one process, for tests and for
// swarms whose peers are threads of one program.
//
// Time comes from an injected clock so expiry can be tested without waiting:
//
//   double t = 0;
//   swarm::InProcessRegistry registry([&t] { return t; });
//   (void)registry.announce("stage/0", "peer-a", "{}", registry.now() + 300);
//   t = 301;  // registry.get("stage/0") is now empty
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "swarm/core/status.h"
#include "swarm/api/registry.h"

namespace swarm {

class InProcessRegistry {
 public:
  using registry_concept = registry_t;
  using ClockFn = std::function<double()>;

  // Seconds on the steady clock: monotonic, which is all one process needs.
  static double steady_seconds();

  explicit InProcessRegistry(ClockFn clock = steady_seconds);

  Status announce(const std::string& key, const std::string& subkey, std::string value,
                  double expires_at);
  Result<std::vector<Record>> get(const std::string& key);
  Status withdraw(const std::string& key, const std::string& subkey);
  double now() const;

  // Records held, expired ones included until a get or announce purges them.
  size_t stored_records() const;

 private:
  // Expired records are dropped when their key is next touched rather than by a
  // timer thread: nobody can observe them in between, and no thread to stop.
  void purge_expired_locked(const std::string& key, double now);

  ClockFn clock_;
  mutable std::mutex mutex_;
  // key -> subkey -> record; std::map so get returns subkeys in a stable order.
  std::map<std::string, std::map<std::string, Record>> records_;
};

static_assert(Registry<InProcessRegistry>);

}  // namespace swarm
