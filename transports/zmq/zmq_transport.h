// zmq_transport: the default Transport, ZeroMQ ROUTER servers and DEALER clients.
//
// A server's ROUTER socket lives on one I/O thread that hands requests to a
// pool of worker threads and sends their replies (with one worker, the I/O
// thread runs the handler itself). Senders are not trusted with the server's
// memory: ZMQ_MAXMSGSIZE caps each frame, the I/O thread drops requests too
// large in sum, and a full worker queue is answered "busy" at once rather
// than grown. A client's DEALER socket lives on one I/O thread too, so many
// calls share one connection and any thread may call. Frames go out with
// zmq_msg_init_data over the frame's own buffer and come in as Frames that
// adopt the received zmq message: tensor bytes are never copied by the
// transport. With CURVE on, traffic is encrypted and a ZAP handler admits only
// allowed client keys; the handler then sees the client's public key as its
// PeerIdentity. DEALER reconnects by itself, so a peer restarted at the same
// address is reached again without a new client.
//
//   auto server = swarm::ZmqTransport::bind("tcp://127.0.0.1:*", {});
//   server->serve([](const swarm::PeerIdentity&, swarm::wire::Frames f) { return f; });
//   auto client = swarm::ZmqTransport::connect(server->address(), {});
//   auto reply = client->call(std::move(frames), swarm::Clock::now() + 1s).get();
#pragma once

#include <memory>
#include <string>

#include "swarm/core/status.h"
#include "swarm/wire/wire.h"
#include "swarm/api/transport.h"
#include "transports/zmq/connection_table.h"

namespace swarm {

class ZmqServer {
 public:
  ZmqServer(ZmqServer&&) noexcept;
  ZmqServer& operator=(ZmqServer&&) noexcept;
  ~ZmqServer();

  // Starts the workers; requests that arrived since bind() are served then.
  Status serve(RequestHandler handler);
  // The bound endpoint with its real port, e.g. "tcp://127.0.0.1:40123".
  const std::string& address() const;
  // Closes the socket and joins the threads; calls in flight get no reply.
  void stop();
  const TransportCounters& counters() const;
  // Messages without the transport's call-id frame, and CURVE handshakes the
  // allow-list refused.
  uint64_t malformed_messages() const;
  uint64_t refused_handshakes() const;
  // Requests dropped unanswered because their frames together exceed
  // max_message_bytes. A single frame over it is not counted: libzmq drops
  // the sender's connection before the frame arrives.
  uint64_t oversized_requests() const;
  // Requests answered resource_exhausted because max_queued_requests were
  // already waiting for a worker. With one worker the I/O thread runs the
  // handler itself and never answers busy; the socket's high-water mark and
  // TCP push back on senders instead.
  uint64_t busy_replies() const;
  // Connections the guard shut down (per source, over the descriptor budget) and
  // handshakes closed unfinished after ConnectionLimits::handshake_timeout_ms.
  ConnectionCounts connection_counts() const;
  // Accepted TCP connections open now, as the guard counts them.
  size_t open_connections() const;
  // Whether at most `count` are open by `deadline`, woken by each close (a server
  // without a guard has none open).
  bool wait_for_open_connections(size_t count, Deadline deadline) const;

 private:
  friend struct ZmqTransport;
  struct Impl;
  explicit ZmqServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class ZmqClient {
 public:
  ZmqClient(ZmqClient&&) noexcept;
  ZmqClient& operator=(ZmqClient&&) noexcept;
  ~ZmqClient();

  // Never blocks. The reply, or deadline_exceeded / cancelled, completes the Call.
  Call call(wire::Frames request, Deadline deadline);
  Status cancel(CallId id);
  const PeerIdentity& identity() const;
  const TransportCounters& counters() const;

 private:
  friend struct ZmqTransport;
  struct Impl;
  explicit ZmqClient(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;  // shared with waiting Calls, which pump the socket
};

struct ZmqTransport {
  using transport_concept = transport_t;
  using server_type = ZmqServer;
  using client_type = ZmqClient;
  using address_type = std::string;

  // "tcp://HOST:PORT", with PORT "*" for any free port. Errors: a bad or busy
  // address, CURVE asked for without keys, or a libzmq without CURVE.
  static Result<ZmqServer> bind(const std::string& address, ServerOptions options);
  static Result<ZmqClient> connect(const std::string& address, ClientOptions options);
};

static_assert(Transport<ZmqTransport>);

}  // namespace swarm
