// pipeline_replays: the replies of the pipelines a peer finished, kept a while
// by microbatch id, so that a retry gets the same reply instead of a second
// accumulation here.
//
// Peer to peer, a stage's peer can finish a microbatch (its gradients
// accumulated) and the path can still break upstream: a stage-0 peer dies
// before its own backward. The trainer retries the microbatch under the same
// id through another stage-0 peer, whose hop comes back here (the hops choose
// by the microbatch's id, so a retry takes the path the first attempt took
// wherever its peers live). This peer answers it with the reply it sent the
// first time. A retry that arrives while the first attempt still runs here
// waits for it.
//
// Bounded: at most `capacity` replies (each an input gradient), each for
// `keep_seconds`; a retry after that is computed and refused as a duplicate by
// the replica. Keys are microbatch ids alone: a member that learned an id could
// claim it first (the signed hop chains of swarm/security/hop_chain.h are to
// close that).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "swarm/core/clock.h"
#include "swarm/protocol/stage_protocol.h"

namespace swarm {

class PipelineReplays {
 public:
  // `now` tells how old a kept reply is (a test passes a fake clock); waiting
  // for a running attempt uses the real one.
  explicit PipelineReplays(size_t capacity = 64, double keep_seconds = 60,
                           std::function<Clock::time_point()> now = [] { return Clock::now(); })
      : capacity_(capacity),
        keep_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(keep_seconds))),
        now_(std::move(now)) {}

  enum class Claim { run, replay, gave_up };
  struct Claimed {
    Claim claim = Claim::run;
    protocol::StageReply reply;  // replay only
  };

  // run: this request computes it and must call finish(); replay: the reply sent
  // before; gave_up: another request for it was still running at `wait_until`.
  Claimed claim(uint64_t microbatch, Deadline wait_until) {
    std::unique_lock lock(mu_);
    while (true) {
      forget_old(now_());
      if (auto it = done_.find(microbatch); it != done_.end()) {
        ++replayed_;
        return {Claim::replay, it->second.reply};
      }
      if (running_.insert(microbatch).second) return {Claim::run, {}};
      if (cv_.wait_until(lock, wait_until) == std::cv_status::timeout && Clock::now() >= wait_until) {
        return {Claim::gave_up, {}};
      }
    }
  }

  // The claimed request ended; `reply` is what it sent (none when it failed, and
  // the next retry computes it again).
  void finish(uint64_t microbatch, const protocol::StageReply* reply) {
    {
      std::lock_guard lock(mu_);
      running_.erase(microbatch);
      if (reply != nullptr && capacity_ > 0) {
        done_[microbatch] = Done{*reply, now_()};
        order_.push_back(microbatch);
        while (done_.size() > capacity_ && !order_.empty()) {
          done_.erase(order_.front());
          order_.pop_front();
        }
      }
    }
    cv_.notify_all();
  }

  // Replies of another stage answer nothing here (a peer that moved).
  void clear() {
    std::lock_guard lock(mu_);
    done_.clear();
    order_.clear();
  }

  int64_t replayed() const {
    std::lock_guard lock(mu_);
    return replayed_;
  }

 private:
  struct Done {
    protocol::StageReply reply;
    Clock::time_point at;
  };

  void forget_old(Clock::time_point now) {
    while (!order_.empty()) {
      auto it = done_.find(order_.front());
      if (it != done_.end() && now - it->second.at < keep_) break;
      if (it != done_.end()) done_.erase(it);
      order_.pop_front();
    }
  }

  const size_t capacity_;
  const Clock::duration keep_;
  const std::function<Clock::time_point()> now_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::set<uint64_t> running_;
  std::map<uint64_t, Done> done_;
  std::deque<uint64_t> order_;
  int64_t replayed_ = 0;
};

}  // namespace swarm
