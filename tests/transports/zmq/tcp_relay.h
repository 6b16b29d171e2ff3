// tcp_relay: a loopback TCP relay that records the bytes a client sends, so a
// test can check what really crosses the wire (plaintext or ciphertext).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace swarm::testing {

class TcpRelay {
 public:
  explicit TcpRelay(uint16_t target_port) : target_port_(target_port) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = 0;
    ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    ::listen(listen_fd_, 4);
    socklen_t length = sizeof(address);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~TcpRelay() {
    stop_ = true;
    thread_.join();
    ::close(listen_fd_);
  }

  uint16_t port() const { return port_; }
  std::string captured() {
    std::lock_guard lock(mu_);
    return captured_;
  }

 private:
  void run() {
    int client = -1, server = -1;
    char buffer[1 << 16];
    while (!stop_) {
      if (client < 0) {
        pollfd item{listen_fd_, POLLIN, 0};
        if (::poll(&item, 1, 20) <= 0) continue;
        client = ::accept(listen_fd_, nullptr, nullptr);
        server = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in address{};
        address.sin_family = AF_INET;
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        address.sin_port = htons(target_port_);
        if (::connect(server, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
          ::close(client);
          ::close(server);
          client = server = -1;
        }
        continue;
      }
      pollfd items[] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
      if (::poll(items, 2, 20) <= 0) continue;
      if (items[0].revents & (POLLIN | POLLHUP)) {
        ssize_t n = ::read(client, buffer, sizeof(buffer));
        if (n <= 0) break;
        {
          std::lock_guard lock(mu_);
          captured_.append(buffer, n);
        }
        if (::write(server, buffer, n) != n) break;
      }
      if (items[1].revents & (POLLIN | POLLHUP)) {
        ssize_t n = ::read(server, buffer, sizeof(buffer));
        if (n <= 0) break;
        if (::write(client, buffer, n) != n) break;
      }
    }
    if (client >= 0) ::close(client);
    if (server >= 0) ::close(server);
  }

  uint16_t target_port_;
  uint16_t port_ = 0;
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::string captured_;
  std::thread thread_;
};

}  // namespace swarm::testing
