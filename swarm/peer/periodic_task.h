// periodic_task: runs a function every period on its own thread until stopped.
// The peer's announcer is one; stopping wakes it at once rather than after a period.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace swarm {

class PeriodicTask {
 public:
  PeriodicTask() = default;
  PeriodicTask(const PeriodicTask&) = delete;
  PeriodicTask& operator=(const PeriodicTask&) = delete;
  ~PeriodicTask() { stop(); }

  void start(double period_seconds, std::function<void()> tick) {
    thread_ = std::thread([this, period_seconds, tick = std::move(tick)] {
      std::unique_lock lock(mu_);
      while (!stopping_) {
        cv_.wait_for(lock, std::chrono::duration<double>(period_seconds), [&] { return stopping_; });
        if (stopping_) break;
        lock.unlock();
        tick();
        lock.lock();
      }
    });
  }

  void stop() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace swarm
