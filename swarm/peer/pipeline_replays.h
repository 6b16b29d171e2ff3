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
// Bounded: replies (each an input gradient) up to a count and a byte budget,
// each for `keep_seconds`. A retry comes a deadline after its first attempt
// (seconds), so the window must hold that long at the stage's rate: the
// classifier's tiny stages finished some 800 pipelines a second, and with the
// old 64 replies a retry 7 s late found its reply gone, was refused as a
// duplicate by the replica and went to a stage-mate, which counted it again.
// A retry after that window is still computed and refused as a duplicate.
// Keys are the service's: a microbatch id, or its id under its trainer (hop
// chains, stage_service.h).
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

struct PipelineReplayLimits {
  size_t max_replies = 16384;
  size_t max_bytes = size_t{64} << 20;  // of kept input gradients: 256 of a [8, 128, 64] f32 activation
  double keep_seconds = 60;
};

class PipelineReplays {
 public:
  // `now` tells how old a kept reply is (a test passes a fake clock); waiting
  // for a running attempt uses the real one.
  explicit PipelineReplays(PipelineReplayLimits limits = {},
                           std::function<Clock::time_point()> now = [] { return Clock::now(); })
      : limits_(limits),
        keep_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limits.keep_seconds))),
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
      const size_t bytes = reply != nullptr ? size_of(*reply) : 0;
      if (reply != nullptr && limits_.max_replies > 0 && bytes <= limits_.max_bytes) {
        forget(microbatch);
        done_[microbatch] = Done{*reply, now_(), bytes};
        bytes_ += bytes;
        order_.push_back(microbatch);
        while ((done_.size() > limits_.max_replies || bytes_ > limits_.max_bytes) && !order_.empty()) {
          forget(order_.front());
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
    bytes_ = 0;
  }

  int64_t replayed() const {
    std::lock_guard lock(mu_);
    return replayed_;
  }

 private:
  struct Done {
    protocol::StageReply reply;
    Clock::time_point at;
    size_t bytes = 0;
  };

  static size_t size_of(const protocol::StageReply& reply) {
    return (reply.tensor ? reply.tensor->payload.size() : 0) + reply.metrics.size() * sizeof(float) + sizeof(reply);
  }

  // Drops a kept reply (its id may stay in order_, and is skipped there).
  void forget(uint64_t microbatch) {
    auto it = done_.find(microbatch);
    if (it == done_.end()) return;
    bytes_ -= it->second.bytes;
    done_.erase(it);
  }

  void forget_old(Clock::time_point now) {
    while (!order_.empty()) {
      auto it = done_.find(order_.front());
      if (it != done_.end() && now - it->second.at < keep_) break;
      forget(order_.front());
      order_.pop_front();
    }
  }

  const PipelineReplayLimits limits_;
  const Clock::duration keep_;
  const std::function<Clock::time_point()> now_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::set<uint64_t> running_;
  std::map<uint64_t, Done> done_;
  std::deque<uint64_t> order_;
  size_t bytes_ = 0;
  int64_t replayed_ = 0;
};

}  // namespace swarm
