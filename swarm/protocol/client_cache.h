// client_cache: one transport client per peer address, shared by the threads that call it.
//
// Trainers, averaging rounds and state downloads talk to the same few peers again
// and again; connecting once per address keeps each call to its messages.
//
//   swarm::ClientCache<swarm::ZmqTransport> clients;
//   auto client = clients.get("tcp://127.0.0.1:7000");  // nullptr if it cannot connect
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "swarm/api/transport.h"

namespace swarm {

template <Transport T>
class ClientCache {
 public:
  explicit ClientCache(ClientOptions options = {}) : options_(std::move(options)) {}

  std::shared_ptr<typename T::client_type> get(const std::string& address) {
    std::lock_guard lock(mu_);
    auto it = clients_.find(address);
    if (it != clients_.end()) return it->second;
    auto client = T::connect(address, options_);
    if (!client.is_ok()) return nullptr;
    auto shared = std::make_shared<typename T::client_type>(std::move(client).value());
    clients_[address] = shared;
    return shared;
  }

  // After a peer is found dead, so a restarted one at the same address gets a fresh connection.
  void forget(const std::string& address) {
    std::lock_guard lock(mu_);
    clients_.erase(address);
  }

 private:
  ClientOptions options_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<typename T::client_type>> clients_;
};

}  // namespace swarm
