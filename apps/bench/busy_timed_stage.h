// busy_timed_stage: a Stage adapter that adds up the wall time its inner stage
// spends in forward and backward, the "busy" half of compute utilization.
//
// The total lives behind a shared pointer because the Replica owns (and moves)
// the stage, while the experiment reads the total from outside.
//
//   auto busy = std::make_shared<std::atomic<int64_t>>(0);
//   BusyTimedStage<GptStage<CpuBackend>> timed(std::move(stage), busy);
//   // ... serve it; *busy is the nanoseconds spent computing so far
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <utility>
#include <vector>

#include "swarm/api/stage.h"

namespace swarm::apps {

template <Stage S>
class BusyTimedStage {
 public:
  using stage_concept = stage_t;

  BusyTimedStage(S inner, std::shared_ptr<std::atomic<int64_t>> busy_ns)
      : inner_(std::move(inner)), busy_ns_(std::move(busy_ns)) {}

  Result<Tensor> forward(const TensorView& input, const TensorView* targets) {
    return timed([&] { return inner_.forward(input, targets); });
  }
  Result<Tensor> backward(const TensorView& input, const TensorView& grad_output, const TensorView* targets) {
    return timed([&] { return inner_.backward(input, grad_output, targets); });
  }
  std::vector<StageParameterView> parameter_views() { return inner_.parameter_views(); }
  Status zero_grad() { return inner_.zero_grad(); }
  bool takes_targets() const { return inner_.takes_targets(); }
  StageIoSpec io_spec() const { return inner_.io_spec(); }

 private:
  template <typename F>
  Result<Tensor> timed(F&& f) {
    const auto start = std::chrono::steady_clock::now();
    Result<Tensor> out = f();
    busy_ns_->fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
                            .count(),
                        std::memory_order_relaxed);
    return out;
  }

  S inner_;
  std::shared_ptr<std::atomic<int64_t>> busy_ns_;
};

}  // namespace swarm::apps
