// hop_returns: where a peer's own trainer waits for the outcomes of the pipelines
// it passed on, when hops are answered at once (docs/ARCHITECTURE.md, "Peer to
// peer"). The next stage's peer answers the pipeline request with "accepted" and
// later sends the outcome as a pipeline_result request of its own; the peer that
// receives it delivers it here, to the pipeline that waits for it.
//
// Each pipeline passed on gets a token (the request's return_id) before it
// leaves; only the peer it went to may deliver its outcome, once, for its
// microbatch. Anything else is refused and counted: a token nobody waits for
// (late, forged or repeated) or the right token from another peer or for another
// microbatch. An entry exists only from expect() to wait() or forget(), so what
// arrives from outside never grows the table.
//
//   HopReturns returns;
//   uint64_t token = returns.expect(microbatch, "s1p0");
//   ... send the pipeline with return_id = token; the peer answers "accepted" ...
//   Result<protocol::StageReply> outcome = returns.wait(token, deadline);  // deliver() from the server
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>

#include "swarm/core/clock.h"
#include "swarm/core/status.h"
#include "swarm/protocol/pipeline_result.h"

namespace swarm {

struct HopReturnCounts {
  int64_t delivered = 0;
  int64_t unknown = 0;       // no pipeline waits under that token (late, forged or a second one)
  int64_t wrong_sender = 0;  // the token's pipeline went to another peer, or was another microbatch
};

class HopReturns {
 public:
  HopReturns() : tokens_(std::random_device{}() ^ (static_cast<uint64_t>(std::random_device{}()) << 32)) {}

  // Before the pipeline is sent to `successor`: the token it carries as return_id.
  uint64_t expect(uint64_t microbatch, std::string successor) {
    std::lock_guard lock(mu_);
    uint64_t token = 0;
    while (token == 0 || waiting_.count(token)) token = tokens_();
    waiting_.emplace(token, Entry{microbatch, std::move(successor), std::nullopt});
    return token;
  }

  // A pipeline_result from outside: ok, or why it is refused (permission_denied
  // for the wrong sender or microbatch, not_found for an unknown token).
  Status deliver(protocol::PipelineResult result) {
    std::lock_guard lock(mu_);
    auto it = waiting_.find(result.return_id);
    if (it == waiting_.end() || it->second.outcome.has_value()) {
      ++counts_.unknown;
      return not_found("no pipeline waits for return id {}", result.return_id);
    }
    if (it->second.successor != result.from_peer || it->second.microbatch != result.microbatch_id) {
      ++counts_.wrong_sender;
      return permission_denied("return id {} is not for microbatch {} from peer {}", result.return_id,
                               result.microbatch_id, result.from_peer);
    }
    it->second.outcome = std::move(result.outcome);
    ++counts_.delivered;
    arrived_.notify_all();
    return Status::ok();
  }

  // The outcome, or deadline_exceeded when none came by `until`, or unavailable
  // once closed. Either way the token is spent.
  Result<protocol::StageReply> wait(uint64_t token, Deadline until) {
    std::unique_lock lock(mu_);
    arrived_.wait_until(lock, until, [&] {
      auto it = waiting_.find(token);
      return closed_ || it == waiting_.end() || it->second.outcome.has_value();
    });
    auto it = waiting_.find(token);
    if (it == waiting_.end()) return internal("return id {} was never expected", token);
    std::optional<Result<protocol::StageReply>> outcome = std::move(it->second.outcome);
    waiting_.erase(it);
    if (outcome) return std::move(*outcome);
    if (closed_) return unavailable("this peer is stopping");
    return deadline_exceeded("the peer that accepted the pipeline sent no outcome in time");
  }

  // The pipeline was refused or never reached its peer: nothing will come.
  void forget(uint64_t token) {
    std::lock_guard lock(mu_);
    waiting_.erase(token);
  }

  // Wakes every wait(): the peer stops.
  void close() {
    std::lock_guard lock(mu_);
    closed_ = true;
    arrived_.notify_all();
  }

  size_t waiting() const {
    std::lock_guard lock(mu_);
    return waiting_.size();
  }
  HopReturnCounts counts() const {
    std::lock_guard lock(mu_);
    return counts_;
  }

 private:
  struct Entry {
    uint64_t microbatch;
    std::string successor;
    std::optional<Result<protocol::StageReply>> outcome;
  };

  mutable std::mutex mu_;
  std::condition_variable arrived_;
  std::mt19937_64 tokens_;
  std::map<uint64_t, Entry> waiting_;
  HopReturnCounts counts_;
  bool closed_ = false;
};

}  // namespace swarm
