#include "transports/zmq/zmq_transport.h"

#include "transports/zmq/connection_guard.h"
#include "transports/zmq/fair_queue.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <fmt/format.h>

namespace swarm {
namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(20);
// Below this a copy is cheaper than the bookkeeping of a zero-copy send.
constexpr size_t kZeroCopyThreshold = 1024;
constexpr int kHighWaterMark = 100000;

std::atomic<uint64_t> g_next_endpoint{1};

std::string unique_inproc(const char* kind) {
  return fmt::format("inproc://swarm-{}-{}", kind, g_next_endpoint.fetch_add(1));
}

zmq::context_t& client_context() {
  static zmq::context_t* context = new zmq::context_t(1);  // never destroyed: outlives static clients
  return *context;
}

zmq::message_t to_message(const wire::Frame& frame) {
  if (frame.size() < kZeroCopyThreshold) return zmq::message_t(frame.data(), frame.size());
  auto* keeper = new std::shared_ptr<const void>(frame.keeper());
  return zmq::message_t(
      const_cast<char*>(frame.data()), frame.size(),
      [](void*, void* hint) { delete static_cast<std::shared_ptr<const void>*>(hint); }, keeper);
}

wire::Frame adopt(zmq::message_t&& message) {
  // ZeroMQ decodes messages up to its batch size in place inside its receive
  // buffer, at any offset; tensor views need aligned data, so those are copied.
  // Large messages get their own (aligned) allocation and are kept as they are.
  const bool aligned = reinterpret_cast<uintptr_t>(message.data()) % 16 == 0;
  if (message.size() < kZeroCopyThreshold || !aligned) return wire::Frame(message.data<char>(), message.size());
  auto held = std::make_shared<zmq::message_t>(std::move(message));
  return wire::Frame::adopt(held->data<char>(), held->size(), held);
}

std::string encode_call_id(CallId id) {
  std::string bytes(sizeof(id), '\0');
  std::memcpy(bytes.data(), &id, sizeof(id));
  return bytes;
}

bool decode_call_id(const zmq::message_t& message, CallId* id) {
  if (message.size() != sizeof(CallId)) return false;
  std::memcpy(id, message.data(), sizeof(CallId));
  return true;
}

// Sends `head` frames, then `frames`, as one multipart message.
bool send_multipart(zmq::socket_t& socket, std::vector<zmq::message_t>& head, const wire::Frames& frames,
                    zmq::send_flags extra = zmq::send_flags::none) {
  const size_t total = head.size() + frames.parts.size();
  size_t index = 0;
  auto flags_for = [&](size_t i) {
    return (i + 1 < total ? zmq::send_flags::sndmore : zmq::send_flags::none) | extra;
  };
  for (auto& message : head) {
    if (!socket.send(message, flags_for(index++))) return false;
  }
  for (const auto& part : frames.parts) {
    zmq::message_t message = to_message(part);
    if (!socket.send(message, flags_for(index++))) return false;
  }
  return true;
}

Status apply_client_security(zmq::socket_t& socket, const SecurityOptions& security) {
  if (!security.curve) return Status::ok();
  if (security.server_public_key.size() != 40 || security.keys.public_key.size() != 40 ||
      security.keys.secret_key.size() != 40) {
    return invalid_argument("CURVE needs the server's public key and this client's key pair (40-char Z85)");
  }
  socket.set(zmq::sockopt::curve_serverkey, security.server_public_key);
  socket.set(zmq::sockopt::curve_publickey, security.keys.public_key);
  socket.set(zmq::sockopt::curve_secretkey, security.keys.secret_key);
  return Status::ok();
}

std::string hex(const void* data, size_t size) {
  std::string out;
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) out += fmt::format("{:02x}", bytes[i]);
  return out;
}

}  // namespace

// ---------------------------------------------------------------- server ---

struct ZmqServer::Impl {
  struct Request {
    zmq::message_t routing_id;
    zmq::message_t call_id;
    PeerIdentity from;
    wire::Frames frames;
  };

  zmq::context_t context{1};
  ServerOptions options;
  std::string address;
  std::string replies_endpoint = unique_inproc("replies");
  zmq::socket_t router{context, zmq::socket_type::router};
  zmq::socket_t replies{context, zmq::socket_type::pull};
  std::unique_ptr<zmq::socket_t> zap;
  std::unordered_set<std::string> allowed_keys;  // raw 32-byte keys
  std::unique_ptr<ConnectionGuard> guard;        // TCP servers only

  TransportCounters counters;
  std::atomic<uint64_t> malformed{0};
  std::atomic<uint64_t> refused{0};
  std::atomic<uint64_t> oversized{0};
  std::atomic<uint64_t> busy{0};
  // Built once: a flood is answered without an allocation per request.
  const wire::Frames busy_reply = wire::make_error_reply(0, 0, resource_exhausted("busy: server queue full"));
  std::atomic<bool> stopping{false};
  bool stopped = false;

  std::mutex mu;
  std::condition_variable cv;
  FairQueue<Request> queue;  // by caller (fair_queue.h)
  RequestHandler handler;
  bool serving = false;
  // With one worker the I/O thread runs the handler itself: requests are
  // serialized either way, and two thread hops per request disappear.
  std::atomic<bool> serving_inline{false};

  std::thread io_thread, zap_thread;
  std::vector<std::thread> workers;

  ~Impl() { stop(); }

  void stop() {
    if (stopped) return;
    stopped = true;
    {
      // Under the lock, so a worker between its check and its wait still wakes.
      std::lock_guard lock(mu);
      stopping = true;
    }
    cv.notify_all();
    for (auto& worker : workers) worker.join();
    if (io_thread.joinable()) io_thread.join();
    if (zap_thread.joinable()) zap_thread.join();
    if (guard) guard->stop();
    router.close();
    replies.close();
    if (zap) zap->close();
    context.shutdown();
  }

  void run_zap() {
    // ZAP (RFC 27): version, request id, domain, address, identity, mechanism, credentials.
    while (!stopping) {
      zmq::pollitem_t item{zap->handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, kPollInterval);
      if (!(item.revents & ZMQ_POLLIN)) continue;
      std::vector<zmq::message_t> request;
      if (!zmq::recv_multipart(*zap, std::back_inserter(request), zmq::recv_flags::dontwait)) continue;
      if (request.size() < 6) continue;
      const std::string mechanism = request[5].to_string();
      bool allowed = false;
      std::string user_id;
      if (mechanism == "CURVE" && request.size() >= 7 && request[6].size() == 32) {
        const std::string key = request[6].to_string();
        allowed = allowed_keys.empty() || allowed_keys.count(key) > 0;
        char z85[41] = {};
        zmq_z85_encode(z85, reinterpret_cast<const uint8_t*>(key.data()), 32);
        user_id = z85;
      }
      if (!allowed) refused.fetch_add(1);
      std::vector<zmq::message_t> reply;
      reply.emplace_back(std::string("1.0"));
      reply.emplace_back(std::move(request[1]));
      reply.emplace_back(std::string(allowed ? "200" : "400"));
      reply.emplace_back(std::string(allowed ? "OK" : "client key not allowed"));
      reply.emplace_back(user_id);
      reply.emplace_back();
      zmq::send_multipart(*zap, reply);
    }
  }

  void run_io() {
    zmq::pollitem_t items[] = {{router.handle(), 0, ZMQ_POLLIN, 0}, {replies.handle(), 0, ZMQ_POLLIN, 0}};
    while (!stopping) {
      zmq::poll(items, 2, kPollInterval);
      if (serving_inline) drain_queue_inline();
      if (items[0].revents & ZMQ_POLLIN) receive_requests();
      if (items[1].revents & ZMQ_POLLIN) forward_replies();
    }
  }

  // Requests that arrived before serve() in inline mode.
  void drain_queue_inline() {
    FairQueue<Request> waiting;
    {
      std::lock_guard lock(mu);
      std::swap(waiting, queue);
    }
    while (!waiting.empty()) {
      Request request = waiting.pop();
      answer_inline(request);
    }
  }

  void answer_inline(Request& request) { reply_from_io_thread(request, run_handler(request)); }

  void reply_from_io_thread(Request& request, const wire::Frames& reply) {
    std::vector<zmq::message_t> head;
    head.push_back(std::move(request.routing_id));
    head.push_back(std::move(request.call_id));
    if (send_multipart(router, head, reply, zmq::send_flags::dontwait)) counters.count_sent(frame_bytes(reply));
  }

  // False when the queue is full; the caller then answers busy.
  bool try_enqueue(Request& request) {
    {
      std::lock_guard lock(mu);
      if (queue.size() >= static_cast<size_t>(options.max_queued_requests)) return false;
      const std::string caller = request.from.id;
      queue.push(caller, std::move(request));
    }
    cv.notify_one();
    return true;
  }

  wire::Frames run_handler(Request& request) {
    try {
      return handler(request.from, std::move(request.frames));
    } catch (const std::exception& error) {
      return wire::make_error_reply(0, 0, internal("request handler threw: {}", error.what()));
    } catch (...) {
      return wire::make_error_reply(0, 0, internal("request handler threw"));
    }
  }

  void receive_requests() {
    for (int batch = 0; batch < 256; ++batch) {
      std::vector<zmq::message_t> parts;
      if (!zmq::recv_multipart(router, std::back_inserter(parts), zmq::recv_flags::dontwait)) return;
      CallId id = 0;
      if (parts.size() < 2 || !decode_call_id(parts[1], &id)) {
        malformed.fetch_add(1);
        continue;
      }
      // The socket bounds each frame; many frames under the limit can still add up past it.
      uint64_t bytes = 0;
      for (size_t i = 2; i < parts.size(); ++i) bytes += parts[i].size();
      if (bytes > static_cast<uint64_t>(options.max_message_bytes)) {
        oversized.fetch_add(1);
        continue;
      }
      Request request;
      // Properties ride on frames the peer sent, not on ROUTER's routing-id frame.
      const char* user = options.security.curve ? zmq_msg_gets(parts[1].handle(), "User-Id") : nullptr;
      request.from.id = user != nullptr ? fmt::format("curve:{}", user)
                                        : fmt::format("zmq:{}", hex(parts[0].data(), parts[0].size()));
      for (size_t i = 2; i < parts.size(); ++i) request.frames.parts.push_back(adopt(std::move(parts[i])));
      counters.count_received(bytes);
      if (guard) guard->request_arrived(zmq_msg_get(parts[1].handle(), ZMQ_SRCFD));
      request.routing_id = std::move(parts[0]);
      request.call_id = std::move(parts[1]);
      if (serving_inline) {
        answer_inline(request);
      } else if (!try_enqueue(request)) {
        busy.fetch_add(1);
        reply_from_io_thread(request, busy_reply);
      }
    }
  }

  void forward_replies() {
    for (int batch = 0; batch < 256; ++batch) {
      std::vector<zmq::message_t> parts;
      if (!zmq::recv_multipart(replies, std::back_inserter(parts), zmq::recv_flags::dontwait)) return;
      uint64_t bytes = 0;
      for (size_t i = 2; i < parts.size(); ++i) bytes += parts[i].size();
      // A vanished client's reply is dropped by ROUTER; nothing to do about it.
      if (zmq::send_multipart(router, parts, zmq::send_flags::dontwait)) counters.count_sent(bytes);
    }
  }

  void run_worker() {
    zmq::socket_t push(context, zmq::socket_type::push);
    push.set(zmq::sockopt::linger, 0);
    push.set(zmq::sockopt::sndhwm, kHighWaterMark);
    push.connect(replies_endpoint);
    while (true) {
      Request request;
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return stopping || !queue.empty(); });
        if (stopping) return;
        request = queue.pop();
      }
      wire::Frames reply = run_handler(request);
      std::vector<zmq::message_t> head;
      head.push_back(std::move(request.routing_id));
      head.push_back(std::move(request.call_id));
      send_multipart(push, head, reply);
    }
  }
};

ZmqServer::ZmqServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ZmqServer::ZmqServer(ZmqServer&&) noexcept = default;
ZmqServer& ZmqServer::operator=(ZmqServer&&) noexcept = default;
ZmqServer::~ZmqServer() = default;

Status ZmqServer::serve(RequestHandler handler) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  if (s.stopped) return failed_precondition("server {} is stopped", s.address);
  if (s.serving) return failed_precondition("server {} is already serving", s.address);
  s.handler = std::move(handler);
  s.serving = true;
  if (s.options.worker_threads == 1) {
    s.serving_inline = true;
    return Status::ok();
  }
  for (int i = 0; i < s.options.worker_threads; ++i) s.workers.emplace_back([&s] { s.run_worker(); });
  return Status::ok();
}

const std::string& ZmqServer::address() const { return impl_->address; }
void ZmqServer::stop() { impl_->stop(); }
const TransportCounters& ZmqServer::counters() const { return impl_->counters; }
uint64_t ZmqServer::malformed_messages() const { return impl_->malformed.load(); }
uint64_t ZmqServer::refused_handshakes() const { return impl_->refused.load(); }
uint64_t ZmqServer::oversized_requests() const { return impl_->oversized.load(); }
uint64_t ZmqServer::busy_replies() const { return impl_->busy.load(); }
ConnectionCounts ZmqServer::connection_counts() const {
  return impl_->guard ? impl_->guard->counts() : ConnectionCounts{};
}
size_t ZmqServer::open_connections() const { return impl_->guard ? impl_->guard->open_connections() : 0; }
bool ZmqServer::wait_for_open_connections(size_t count, Deadline deadline) const {
  return !impl_->guard || impl_->guard->wait_for_open_connections(count, deadline);
}

Result<ZmqServer> ZmqTransport::bind(const std::string& address, ServerOptions options) {
  if (options.worker_threads < 1) return invalid_argument("a server needs at least one worker thread");
  if (options.max_message_bytes <= 0) return invalid_argument("max_message_bytes must be above 0");
  if (options.max_queued_requests < 1) return invalid_argument("max_queued_requests must be at least 1");
  const ConnectionLimits& limits = options.connections;
  if (limits.handshake_timeout_ms < 1 || limits.max_unfinished_per_source < 1 || limits.descriptor_reserve < 0 ||
      limits.accept_backlog < 1) {
    return invalid_argument("connection limits: handshake_timeout_ms and max_unfinished_per_source must be at least "
                            "1, descriptor_reserve at least 0");
  }
  auto impl = std::make_unique<ZmqServer::Impl>();
  impl->options = options;
  try {
    const SecurityOptions& security = options.security;
    if (security.curve) {
      if (!zmq_has("curve")) return unimplemented("this libzmq was built without CURVE");
      if (security.keys.secret_key.size() != 40) {
        return invalid_argument("CURVE needs the server's secret key (40-char Z85)");
      }
      for (const std::string& key : security.allowed_client_keys) {
        uint8_t raw[32];
        if (key.size() != 40 || zmq_z85_decode(raw, key.c_str()) == nullptr) {
          return invalid_argument("allowed client key \"{}\" is not 40-char Z85", key);
        }
        impl->allowed_keys.insert(std::string(reinterpret_cast<char*>(raw), 32));
      }
      // The ZAP handler must be bound before the first handshake can arrive.
      impl->zap = std::make_unique<zmq::socket_t>(impl->context, zmq::socket_type::rep);
      impl->zap->bind("inproc://zeromq.zap.01");
      impl->router.set(zmq::sockopt::curve_server, 1);
      impl->router.set(zmq::sockopt::curve_secretkey, security.keys.secret_key);
      impl->router.set(zmq::sockopt::zap_domain, "swarm");
    }
    impl->router.set(zmq::sockopt::linger, 0);
    impl->router.set(zmq::sockopt::handshake_ivl, limits.handshake_timeout_ms);
    impl->router.set(zmq::sockopt::backlog, limits.accept_backlog);
    if (address.starts_with("tcp://")) impl->guard = std::make_unique<ConnectionGuard>(impl->context, impl->router, limits);
    impl->router.set(zmq::sockopt::maxmsgsize, options.max_message_bytes);
    impl->router.set(zmq::sockopt::rcvhwm, kHighWaterMark);
    impl->router.set(zmq::sockopt::sndhwm, kHighWaterMark);
    impl->replies.set(zmq::sockopt::linger, 0);
    impl->replies.set(zmq::sockopt::rcvhwm, kHighWaterMark);
    impl->replies.bind(impl->replies_endpoint);
    impl->router.bind(address);
    impl->address = impl->router.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& error) {
    if (impl->guard) impl->guard->stop();
    if (impl->zap) impl->zap->close();
    return unavailable("cannot bind {}: {}", address, error.what());
  }
  ZmqServer::Impl* raw = impl.get();
  if (raw->zap) raw->zap_thread = std::thread([raw] { raw->run_zap(); });
  raw->io_thread = std::thread([raw] { raw->run_io(); });
  return ZmqServer(std::move(impl));
}

// ---------------------------------------------------------------- client ---

struct ZmqClient::Impl {
  struct Outgoing {
    CallId id;
    wire::Frames frames;
  };

  // Callers send on the DEALER themselves, under socket_mu, so a request
  // leaves without a thread hop. The I/O thread only receives: it sleeps in
  // poll(2) on the socket's notification fd and on `wakeup`, which a caller
  // pokes when its send swallowed a readable edge or had to be queued.
  zmq::context_t& context = client_context();
  std::mutex socket_mu;  // guards dealer and backlog
  zmq::socket_t dealer{context, zmq::socket_type::dealer};
  // Calls wait here while the server is unreachable (not yet connected, or
  // restarting), so they go out on reconnection instead of failing at once;
  // their deadline still ends them.
  std::deque<Outgoing> backlog;
  int wakeup = -1;  // eventfd
  int zmq_fd = -1;  // the DEALER's notification fd, read with poll(2) only
  std::atomic<int> waiters{0};
  static constexpr auto kPumpSlice = std::chrono::milliseconds(5);
  PeerIdentity identity;
  TransportCounters counters;
  int64_t max_message_bytes = kDefaultMaxMessageBytes;

  std::mutex pending_mu;
  std::unordered_map<CallId, std::shared_ptr<CallState>> pending;
  std::atomic<CallId> next_id{1};
  std::atomic<bool> stopping{false};
  std::thread io_thread;

  ~Impl() {
    stopping = true;
    poke();
    if (io_thread.joinable()) io_thread.join();
    dealer.close();
    if (wakeup >= 0) ::close(wakeup);
    std::lock_guard lock(pending_mu);
    for (auto& [id, state] : pending) state->complete(cancelled("client closed"));
    pending.clear();
  }

  void poke() {
    const uint64_t one = 1;
    if (wakeup >= 0) (void)!::write(wakeup, &one, sizeof(one));
  }

  // Called with socket_mu held. False when the socket would block.
  bool send_locked(Outgoing& out) {
    std::vector<zmq::message_t> head;
    head.emplace_back(encode_call_id(out.id));
    const uint64_t bytes = frame_bytes(out.frames);
    if (!send_multipart(dealer, head, out.frames, zmq::send_flags::dontwait)) return false;
    counters.count_sent(bytes);
    return true;
  }

  void send(Outgoing out) {
    bool wake = false;
    {
      std::lock_guard lock(socket_mu);
      if (!backlog.empty() || !send_locked(out)) {
        backlog.push_back(std::move(out));
        wake = true;
      }
      // The send may have swallowed the fd's readable edge: if so, pass it on.
      wake = wake || (dealer.get(zmq::sockopt::events) & ZMQ_POLLIN) != 0;
    }
    if (wake) poke();
  }

  // One pass over the socket: flush the backlog, take every reply waiting,
  // deliver them. Returns whether more is readable right away.
  bool service_socket(bool* has_backlog) {
    std::vector<std::vector<zmq::message_t>> replies;
    bool more = false;
    {
      std::lock_guard lock(socket_mu);
      while (!backlog.empty()) {
        if (!is_pending(backlog.front().id)) {  // cancelled or expired while waiting
          backlog.pop_front();
          continue;
        }
        if (!send_locked(backlog.front())) break;
        backlog.pop_front();
      }
      for (int batch = 0; batch < 256; ++batch) {
        std::vector<zmq::message_t> parts;
        if (!zmq::recv_multipart(dealer, std::back_inserter(parts), zmq::recv_flags::dontwait)) break;
        replies.push_back(std::move(parts));
      }
      more = (dealer.get(zmq::sockopt::events) & ZMQ_POLLIN) != 0;
      if (has_backlog != nullptr) *has_backlog = !backlog.empty();
    }
    for (auto& parts : replies) deliver(parts);
    return more;
  }

  // Run by a caller blocked on one of this client's calls: it waits on the
  // socket itself, so its reply needs no hand-off from the I/O thread.
  void pump(Deadline limit) {
    waiters.fetch_add(1);
    if (!service_socket(nullptr)) {
      const auto wait = std::min<Clock::duration>(limit - Clock::now(), kPumpSlice);
      if (wait > Clock::duration::zero()) {
        pollfd item{zmq_fd, POLLIN, 0};
        ::poll(&item, 1, static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(wait).count()));
        service_socket(nullptr);
      }
    }
    waiters.fetch_sub(1);
  }

  void run_io() {
    auto last_prune = Clock::now();
    bool poked = true;
    while (!stopping) {
      bool has_backlog = false;
      // A caller pumping the socket takes its own reply; stepping in would
      // only turn that into a hand-off. Pokes and the backlog still need us.
      const bool more = (poked || waiters.load() == 0) && service_socket(&has_backlog);
      if (Clock::now() - last_prune > kPollInterval) {
        prune_expired();
        last_prune = Clock::now();
      }
      if (more) continue;
      // While callers pump the socket, leave its fd to them and wait only for pokes.
      pollfd items[] = {{wakeup, POLLIN, 0}, {zmq_fd, POLLIN, 0}};
      const nfds_t watched = waiters.load() > 0 ? 1 : 2;
      const auto timeout = has_backlog ? std::chrono::milliseconds(5) : kPollInterval;
      ::poll(items, watched, static_cast<int>(timeout.count()));
      poked = (items[0].revents & POLLIN) != 0 || has_backlog;
      if (items[0].revents & POLLIN) {
        uint64_t count;
        (void)!::read(wakeup, &count, sizeof(count));
      }
    }
  }

  bool is_pending(CallId id) {
    std::lock_guard lock(pending_mu);
    return pending.count(id) > 0;
  }

  void deliver(std::vector<zmq::message_t>& parts) {
    CallId id = 0;
    if (parts.empty() || !decode_call_id(parts[0], &id)) return;
    uint64_t bytes = 0;
    for (size_t i = 1; i < parts.size(); ++i) bytes += parts[i].size();
    counters.count_received(bytes);
    // The socket bounds each frame; the sum is only known here.
    if (bytes > static_cast<uint64_t>(max_message_bytes)) {
      finish(id, resource_exhausted("reply of {} bytes exceeds the client's limit of {}", bytes, max_message_bytes));
      return;
    }
    wire::Frames frames;
    for (size_t i = 1; i < parts.size(); ++i) frames.parts.push_back(adopt(std::move(parts[i])));
    finish(id, std::move(frames));
  }

  void finish(CallId id, Result<wire::Frames> result) {
    std::shared_ptr<CallState> state;
    {
      std::lock_guard lock(pending_mu);
      auto it = pending.find(id);
      if (it == pending.end()) return;  // cancelled, or its deadline already passed
      state = std::move(it->second);
      pending.erase(it);
    }
    state->complete(std::move(result));
  }

  void prune_expired() {
    const auto now = Clock::now();
    std::vector<std::shared_ptr<CallState>> expired;
    {
      std::lock_guard lock(pending_mu);
      for (auto it = pending.begin(); it != pending.end();) {
        if (it->second->deadline() <= now || it->second->done()) {
          expired.push_back(std::move(it->second));
          it = pending.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& state : expired) state->complete(deadline_exceeded("no reply before the deadline"));
  }
};

ZmqClient::ZmqClient(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
ZmqClient::ZmqClient(ZmqClient&&) noexcept = default;
ZmqClient& ZmqClient::operator=(ZmqClient&&) noexcept = default;
ZmqClient::~ZmqClient() = default;

Call ZmqClient::call(wire::Frames request, Deadline deadline) {
  Impl& c = *impl_;
  const CallId id = c.next_id.fetch_add(1);
  std::weak_ptr<Impl> weak = impl_;
  auto state = std::make_shared<CallState>(id, deadline, [weak](Deadline limit) {
    if (auto client = weak.lock()) client->pump(limit);
  });
  if (Clock::now() >= deadline) {
    state->complete(deadline_exceeded("the deadline passed before the call was sent"));
    return Call(state);
  }
  {
    std::lock_guard lock(c.pending_mu);
    c.pending.emplace(id, state);
  }
  c.send({id, std::move(request)});
  return Call(state);
}

Status ZmqClient::cancel(CallId id) {
  std::shared_ptr<CallState> state;
  {
    std::lock_guard lock(impl_->pending_mu);
    auto it = impl_->pending.find(id);
    if (it == impl_->pending.end()) return not_found("no call {} in flight", id);
    state = std::move(it->second);
    impl_->pending.erase(it);
  }
  state->complete(cancelled("call {} cancelled", id));
  return Status::ok();
}

const PeerIdentity& ZmqClient::identity() const { return impl_->identity; }
const TransportCounters& ZmqClient::counters() const { return impl_->counters; }

Result<ZmqClient> ZmqTransport::connect(const std::string& address, ClientOptions options) {
  if (options.max_message_bytes <= 0) return invalid_argument("max_message_bytes must be above 0");
  if (options.link) {
    return invalid_argument("ZeroMQ sends over real links and cannot emulate one: use NetemTransport<ZmqTransport>");
  }
  auto impl = std::make_shared<ZmqClient::Impl>();
  impl->max_message_bytes = options.max_message_bytes;
  try {
    SWARM_RETURN_IF_ERROR(apply_client_security(impl->dealer, options.security));
    impl->dealer.set(zmq::sockopt::linger, 0);
    impl->dealer.set(zmq::sockopt::maxmsgsize, options.max_message_bytes);
    impl->dealer.set(zmq::sockopt::sndhwm, kHighWaterMark);
    impl->dealer.set(zmq::sockopt::rcvhwm, kHighWaterMark);
    impl->dealer.set(zmq::sockopt::reconnect_ivl, 50);
    impl->dealer.connect(address);
    impl->zmq_fd = impl->dealer.get(zmq::sockopt::fd);
  } catch (const zmq::error_t& error) {
    return unavailable("cannot connect to {}: {}", address, error.what());
  }
  impl->wakeup = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (impl->wakeup < 0) return internal("eventfd failed: {}", std::strerror(errno));
  static std::atomic<uint64_t> next_client{1};
  impl->identity.id = options.security.curve ? fmt::format("curve:{}", options.security.keys.public_key)
                                             : fmt::format("zmq-client-{}", next_client.fetch_add(1));
  ZmqClient::Impl* raw = impl.get();
  raw->io_thread = std::thread([raw] { raw->run_io(); });
  return ZmqClient(std::move(impl));
}

}  // namespace swarm
