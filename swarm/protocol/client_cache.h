// client_cache: one transport client per peer address, shared by the threads that call it.
//
// Trainers, averaging rounds and state downloads talk to the same few peers again
// and again; connecting once per address keeps each call to its messages. Peers
// come and go, so a client nobody has asked for in `idle_timeout` (and nobody
// still holds) is dropped on a later get(): the cache grows with the peers in
// use, not with every peer ever announced.
//
//   swarm::ClientCache<swarm::ZmqTransport> clients;
//   auto client = clients.get("tcp://127.0.0.1:7000");  // nullptr if it cannot connect
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "swarm/api/transport.h"
#include "swarm/core/clock.h"

namespace swarm {

template <Transport T>
class ClientCache {
 public:
  static constexpr Clock::duration kDefaultIdleTimeout = std::chrono::seconds(600);

  explicit ClientCache(ClientOptions options = {}, Clock::duration idle_timeout = kDefaultIdleTimeout)
      : options_(std::move(options)), idle_timeout_(idle_timeout) {}

  std::shared_ptr<typename T::client_type> get(const std::string& address) {
    // Declared before the lock, so idle clients close (joining their threads) after it is released.
    std::vector<std::shared_ptr<typename T::client_type>> idle;
    std::lock_guard lock(mu_);
    const Deadline now = Clock::now();
    take_idle_locked(now, idle);
    auto it = clients_.find(address);
    if (it != clients_.end()) {
      it->second.last_used = now;
      return it->second.client;
    }
    auto client = T::connect(address, options_);
    if (!client.is_ok()) return nullptr;
    auto shared = std::make_shared<typename T::client_type>(std::move(client).value());
    clients_[address] = Entry{shared, now};
    return shared;
  }

  // After a peer is found dead, so a restarted one at the same address gets a fresh connection.
  void forget(const std::string& address) {
    std::lock_guard lock(mu_);
    clients_.erase(address);
  }

  // Clients cached now, idle ones included until the next get() drops them.
  size_t size() const {
    std::lock_guard lock(mu_);
    return clients_.size();
  }

 private:
  struct Entry {
    std::shared_ptr<typename T::client_type> client;
    Deadline last_used;
  };

  // A client someone still holds (a download in progress) is in use however
  // long ago it was fetched: dropping it would only open a second connection.
  void take_idle_locked(Deadline now, std::vector<std::shared_ptr<typename T::client_type>>& idle) {
    for (auto it = clients_.begin(); it != clients_.end();) {
      Entry& entry = it->second;
      if (entry.client.use_count() > 1) entry.last_used = now;
      if (now - entry.last_used > idle_timeout_) {
        idle.push_back(std::move(entry.client));
        it = clients_.erase(it);
      } else {
        ++it;
      }
    }
  }

  ClientOptions options_;
  Clock::duration idle_timeout_;
  mutable std::mutex mu_;
  std::map<std::string, Entry> clients_;
};

}  // namespace swarm
