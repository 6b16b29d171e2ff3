// stranger_socket: raw TCP connections a stranger opens to a server and never
// speaks on (no ZMTP greeting, no CURVE handshake), from a loopback address of its
// own so that a server's per-source limits can tell it from honest clients.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace swarm::test_sockets {

// A connected TCP socket from `source` (any 127.x.y.z) to 127.0.0.1:port, or -1.
inline int open_from(const char* source, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in local{};
  local.sin_family = AF_INET;
  ::inet_pton(AF_INET, source, &local.sin_addr);
  sockaddr_in remote{};
  remote.sin_family = AF_INET;
  remote.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &remote.sin_addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof(local)) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&remote), sizeof(remote)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Whether the server ended this connection (end of stream, reset or hang-up),
// without blocking; what the server sent meanwhile (its greeting) is read and dropped.
inline bool ended(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR)) return true;
  char bytes[128];
  return ::recv(fd, bytes, sizeof(bytes), MSG_DONTWAIT) == 0;
}

}  // namespace swarm::test_sockets
