// netem_transport: a network emulator that wraps any Transport and is one
// itself, so a test or a one-machine swarm sees the bandwidth, latency, jitter,
// loss and outages of a real slow network. Each client is one link: requests
// cross its `up` LinkModel, replies its `down` one, and a scheduler thread
// hands each message on when the model says it has arrived.
//
//   using Slow = swarm::NetemTransport<swarm::InprocTransport>;
//   swarm::NetemClientOptions options{swarm::NetemOptions{.up = {.bandwidth_bytes_per_s = 25e6, .latency = 50ms},
//                                                          .down = {.latency = 50ms}, .seed = 1}};
//   SWARM_ASSIGN_OR_RETURN(auto client, Slow::connect("inproc://stage0", options));
//   auto reply = client.call(std::move(frames), swarm::Clock::now() + 5s).get();
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <queue>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "swarm/core/status.h"
#include "swarm/wire/wire.h"
#include "transports/netem/access_links.h"
#include "transports/netem/link_model.h"
#include "swarm/api/transport.h"

namespace swarm {

struct NetemOptions {
  netem::LinkSpec up{};    // requests: this client -> the server
  netem::LinkSpec down{};  // replies: the server -> this client
  uint64_t seed = 1;     // up and down draw from streams derived from it
  netem::FaultSchedule faults{};
  // The name faults use for the far end; empty means the address, when the
  // address is text.
  std::string peer_name{};
  // The Transport concept offers no completion callback, so the scheduler
  // polls inner calls this often while any is in flight: it bounds the error
  // added to every reply.
  netem::Duration poll_interval = std::chrono::microseconds(500);
  // This process's access link, which every message of the connection crosses
  // (and the server's, where the board has one behind the address) before the
  // connection's own up and down links; none means the process's
  // (netem::process_access_link()), if it has one.
  std::optional<netem::AccessLink> access{};
};

// Implicit from ClientOptions, so code written against the Transport concept
// connects without knowing it runs over an emulator: over the options' link in
// both directions where they name one (ClientOptions::link), else a perfect one.
struct NetemClientOptions {
  ClientOptions inner;
  NetemOptions netem;

  NetemClientOptions() = default;
  NetemClientOptions(ClientOptions inner_options) : inner(std::move(inner_options)) {  // NOLINT
    if (inner.link) {
      const netem::LinkSpec each_way{.bandwidth_bytes_per_s = inner.link->bandwidth_bytes_per_s,
                                     .latency = inner.link->latency};
      netem.up = netem.down = each_way;
    }
  }
  NetemClientOptions(NetemOptions netem_options, ClientOptions inner_options = {})  // NOLINT
      : inner(inner_options), netem(std::move(netem_options)) {}
};

template <Transport Inner>
struct NetemTransport;

template <Transport Inner>
class NetemClient {
 public:
  using inner_client_type = typename Inner::client_type;

  NetemClient(NetemClient&&) noexcept = default;
  NetemClient& operator=(NetemClient&& other) noexcept {
    if (this != &other) {
      NetemClient old(std::move(*this));
      core_ = std::move(other.core_);
    }
    return *this;
  }
  // Joins the scheduler and completes the calls still pending with cancelled.
  ~NetemClient() {
    if (core_) core_->shut_down();
  }

  // Never blocks. A message the link loses is simply never delivered, so its
  // call ends with deadline_exceeded, as it would on a real network.
  Call call(wire::Frames request, Deadline deadline) {
    if (core_->direct) return core_->inner.call(std::move(request), deadline);
    return core_->call(std::move(request), deadline);
  }
  // not_found when the call is unknown or already complete.
  Status cancel(CallId id) { return core_->direct ? core_->inner.cancel(id) : core_->cancel(id); }
  decltype(auto) identity() const { return core_->inner.identity(); }
  // What the application sent and received, lost messages included on the sending side.
  const TransportCounters& counters() const { return core_->direct ? core_->inner.counters() : core_->counters; }
  // Whether calls go straight to the inner client: a perfect link both ways and no faults.
  bool direct() const { return core_->direct; }
  // What actually crossed the emulated link, for comparing with counters().
  const inner_client_type& inner() const { return core_->inner; }

 private:
  template <Transport I>
  friend struct NetemTransport;

  using InnerCall = decltype(std::declval<inner_client_type&>().call(wire::Frames{}, Deadline{}));

  struct Core {
    inner_client_type inner;  // first, so destroyed last: it cancels its own calls
    NetemOptions options;
    // A perfect link both ways and no faults: calls skip the scheduler, whose
    // polling costs every reply up to poll_interval and a thread per client (a
    // program that runs over netem only when told to pays nothing otherwise).
    bool direct = false;
    std::string peer;
    TransportCounters counters;
    // The server's slot on the access board, once some process registered its address there.
    std::optional<int> server_slot;

    std::mutex mu;
    std::condition_variable cv;
    netem::LinkModel up;
    netem::LinkModel down;
    CallId next_id = 1;
    bool stopping = false;

    struct Pending {
      std::shared_ptr<CallState> state;
      std::optional<wire::Frames> request;         // until it reaches the inner client
      std::optional<Result<wire::Frames>> reply;  // while it crosses the down link
    };
    std::unordered_map<CallId, Pending> pending;

    enum class EventKind { deliver_request, deliver_reply, expire };
    struct Event {
      Clock::time_point at;
      uint64_t sequence;  // FIFO among events due at one instant
      EventKind kind;
      CallId id;
      bool operator>(const Event& other) const {
        return at != other.at ? at > other.at : sequence > other.sequence;
      }
    };
    std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events;
    uint64_t next_sequence = 0;

    std::thread scheduler;

    Core(inner_client_type inner_client, NetemOptions netem_options, std::string peer_name)
        : inner(std::move(inner_client)),
          options(std::move(netem_options)),
          peer(std::move(peer_name)),
          up(options.up, netem::SplitMix64(options.seed).next()),
          down(options.down, netem::SplitMix64(options.seed ^ 0x5DEECE66Dull).next()) {}

    void start() {
      scheduler = std::thread([this] { run(); });
    }

    enum class Way { to_server, to_client };
    // The access links first (this process's and the server's), then the
    // connection's own link, which may add delay and loss of its own.
    netem::LinkModel::Delivery cross(netem::LinkModel& own, Clock::time_point now, uint64_t bytes, Way way) {
      if (!options.access) return own.schedule(now, bytes);
      netem::AccessLinkBoard& board = *options.access->board();
      if (!server_slot) server_slot = board.slot_of(peer);
      const std::optional<int> self = options.access->slot();
      const Clock::time_point arrives = way == Way::to_server ? board.deliver(self, server_slot, now, bytes)
                                                              : board.deliver(server_slot, self, now, bytes);
      if (own.spec().perfect()) return {false, arrives};
      return own.schedule(arrives, bytes);
    }

    void push_locked(Clock::time_point at, EventKind kind, CallId id) {
      events.push(Event{at, next_sequence++, kind, id});
    }

    Call call(wire::Frames request, Deadline deadline) {
      const uint64_t bytes = frame_bytes(request);
      counters.count_sent(bytes);
      std::shared_ptr<CallState> state;
      {
        std::lock_guard lock(mu);
        state = std::make_shared<CallState>(next_id++, deadline);
        if (stopping) {
          state->complete(cancelled("client closed"));
          return Call(std::move(state));
        }
        const Clock::time_point now = Clock::now();
        netem::LinkModel::Delivery delivery = cross(up, now, bytes, Way::to_server);
        Pending entry{state, std::nullopt, std::nullopt};
        if (!delivery.dropped && !options.faults.dropped(peer, now)) {
          entry.request = std::move(request);
          push_locked(delivery.deliver_at, EventKind::deliver_request, state->id());
        }
        // Lost messages leave their entry here; this event clears it.
        if (deadline != Deadline::max()) push_locked(deadline, EventKind::expire, state->id());
        pending.emplace(state->id(), std::move(entry));
      }
      cv.notify_one();
      return Call(std::move(state));
    }

    Status cancel(CallId id) {
      std::shared_ptr<CallState> state;
      {
        std::lock_guard lock(mu);
        auto it = pending.find(id);
        if (it == pending.end()) return not_found("no pending call {}", id);
        state = std::move(it->second.state);
        pending.erase(it);
      }
      // Wakes the scheduler to cancel the inner call too, if it was forwarded.
      cv.notify_one();
      if (!state->complete(cancelled("call {} cancelled", id))) {
        return not_found("call {} already complete", id);
      }
      return Status::ok();
    }

    // The only thread that touches `inner` (apart from const accessors), so the
    // inner transport needs no thread safety from us.
    void run() {
      std::vector<std::pair<CallId, InnerCall>> in_flight;
      std::unique_lock lock(mu);
      while (!stopping) {
        const Clock::time_point now = Clock::now();
        if (!events.empty() && events.top().at <= now) {
          Event event = events.top();
          events.pop();
          handle_locked(event, lock, in_flight);
          continue;
        }
        if (!in_flight.empty()) {
          poll_locked(lock, in_flight);
          if (stopping) break;
        }
        std::optional<Clock::time_point> wake;
        if (!events.empty()) wake = events.top().at;
        if (!in_flight.empty()) {
          Clock::time_point poll_at = Clock::now() + options.poll_interval;
          wake = wake ? std::min(*wake, poll_at) : poll_at;
        }
        // Woken early by call(), cancel() or shut_down(); the loop re-checks.
        // Far waits are capped: a spurious wake costs nothing, while a
        // time_point near max() overflows inside the timed wait.
        if (wake) {
          wake = std::min(*wake, Clock::now() + std::chrono::hours(1));
          cv.wait_until(lock, *wake);
        } else {
          cv.wait(lock);
        }
      }
    }

    void handle_locked(const Event& event, std::unique_lock<std::mutex>& lock,
                       std::vector<std::pair<CallId, InnerCall>>& in_flight) {
      auto it = pending.find(event.id);
      if (it == pending.end()) return;  // cancelled or already finished
      switch (event.kind) {
        case EventKind::deliver_request: {
          if (!it->second.request || it->second.state->done()) return;
          wire::Frames request = std::move(*it->second.request);
          it->second.request.reset();
          const Deadline deadline = it->second.state->deadline();
          lock.unlock();
          InnerCall inner_call = inner.call(std::move(request), deadline);
          lock.lock();
          in_flight.emplace_back(event.id, std::move(inner_call));
          return;
        }
        case EventKind::deliver_reply: {
          std::shared_ptr<CallState> state = std::move(it->second.state);
          Result<wire::Frames> reply = std::move(*it->second.reply);
          pending.erase(it);
          lock.unlock();
          // Counted before completing, so a caller that sees the reply sees the count.
          if (reply.is_ok() && !state->done()) counters.count_received(frame_bytes(*reply));
          state->complete(std::move(reply));
          lock.lock();
          return;
        }
        case EventKind::expire: {
          std::shared_ptr<CallState> state = std::move(it->second.state);
          pending.erase(it);
          lock.unlock();
          state->complete(deadline_exceeded("call {} lost on the emulated link", event.id));
          lock.lock();
          return;
        }
      }
    }

    // Collects inner replies and puts each on the down link; cancels inner
    // calls whose outer call is gone.
    void poll_locked(std::unique_lock<std::mutex>& lock,
                     std::vector<std::pair<CallId, InnerCall>>& in_flight) {
      std::vector<bool> orphaned(in_flight.size());
      for (size_t i = 0; i < in_flight.size(); ++i) {
        auto it = pending.find(in_flight[i].first);
        orphaned[i] = it == pending.end() || it->second.state->done();
      }
      lock.unlock();
      std::vector<std::pair<CallId, Result<wire::Frames>>> replies;
      std::vector<std::pair<CallId, InnerCall>> still_in_flight;
      for (size_t i = 0; i < in_flight.size(); ++i) {
        auto& [id, inner_call] = in_flight[i];
        if (orphaned[i]) {
          // not_found only means it finished meanwhile; nobody waits for it either way.
          (void)inner.cancel(inner_call.id());
        } else if (inner_call.wait_until(Deadline::min())) {
          replies.emplace_back(id, inner_call.get());
        } else {
          still_in_flight.emplace_back(id, std::move(inner_call));
        }
      }
      in_flight.swap(still_in_flight);
      lock.lock();
      const Clock::time_point now = Clock::now();
      for (auto& [id, reply] : replies) {
        auto it = pending.find(id);
        if (it == pending.end()) continue;
        // An error reply crosses the link too, carrying no payload bytes.
        const uint64_t bytes = reply.is_ok() ? frame_bytes(*reply) : 0;
        netem::LinkModel::Delivery delivery = cross(down, now, bytes, Way::to_client);
        if (delivery.dropped || options.faults.dropped(peer, now)) continue;  // expire clears it
        it->second.reply = std::move(reply);
        push_locked(delivery.deliver_at, EventKind::deliver_reply, id);
      }
    }

    void shut_down() {
      {
        std::lock_guard lock(mu);
        if (stopping) return;
        stopping = true;
      }
      cv.notify_all();
      if (scheduler.joinable()) scheduler.join();
      std::unordered_map<CallId, Pending> left;
      {
        std::lock_guard lock(mu);
        left.swap(pending);
      }
      for (auto& [id, entry] : left) entry.state->complete(cancelled("client closed"));
    }
  };

  explicit NetemClient(std::unique_ptr<Core> core) : core_(std::move(core)) {}
  std::unique_ptr<Core> core_;
};

// Servers pass straight through: the client side models both directions of
// its link, so a server needs no emulation of its own. A server of a process
// with an access link registers its address there, so that clients find it.
template <Transport Inner>
struct NetemTransport {
  using transport_concept = transport_t;
  using server_type = typename Inner::server_type;
  using client_type = NetemClient<Inner>;
  using address_type = typename Inner::address_type;

  static Result<server_type> bind(const address_type& address, ServerOptions options) {
    SWARM_ASSIGN_OR_RETURN(server_type server, Inner::bind(address, options));
    if constexpr (std::convertible_to<const address_type&, std::string_view>) {
      if (const std::optional<netem::AccessLink> access = netem::process_access_link()) {
        SWARM_RETURN_IF_ERROR(access->add_address(server.address()).with_context("the server's access link"));
      }
    }
    return server;
  }

  // invalid_argument for a bad LinkSpec; otherwise whatever Inner::connect says.
  static Result<client_type> connect(const address_type& address, NetemClientOptions options) {
    SWARM_RETURN_IF_ERROR(options.netem.up.validate().with_context("up link"));
    SWARM_RETURN_IF_ERROR(options.netem.down.validate().with_context("down link"));
    if (options.netem.poll_interval <= netem::Duration::zero()) {
      return invalid_argument("poll_interval must be positive");
    }
    options.inner.link.reset();  // emulated here, not asked of the transport underneath
    SWARM_ASSIGN_OR_RETURN(auto inner, Inner::connect(address, options.inner));
    std::string peer = options.netem.peer_name;
    if constexpr (std::convertible_to<const address_type&, std::string>) {
      if (peer.empty()) peer = address;
    }
    if (!options.netem.access) options.netem.access = netem::process_access_link();
    const bool direct = options.netem.up.perfect() && options.netem.down.perfect() &&
                        options.netem.faults.faults().empty() && !options.netem.access;
    auto core = std::make_unique<typename client_type::Core>(std::move(inner), std::move(options.netem),
                                                             std::move(peer));
    core->direct = direct;
    if (!direct) core->start();
    return client_type(std::move(core));
  }
};

}  // namespace swarm
