// hop_workers: the threads that run the pipelines a peer answered at once. The
// answer ("accepted") leaves before the work is done, so the work needs a thread
// that is not the server's; each holds the microbatch's input from its forward to
// its backward and waits in between for the next stage's outcome. Their number is
// the peer's bound on pipelines in progress: beyond it try_run() says no and the
// peer answers busy, so the sender tries a stage-mate at once.
//
//   HopWorkers workers(64);
//   if (!workers.try_run([=] { run_the_pipeline(); })) return busy();
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <thread>

namespace swarm {

class HopWorkers {
 public:
  explicit HopWorkers(size_t max_running) : max_running_(max_running) {}
  HopWorkers(const HopWorkers&) = delete;
  HopWorkers& operator=(const HopWorkers&) = delete;

  // Waits for the jobs still running: each ends by its pipeline's deadline.
  ~HopWorkers() {
    std::list<Worker> all;
    {
      std::lock_guard lock(mu_);
      all.swap(workers_);
    }
    for (Worker& worker : all) worker.thread.join();
  }

  // Runs `job` on a thread of its own, or returns false when max_running run already.
  bool try_run(std::function<void()> job) {
    std::list<Worker> finished;
    bool started = false;
    {
      std::lock_guard lock(mu_);
      for (auto it = workers_.begin(); it != workers_.end();) {
        auto next = std::next(it);
        if (*it->done) finished.splice(finished.end(), workers_, it);
        it = next;
      }
      if (workers_.size() < max_running_) {
        auto done = std::make_shared<std::atomic<bool>>(false);
        workers_.push_back(Worker{std::thread([job = std::move(job), done] {
                                    job();
                                    done->store(true);
                                  }),
                                  done});
        started = true;
      }
    }
    for (Worker& worker : finished) worker.thread.join();  // outside the lock: they have ended
    return started;
  }

  size_t running() const {
    std::lock_guard lock(mu_);
    size_t count = 0;
    for (const Worker& worker : workers_) count += !*worker.done;
    return count;
  }

 private:
  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };

  const size_t max_running_;
  mutable std::mutex mu_;
  std::list<Worker> workers_;
};

}  // namespace swarm
