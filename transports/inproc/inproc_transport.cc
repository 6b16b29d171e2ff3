#include "transports/inproc/inproc_transport.h"

#include <deque>
#include <exception>
#include <mutex>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

namespace swarm {
namespace inproc_detail {

struct ClientCore {
  PeerIdentity identity;
  TransportCounters counters;
  std::shared_ptr<ServerCore> server;
  int64_t max_message_bytes = kDefaultMaxMessageBytes;

  std::mutex mu;
  CallId next_id = 1;
  // Kept only so cancel() can find a call; every entry leaves through finish()
  // or cancel(), because the server answers or fails every request it accepted.
  std::unordered_map<CallId, std::shared_ptr<CallState>> pending;

  void finish(const std::shared_ptr<CallState>& state, Result<wire::Frames> result) {
    {
      std::lock_guard lock(mu);
      pending.erase(state->id());
    }
    state->complete(std::move(result));
  }
};

struct Request {
  PeerIdentity from;
  wire::Frames frames;
  std::shared_ptr<CallState> state;
  std::shared_ptr<ClientCore> client;
};

struct ServerCore;

// Process-wide, so any thread that knows the name reaches the server.
struct Registry {
  std::mutex mu;
  std::unordered_map<std::string, std::shared_ptr<ServerCore>> servers;
};
Registry& registry() {
  static Registry* instance = new Registry();  // never destroyed: safe at exit
  return *instance;
}

// What became of a request handed to the server; only `queued` keeps it.
enum class Admission { queued, stopped, oversized, busy };

struct ServerCore : std::enable_shared_from_this<ServerCore> {
  std::string address;
  ServerOptions options;
  TransportCounters counters;
  std::atomic<uint64_t> oversized{0};
  std::atomic<uint64_t> busy{0};
  // The ZeroMQ server's busy answer, so callers see one reply whatever the transport.
  const wire::Frames busy_reply = wire::make_error_reply(0, 0, resource_exhausted("busy: server queue full"));

  std::mutex mu;
  std::condition_variable cv;
  std::deque<Request> queue;
  // Requests inside a handler right now, so stop() can fail them without waiting.
  std::unordered_map<CallState*, Request*> running;
  bool serving = false;
  bool stopped = false;
  RequestHandler handler;
  std::vector<std::thread> workers;

  // Takes the request only when it answers `queued`.
  Admission enqueue(Request& request) {
    const uint64_t bytes = frame_bytes(request.frames);
    std::lock_guard lock(mu);
    if (stopped) return Admission::stopped;
    if (bytes > static_cast<uint64_t>(options.max_message_bytes)) {
      oversized.fetch_add(1, std::memory_order_relaxed);
      return Admission::oversized;
    }
    counters.count_received(bytes);
    if (queue.size() >= static_cast<size_t>(options.max_queued_requests)) {
      busy.fetch_add(1, std::memory_order_relaxed);
      counters.count_sent(frame_bytes(busy_reply));
      return Admission::busy;
    }
    queue.push_back(std::move(request));
    cv.notify_one();
    return Admission::queued;
  }

  void work() {
    std::unique_lock lock(mu);
    while (true) {
      cv.wait(lock, [&] { return stopped || !queue.empty(); });
      if (stopped) return;
      Request request = std::move(queue.front());
      queue.pop_front();
      // Skip work nobody waits for any more.
      if (request.state->done()) continue;
      if (Clock::now() >= request.state->deadline()) {
        lock.unlock();
        request.client->finish(request.state, deadline_exceeded("call expired in the server queue"));
        lock.lock();
        continue;
      }
      running.emplace(request.state.get(), &request);
      lock.unlock();
      Result<wire::Frames> reply = run_handler(request);
      lock.lock();
      running.erase(request.state.get());
      if (stopped) return;  // stop() already failed this call
      if (reply.is_ok()) {
        uint64_t bytes = frame_bytes(*reply);
        counters.count_sent(bytes);
        request.client->counters.count_received(bytes);
        if (bytes > static_cast<uint64_t>(request.client->max_message_bytes)) {
          reply = resource_exhausted("reply of {} bytes exceeds the client's limit of {}", bytes,
                                     request.client->max_message_bytes);
        }
      }
      lock.unlock();
      request.client->finish(request.state, std::move(reply));
      lock.lock();
    }
  }

  Result<wire::Frames> run_handler(Request& request) {
    // A handler bug must not take the server down with it.
    try {
      return handler(request.from, std::move(request.frames));
    } catch (const std::exception& e) {
      return internal("request handler threw: {}", e.what());
    } catch (...) {
      return internal("request handler threw a non-exception");
    }
  }

  Status serve(RequestHandler h) {
    if (!h) return invalid_argument("serve() needs a handler");
    std::lock_guard lock(mu);
    if (stopped) return failed_precondition("server {} is stopped", address);
    if (serving) return failed_precondition("server {} is already serving", address);
    serving = true;
    handler = std::move(h);
    for (int i = 0; i < options.worker_threads; ++i) {
      workers.emplace_back([self = shared_from_this()] { self->work(); });
    }
    return Status::ok();
  }

  void stop() {
    {
      std::lock_guard lock(registry().mu);
      auto it = registry().servers.find(address);
      if (it != registry().servers.end() && it->second.get() == this) registry().servers.erase(it);
    }
    std::vector<Request> failed;
    std::vector<std::thread> to_join;
    {
      std::lock_guard lock(mu);
      if (stopped) return;
      stopped = true;
      for (Request& request : queue) failed.push_back(std::move(request));
      queue.clear();
      for (auto& [state, request] : running) {
        failed.push_back(Request{request->from, {}, request->state, request->client});
      }
      to_join.swap(workers);
      cv.notify_all();
    }
    for (Request& request : failed) {
      request.client->finish(request.state, unavailable("server {} stopped", address));
    }
    for (std::thread& worker : to_join) {
      // stop() from inside a handler cannot join its own thread; that worker
      // holds the core alive and exits on its own.
      if (worker.get_id() == std::this_thread::get_id()) {
        worker.detach();
      } else {
        worker.join();
      }
    }
  }
};

constexpr std::string_view kScheme = "inproc://";

}  // namespace inproc_detail

using inproc_detail::Admission;
using inproc_detail::ClientCore;
using inproc_detail::registry;
using inproc_detail::Request;
using inproc_detail::ServerCore;

InprocServer& InprocServer::operator=(InprocServer&& other) noexcept {
  if (this != &other) {
    stop();
    core_ = std::move(other.core_);
  }
  return *this;
}

InprocServer::~InprocServer() { stop(); }

Status InprocServer::serve(RequestHandler handler) { return core_->serve(std::move(handler)); }
const std::string& InprocServer::address() const { return core_->address; }
void InprocServer::stop() {
  if (core_) core_->stop();
}
const TransportCounters& InprocServer::counters() const { return core_->counters; }
uint64_t InprocServer::oversized_requests() const { return core_->oversized.load(); }
uint64_t InprocServer::busy_replies() const { return core_->busy.load(); }

InprocClient& InprocClient::operator=(InprocClient&& other) noexcept {
  if (this != &other) {
    InprocClient old(std::move(*this));
    core_ = std::move(other.core_);
  }
  return *this;
}

InprocClient::~InprocClient() {
  if (!core_) return;
  std::unordered_map<CallId, std::shared_ptr<CallState>> pending;
  {
    std::lock_guard lock(core_->mu);
    pending.swap(core_->pending);
  }
  for (auto& [id, state] : pending) state->complete(cancelled("client closed"));
}

Call InprocClient::call(wire::Frames request, Deadline deadline) {
  std::shared_ptr<CallState> state;
  {
    std::lock_guard lock(core_->mu);
    state = std::make_shared<CallState>(core_->next_id++, deadline);
    core_->pending.emplace(state->id(), state);
  }
  uint64_t bytes = frame_bytes(request);
  // Counted before the hand-over: once queued, a worker may already reply.
  core_->counters.count_sent(bytes);
  ServerCore& server = *core_->server;
  Request handed_over{core_->identity, std::move(request), state, core_};
  switch (server.enqueue(handed_over)) {
    case Admission::queued:
      break;
    case Admission::stopped:
      core_->counters.bytes_sent.fetch_sub(bytes, std::memory_order_relaxed);
      core_->counters.messages_sent.fetch_sub(1, std::memory_order_relaxed);
      core_->finish(state, unavailable("server {} stopped", server.address));
      break;
    case Admission::oversized:
      core_->finish(state, resource_exhausted("request of {} bytes exceeds the limit of {} at {}", bytes,
                                              server.options.max_message_bytes, server.address));
      break;
    case Admission::busy:
      core_->counters.count_received(frame_bytes(server.busy_reply));
      core_->finish(state, server.busy_reply);
      break;
  }
  return Call(std::move(state));
}

Status InprocClient::cancel(CallId id) {
  std::shared_ptr<CallState> state;
  {
    std::lock_guard lock(core_->mu);
    auto it = core_->pending.find(id);
    if (it == core_->pending.end()) return not_found("no pending call {}", id);
    state = std::move(it->second);
    core_->pending.erase(it);
  }
  if (!state->complete(cancelled("call {} cancelled", id))) {
    return not_found("call {} already complete", id);
  }
  return Status::ok();
}

const PeerIdentity& InprocClient::identity() const { return core_->identity; }
const TransportCounters& InprocClient::counters() const { return core_->counters; }

Result<InprocServer> InprocTransport::bind(const std::string& address, ServerOptions options) {
  if (address.size() <= inproc_detail::kScheme.size() ||
      std::string_view(address).substr(0, inproc_detail::kScheme.size()) != inproc_detail::kScheme) {
    return invalid_argument("inproc address must look like inproc://name, got '{}'", address);
  }
  if (options.worker_threads < 1) {
    return invalid_argument("worker_threads must be at least 1, got {}", options.worker_threads);
  }
  if (options.max_message_bytes <= 0) {
    return invalid_argument("max_message_bytes must be above 0, got {}", options.max_message_bytes);
  }
  if (options.max_queued_requests < 1) {
    return invalid_argument("max_queued_requests must be at least 1, got {}", options.max_queued_requests);
  }
  auto core = std::make_shared<ServerCore>();
  core->address = address;
  core->options = options;
  std::lock_guard lock(registry().mu);
  if (!registry().servers.emplace(address, core).second) {
    return already_exists("{} is already bound", address);
  }
  return InprocServer(std::move(core));
}

Result<InprocClient> InprocTransport::connect(const std::string& address, ClientOptions options) {
  // Unique per client for the life of the process, so identities never alias.
  static std::atomic<uint64_t> next_client{1};
  if (options.max_message_bytes <= 0) {
    return invalid_argument("max_message_bytes must be above 0, got {}", options.max_message_bytes);
  }
  if (options.link) {
    return invalid_argument("the in-process transport cannot emulate a link: use NetemTransport<InprocTransport>");
  }
  std::shared_ptr<ServerCore> server;
  {
    std::lock_guard lock(registry().mu);
    auto it = registry().servers.find(address);
    if (it == registry().servers.end()) return unavailable("nothing is bound at {}", address);
    server = it->second;
  }
  auto core = std::make_shared<ClientCore>();
  core->identity.id = fmt::format("inproc-client-{}", next_client.fetch_add(1));
  core->server = std::move(server);
  core->max_message_bytes = options.max_message_bytes;
  return InprocClient(std::move(core));
}

}  // namespace swarm
