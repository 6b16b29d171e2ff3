// transport: the Transport concept, request/response messaging between peers
// with per-call deadlines, plus the Call handle every transport completes.
//
// A transport opts in with `using transport_concept = swarm::transport_t;`
// (the right member names without the tag are not enough), binds servers that
// run a handler per request, and connects clients that keep many calls in
// flight. Runtimes are templates over it, so swapping transports is a template
// argument:
//
//   template <swarm::Transport T>
//   swarm::Result<swarm::wire::Frames> ping(typename T::client_type& client, swarm::Deadline d) {
//     return client.call(swarm::wire::Frames{{"ping"}}, d).get();
//   }
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "swarm/core/clock.h"
#include "swarm/core/frame.h"
#include "swarm/core/ids.h"
#include "swarm/core/status.h"

namespace swarm {

struct transport_t {};


// Atomics because a client's callers and a server's workers update them from
// many threads; messages count whole multipart messages, bytes count frame bytes.
struct TransportCounters {
  std::atomic<uint64_t> bytes_sent{0};
  std::atomic<uint64_t> bytes_received{0};
  std::atomic<uint64_t> messages_sent{0};
  std::atomic<uint64_t> messages_received{0};

  void count_sent(uint64_t bytes) {
    bytes_sent.fetch_add(bytes, std::memory_order_relaxed);
    messages_sent.fetch_add(1, std::memory_order_relaxed);
  }
  void count_received(uint64_t bytes) {
    bytes_received.fetch_add(bytes, std::memory_order_relaxed);
    messages_received.fetch_add(1, std::memory_order_relaxed);
  }
};

inline uint64_t frame_bytes(const wire::Frames& frames) {
  uint64_t total = 0;
  for (const auto& part : frames.parts) total += part.size();
  return total;
}

// Key-based authentication and encryption for transports that offer it
// (ZeroMQ CURVE); in-process transports ignore it. Keys are Z85 text, 40
// characters. See transports/zmq/curve_keys.h to make or derive them.
struct CurveKeyPair {
  std::string public_key;
  std::string secret_key;
};

struct SecurityOptions {
  bool curve = false;
  CurveKeyPair keys;                              // this side's own pair
  std::string server_public_key;                  // client side: the server it expects
  std::vector<std::string> allowed_client_keys;   // server side: empty admits any key holder
};

// The same default as wire::Limits::max_message_bytes, so a server never
// refuses what the wire layer would have accepted.
inline constexpr int64_t kDefaultMaxMessageBytes = int64_t{256} << 20;

// What one stranger may hold of a server's connections (transports with real
// sockets; inproc ignores them).
struct ConnectionLimits {
  // A connection that has not finished its handshake by then is closed (libzmq's
  // ZMQ_HANDSHAKE_IVL). Above 0.
  int handshake_timeout_ms = 5000;
  // Connections from one source address that have delivered no request yet. Above 0.
  int max_unfinished_per_source = 256;
  // Descriptors the process keeps out of every server's reach (checkpoints, logs,
  // its own clients), taken from its open-files limit when its first server binds.
  int descriptor_reserve = 1024;
  // Connections the kernel queues for the server to accept (ZMQ_BACKLOG; libzmq's
  // default is 100). A burst beyond the queue has its SYNs dropped and retried a
  // second or more later: a 20,000-connection flood then took 36 to 49 s instead
  // of some 20, and an honest client arriving during one waited as long.
  int accept_backlog = 1024;
};

struct ServerOptions {
  // Handlers may run concurrently on this many threads; at least 1.
  int worker_threads = 1;
  SecurityOptions security;
  // A request larger than this (all frames together) never reaches the
  // handler. Above 0. ZeroMQ also enforces it per frame at the socket, where
  // it drops the sender's connection before the frame is buffered.
  int64_t max_message_bytes = kDefaultMaxMessageBytes;
  // Requests waiting for a worker; beyond this they are answered at once with
  // resource_exhausted ("busy"), so a flood costs a reply, not memory. At least 1.
  int max_queued_requests = 1024;
  ConnectionLimits connections;
};

// A slow link to emulate under each of a client's connections, the same in each
// direction. Transports that emulate links (NetemTransport) take it from here, so a
// runtime configured with one gets it when its transport type is swapped for an
// emulating one; a transport over real links refuses a client that asks for one,
// rather than run over a perfect link that looks like a slow one.
struct EmulatedLink {
  double bandwidth_bytes_per_s = 0;      // 0: unlimited
  std::chrono::microseconds latency{0};  // one way
  friend bool operator==(const EmulatedLink&, const EmulatedLink&) = default;
};

struct ClientOptions {
  SecurityOptions security;
  std::optional<EmulatedLink> link;
  // A reply larger than this (all frames together) fails its call instead of
  // being delivered. Above 0. ZeroMQ checks each frame at the socket: one over
  // it is a protocol error, after which libzmq closes the connection and does
  // not reconnect, so that client's calls time out until it is replaced.
  int64_t max_message_bytes = kDefaultMaxMessageBytes;
};

// Runs on a server worker thread. Failures travel back as an error message
// (wire::make_error_reply), so a handler always answers with frames.
using RequestHandler = std::function<wire::Frames(const PeerIdentity& from, wire::Frames request)>;

// The one-shot result slot shared by a Call and the transport. The first
// completion wins, so a late reply after a cancel or a missed deadline is
// dropped instead of racing the caller.
class CallState {
 public:
  // `pump`, when given, is run by a waiting caller to make progress on the
  // transport until its argument; it must return by then.
  using Pump = std::function<void(Deadline)>;
  CallState(CallId id, Deadline deadline, Pump pump = nullptr)
      : id_(id), deadline_(deadline), pump_(std::move(pump)) {}

  CallId id() const { return id_; }
  Deadline deadline() const { return deadline_; }

  // False when the call was already complete.
  bool complete(Result<wire::Frames> result) {
    std::lock_guard lock(mu_);
    return complete_locked(std::move(result));
  }

  bool done() const {
    std::lock_guard lock(mu_);
    return result_.has_value() || taken_;
  }

  // Waits until complete or `until`, whichever is first. The call's own
  // deadline is enforced here, by whoever waits, so no timer thread is needed.
  bool wait_until(Deadline until) {
    if (pump_) {
      // The waiter drives the transport itself, so the reply reaches it
      // without a hand-off from the transport's thread.
      const Deadline limit = std::min(until, deadline_);
      while (!completed_.load(std::memory_order_acquire) && Clock::now() < limit) pump_(limit);
    }
    std::unique_lock lock(mu_);
    auto is_done = [&] { return result_.has_value() || taken_; };
    Deadline limit = std::min(until, deadline_);
    // libstdc++ converts to the system clock internally; max() would overflow.
    if (limit == Deadline::max()) {
      cv_.wait(lock, is_done);
    } else {
      cv_.wait_until(lock, limit, is_done);
    }
    if (!is_done() && Clock::now() >= deadline_) {
      complete_locked(Status(StatusCode::deadline_exceeded, "call deadline passed"));
    }
    return is_done();
  }

  // Blocks until complete (at the latest at the deadline); the result can be taken once.
  Result<wire::Frames> take() {
    wait_until(Deadline::max());
    std::lock_guard lock(mu_);
    if (taken_) return failed_precondition("call {} result already taken", id_);
    taken_ = true;
    Result<wire::Frames> out = std::move(*result_);
    result_.reset();
    return out;
  }

 private:
  bool complete_locked(Result<wire::Frames> result) {
    if (result_.has_value() || taken_) return false;
    result_.emplace(std::move(result));
    completed_.store(true, std::memory_order_release);
    cv_.notify_all();
    return true;
  }

  const CallId id_;
  const Deadline deadline_;
  const Pump pump_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Result<wire::Frames>> result_;
  std::atomic<bool> completed_{false};
  bool taken_ = false;
};

// The caller's handle on one request in flight.
class Call {
 public:
  explicit Call(std::shared_ptr<CallState> state) : state_(std::move(state)) {}

  CallId id() const { return state_->id(); }
  // Non-blocking; also turns a passed deadline into deadline_exceeded.
  bool ready() const { return state_->wait_until(Deadline::min()); }
  bool wait_until(Deadline until) const { return state_->wait_until(until); }
  // The reply, or unavailable / deadline_exceeded / cancelled.
  Result<wire::Frames> get() { return state_->take(); }

 private:
  std::shared_ptr<CallState> state_;
};

template <typename C>
concept CallHandle = requires(C call, const C& const_call, Deadline deadline) {
  { const_call.id() } -> std::same_as<CallId>;
  { const_call.wait_until(deadline) } -> std::same_as<bool>;
  { call.get() } -> std::same_as<Result<wire::Frames>>;
};

template <typename T>
concept Transport =
    std::same_as<typename T::transport_concept, transport_t> &&
    requires(typename T::server_type& server, typename T::client_type& client,
             const typename T::address_type& address, ServerOptions server_options,
             ClientOptions client_options, RequestHandler handler, wire::Frames frames,
             Deadline deadline, CallId id) {
      { T::bind(address, server_options) } -> std::same_as<Result<typename T::server_type>>;
      { server.serve(std::move(handler)) } -> std::same_as<Status>;
      { server.address() } -> std::convertible_to<typename T::address_type>;
      { server.stop() };
      { server.counters() } -> std::same_as<const TransportCounters&>;
      { T::connect(address, client_options) } -> std::same_as<Result<typename T::client_type>>;
      { client.call(std::move(frames), deadline) } -> CallHandle;
      { client.cancel(id) } -> std::same_as<Status>;
      { client.identity() } -> std::convertible_to<PeerIdentity>;
      { client.counters() } -> std::same_as<const TransportCounters&>;
    };

}  // namespace swarm
