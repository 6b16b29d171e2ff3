// hostile_member: a member of a secured swarm that turns on it, as the process-level
// attack tests (the hostile rounds tests, through
// hostile_rounds_fixture.h) play it: it joins with the swarm's secret and its own
// identity, finds the peers in the registry, calls them and announces records as any
// member may; and the tools its attack threads share (a tally of replies, a count to
// wait on, a repeating announcer).
//
//   Attacker attacker = Attacker::join(bootstrap_port, secret);
//   auto peers = attacker.find_peers(/*stages=*/2);
//   const Reply reply = reply_of(attacker.call(peer.control, std::move(frames)));
//   protocol::RefusalCounts counted = refusals_of(attacker, peer);  // its info reply's counters
#pragma once

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <doctest/doctest.h>

#include "swarm/averaging/averaging_messages.h"
#include "swarm/averaging/progress.h"
#include "swarm/averaging/round_messages.h"
#include "swarm/protocol/client_cache.h"
#include "swarm/protocol/records.h"
#include "swarm/protocol/stage_protocol.h"
#include "swarm/registry/dht_registry.h"
#include "swarm/security/certificate.h"
#include "swarm/security/identity.h"
#include "swarm/security/record_seal.h"
#include "transports/zmq/zmq_transport.h"

namespace swarm::hostile {

using namespace std::chrono_literals;

struct LivePeer {
  std::string id;
  int stage = 0;
  std::string compute;  // trainers' requests and info
  std::string control;  // round messages and state requests
};

// The attacker: a member with its own identity ("mallory.<fingerprint>"), its own DHT
// node, CURVE clients. (In hostile_rounds_fixture's clean run it only watches.)
struct Attacker {
  security::SwarmCredentials credentials;
  std::string id;
  DhtRegistry registry;
  ClientCache<ZmqTransport> clients;

  // A member with a fresh identity; or, where the swarm has an owner, with the
  // identity and certificate of `membership` (certificate.h).
  static Attacker join(uint16_t bootstrap_port, const std::string& secret,
                       const std::optional<security::Membership>& membership = std::nullopt) {
    auto credentials = membership ? security::join_swarm_as(secret, *membership, security::wall_clock_seconds())
                                  : security::join_swarm(secret);
    REQUIRE(credentials.is_ok());
    auto id = security::peer_id_bound_to("mallory", credentials->self);
    REQUIRE(id.is_ok());
    DhtRegistryOptions options;
    options.sealer = security::make_record_sealer(*credentials);
    options.per_address_rate_limit = false;
    auto registry = DhtRegistry::start(0, {fmt::format("127.0.0.1:{}", bootstrap_port)}, options);
    REQUIRE(registry.is_ok());
    ClientOptions client;
    client.security = credentials->client_options();
    return Attacker{*credentials, *id, std::move(registry).value(), ClientCache<ZmqTransport>(client)};
  }

  Result<wire::Frames> call(const std::string& address, wire::Frames frames) {
    auto client = clients.get(address);
    if (client == nullptr) return unavailable("cannot connect to {}", address);
    return client->call(std::move(frames), Clock::now() + 5s).get();
  }

  Status announce(const std::string& key, const std::string& value, double ttl_seconds) {
    return registry.announce(key, id, value, registry.now() + ttl_seconds);
  }

  // Per peer id: where it serves, from the stage and progress records.
  std::map<std::string, LivePeer> find_peers(int stages) {
    std::map<std::string, LivePeer> peers;
    for (int s = 0; s < stages; ++s) {
      if (auto records = registry.get(stage_registry_key(s)); records.is_ok()) {
        for (const auto& r : *records) {
          auto a = PeerAnnouncementRecord::from_json(r.value);
          if (a.is_ok() && a->peer_id != id) peers[a->peer_id] = {a->peer_id, s, a->address, peers[a->peer_id].control};
        }
      }
      if (auto records = registry.get(progress_registry_key(s)); records.is_ok()) {
        for (const auto& r : *records) {
          auto p = ProgressRecord::from_json(r.value);
          if (p.is_ok() && p->peer_id != id) peers[p->peer_id].control = p->address;
        }
      }
    }
    std::erase_if(peers, [](const auto& e) { return e.second.compute.empty() || e.second.control.empty(); });
    return peers;
  }

  // The newest progress record of each of `ids` in `stage`'s key, as the registry shows it now.
  std::map<std::string, ProgressRecord> progress_of(int stage, const std::set<std::string>& ids) {
    std::map<std::string, ProgressRecord> out;
    auto records = registry.get(progress_registry_key(stage));
    if (!records.is_ok()) return out;
    for (const auto& r : *records) {
      auto p = ProgressRecord::from_json(r.value);
      if (!p.is_ok() || !ids.count(p->peer_id)) continue;
      auto it = out.find(p->peer_id);
      if (it == out.end() || p->published_at > it->second.published_at) out[p->peer_id] = std::move(p).value();
    }
    return out;
  }
};

inline wire::Frames must(Result<wire::Frames> frames) {
  REQUIRE_MESSAGE(frames.is_ok(), frames.status().to_string());
  return std::move(frames).value();
}

// A reply: whether one came, whether it is an error, and its text.
struct Reply {
  bool answered = false;
  bool error = false;
  std::string text;
};
inline Reply reply_of(const Result<wire::Frames>& reply) {
  if (!reply.is_ok()) return {false, false, reply.status().to_string()};
  auto decoded = wire::decode_message(reply->views(), wire::Limits{});
  if (!decoded.is_ok()) return {true, false, "undecodable reply: " + decoded.status().to_string()};
  if (decoded->header.kind != wire::MessageKind::error) return {true, false, "an ok reply"};
  const Status status = wire::status_from_error_reply(decoded->header);
  return {true, true, status.to_string()};
}

// A peer's info reply, as any member may ask for it.
inline protocol::PeerInfo info_of(Attacker& attacker, const LivePeer& peer) {
  auto reply = attacker.call(peer.compute, must(protocol::encode_info_request(peer.stage, attacker.credentials.certificate)));
  REQUIRE_MESSAGE(reply.is_ok(), reply.status().to_string());
  auto info = protocol::parse_peer_info(*reply, wire::Limits{});
  REQUIRE_MESSAGE(info.is_ok(), info.status().to_string());
  return std::move(info).value();
}

inline protocol::RefusalCounts refusals_of(Attacker& attacker, const LivePeer& peer) {
  return info_of(attacker, peer).refusals;
}

// A peer's stage spec, from its info reply.
inline protocol::StageSpec spec_of(Attacker& attacker, const LivePeer& peer) { return info_of(attacker, peer).spec; }

// What a loss stage's input looks like from a trainer: `rows` sequences of
// `seq_len` activations `width` wide, in [-1, 1), and their targets (all 'e').
struct LossStageBatch {
  Tensor hidden;
  Tensor targets;
};
inline LossStageBatch loss_stage_batch(int64_t rows, int64_t seq_len, int64_t width) {
  LossStageBatch batch{*Tensor::empty(Shape{rows, seq_len, width}, DType::f32),
                       *Tensor::zeros(Shape{rows, seq_len}, DType::i32)};
  float v = 0.25f;
  for (float& x : batch.hidden.span<float>()) x = (v = std::fmod(v * 1.7f + 0.3f, 2.0f) - 1.0f);
  for (int32_t& t : batch.targets.span<int32_t>()) t = 'e';
  return batch;
}

// The attacker's own server, the address in its records and JOINs: counts what it
// is asked, by wire kind, and answers every request with an error, or (a black
// hole that acknowledges) with an empty ok.
struct MalloryServer {
  std::optional<ZmqServer> server;
  std::atomic<int64_t> served{0};
  std::mutex mu;
  std::map<std::string, int64_t> by_what;  // a round message's op, or the wire kind

  MalloryServer(const security::SwarmCredentials& credentials, bool answer_ok) {
    ServerOptions options;
    options.security = credentials.server_options();
    auto bound = ZmqTransport::bind("tcp://127.0.0.1:*", options);
    REQUIRE(bound.is_ok());
    server.emplace(std::move(bound).value());
    REQUIRE(server->serve([this, answer_ok](const PeerIdentity&, wire::Frames request) {
                    ++served;
                    auto decoded = wire::decode_message(request.views(), wire::Limits{});
                    wire::MessageHeader header;
                    std::string what = "undecodable";
                    if (decoded.is_ok()) {
                      header = decoded->header;
                      what = fmt::format("kind {}", static_cast<int>(header.kind));
                      auto meta = control_json(*decoded);
                      if (header.kind == wire::MessageKind::allreduce_part && meta.is_ok() && meta->contains("op") &&
                          (*meta)["op"].is_string()) {
                        what = (*meta)["op"].get<std::string>();
                      }
                    }
                    {
                      std::lock_guard lock(mu);
                      ++by_what[what];
                    }
                    if (!answer_ok) {
                      return wire::make_error_reply(header.request_id, header.stage,
                                                    failed_precondition("mallory serves nothing"));
                    }
                    wire::MessageHeader reply;
                    reply.kind = wire::MessageKind::result;
                    reply.stage = header.stage;
                    reply.request_id = header.request_id;
                    return wire::Frames{{wire::serialize_header(reply)}};
                  })
                .is_ok());
  }
  std::string asked() {
    std::lock_guard lock(mu);
    std::string out;
    for (const auto& [what, n] : by_what) out += fmt::format(" {}: {}", what, n);
    return out.empty() ? " nothing" : out;
  }
};

// How an attacker thread's traffic went, by what it sent.
struct Tally {
  int64_t sent = 0, refused = 0, accepted = 0, unanswered = 0, unencodable = 0;
  std::string last_refusal, last_other;

  // One message sent and how it was answered.
  void count(const Reply& reply) {
    ++sent;
    (reply.error ? refused : reply.answered ? accepted : unanswered) += 1;
    (reply.error ? last_refusal : last_other) = reply.text;
  }
};

// A count an attacker thread raises and the test waits on, with a deadline: "the
// attack has landed" is that the peers have answered so many of its messages.
class Counter {
 public:
  void add() {
    {
      std::lock_guard lock(mu_);
      ++n_;
    }
    cv_.notify_all();
  }
  bool wait_for_at_least(int64_t n, std::chrono::milliseconds within) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, within, [&] { return n_ >= n; });
  }
  int64_t value() {
    std::lock_guard lock(mu_);
    return n_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t n_ = 0;
};

// What the attacker knows of the stage (from its records): the step, the leader.
struct StageNow {
  int64_t step = 0;
  uint64_t hash = 0;
  std::string leader;
};

}  // namespace swarm::hostile
