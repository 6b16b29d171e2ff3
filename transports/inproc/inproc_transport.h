// inproc: the Transport concept within one process, for tests and for a whole
// swarm in one program. Endpoints are named "inproc://name" in a process-wide
// registry; frames are moved from caller to handler and back, never copied.
//
//   SWARM_ASSIGN_OR_RETURN(auto server, swarm::InprocTransport::bind("inproc://stage0", {}));
//   SWARM_RETURN_IF_ERROR(server.serve([](const swarm::PeerIdentity&, swarm::wire::Frames f) { return f; }));
//   SWARM_ASSIGN_OR_RETURN(auto client, swarm::InprocTransport::connect("inproc://stage0", {}));
//   auto reply = client.call(std::move(frames), swarm::Clock::now() + std::chrono::seconds(5)).get();
#pragma once

#include <memory>
#include <string>

#include "swarm/core/status.h"
#include "swarm/wire/wire.h"
#include "swarm/api/transport.h"

namespace swarm {

namespace inproc_detail {
struct ServerCore;
struct ClientCore;
}  // namespace inproc_detail

class InprocServer {
 public:
  InprocServer(InprocServer&&) noexcept = default;
  InprocServer& operator=(InprocServer&& other) noexcept;
  ~InprocServer();

  // Starts the worker threads; requests sent since bind() are already queued.
  Status serve(RequestHandler handler);
  const std::string& address() const;
  // Frees the address, completes every queued and running call with
  // unavailable, and joins the workers (a running handler is waited for, its
  // reply dropped). Idempotent.
  void stop();
  const TransportCounters& counters() const;
  // Requests over max_message_bytes, failed at once with resource_exhausted
  // and never handled (ZeroMQ drops them unanswered; here nothing is lost by saying why).
  uint64_t oversized_requests() const;
  // Requests answered with the busy error reply (resource_exhausted, as the
  // ZeroMQ server sends) because max_queued_requests were already waiting.
  uint64_t busy_replies() const;

 private:
  friend class InprocTransport;
  explicit InprocServer(std::shared_ptr<inproc_detail::ServerCore> core) : core_(std::move(core)) {}
  std::shared_ptr<inproc_detail::ServerCore> core_;
};

class InprocClient {
 public:
  InprocClient(InprocClient&&) noexcept = default;
  InprocClient& operator=(InprocClient&& other) noexcept;
  // Completes the calls still pending with cancelled.
  ~InprocClient();

  // Never blocks; a stopped server makes the call complete with unavailable.
  Call call(wire::Frames request, Deadline deadline);
  // not_found when the call is unknown or already complete.
  Status cancel(CallId id);
  const PeerIdentity& identity() const;
  const TransportCounters& counters() const;

 private:
  friend class InprocTransport;
  explicit InprocClient(std::shared_ptr<inproc_detail::ClientCore> core) : core_(std::move(core)) {}
  std::shared_ptr<inproc_detail::ClientCore> core_;
};

struct InprocTransport {
  using transport_concept = transport_t;
  using server_type = InprocServer;
  using client_type = InprocClient;
  using address_type = std::string;

  // invalid_argument for an address not of the form "inproc://name";
  // already_exists while another live server holds it.
  static Result<InprocServer> bind(const std::string& address, ServerOptions options);
  // unavailable when no server is bound there. A client stays tied to the
  // server it found: after that server stops, its calls fail with unavailable.
  static Result<InprocClient> connect(const std::string& address, ClientOptions options);
};

}  // namespace swarm
