// forward_batcher: forward requests that arrive together (from several trainers)
// run as one stage call.
//
// Each caller enqueues itself, then takes the replica's lock and runs everything
// queued that stacks with the first (same dtype and trailing dims): a request that
// an earlier caller's batch already ran just collects its result. Only for stages
// without targets: the loss of a stacked batch would mix microbatches.
//
//   ForwardBatcher<Replica<S>> batcher(max_batch, [&] { stats.update(...); });
//   SWARM_ASSIGN_OR_RETURN(Tensor out, batcher.forward(*replica, input));
#pragma once

#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <vector>

#include "swarm/core/status.h"
#include "swarm/core/tensor.h"

namespace swarm {

template <typename ReplicaT>
class ForwardBatcher {
 public:
  ForwardBatcher(int max_batch, std::function<void()> on_stage_call)
      : max_batch_(max_batch), on_stage_call_(std::move(on_stage_call)) {}

  Result<Tensor> forward(ReplicaT& replica, const TensorView& input) {
    Pending me{&input, {}};
    auto result = me.done.get_future();
    {
      std::lock_guard lock(queue_mu_);
      queue_.push_back(&me);
    }
    replica.exclusive([&](auto& stage) {
      std::vector<Pending*> batch = take_batch();
      if (!batch.empty()) run(stage, batch);
      return 0;
    });
    return result.get();
  }

 private:
  struct Pending {
    const TensorView* input;
    std::promise<Result<Tensor>> done;
  };

  static bool stackable(const TensorView& a, const TensorView& b) {
    if (a.dtype() != b.dtype() || a.shape().rank() != b.shape().rank() || a.shape().rank() == 0) return false;
    for (int i = 1; i < a.shape().rank(); ++i) {
      if (a.shape()[i] != b.shape()[i]) return false;
    }
    return true;
  }

  std::vector<Pending*> take_batch() {
    std::lock_guard lock(queue_mu_);
    std::vector<Pending*> batch;
    while (!queue_.empty() && batch.size() < static_cast<size_t>(max_batch_) &&
           (batch.empty() || stackable(*batch[0]->input, *queue_.front()->input))) {
      batch.push_back(queue_.front());
      queue_.pop_front();
    }
    return batch;
  }

  template <typename Stage>
  void run(Stage& stage, const std::vector<Pending*>& batch) {
    on_stage_call_();
    if (batch.size() == 1) {
      batch[0]->done.set_value(stage.forward(*batch[0]->input, nullptr));
      return;
    }
    Result<Tensor> stacked = stack(batch);
    Result<Tensor> output = stacked.is_ok() ? stage.forward(*stacked, nullptr) : Result<Tensor>(stacked.status());
    if (!output.is_ok()) {
      for (auto* p : batch) p->done.set_value(output.status());
      return;
    }
    split(*output, batch);
  }

  static Result<Tensor> stack(const std::vector<Pending*>& batch) {
    const TensorView& first = *batch[0]->input;
    std::vector<int64_t> dims(first.shape().dims().begin(), first.shape().dims().end());
    dims[0] = 0;
    for (auto* p : batch) dims[0] += p->input->shape()[0];
    SWARM_ASSIGN_OR_RETURN(Shape shape, Shape::from_dims(dims));
    SWARM_ASSIGN_OR_RETURN(Tensor stacked, Tensor::empty(shape, first.dtype()));
    size_t offset = 0;
    for (auto* p : batch) {
      std::memcpy(static_cast<char*>(stacked.raw_data()) + offset, p->input->raw_data(), p->input->size_bytes());
      offset += p->input->size_bytes();
    }
    return stacked;
  }

  // The output back to each caller, by rows.
  static void split(const Tensor& output, const std::vector<Pending*>& batch) {
    const int64_t row_bytes = static_cast<int64_t>(output.size_bytes()) / output.shape()[0];
    int64_t row = 0;
    for (auto* p : batch) {
      const int64_t rows = p->input->shape()[0];
      std::vector<int64_t> out_dims(output.shape().dims().begin(), output.shape().dims().end());
      out_dims[0] = rows;
      TensorView slice(static_cast<char*>(output.raw_data()) + row * row_bytes, output.dtype(),
                       *Shape::from_dims(out_dims), output.device());
      p->done.set_value(Tensor::copy_of(slice));
      row += rows;
    }
  }

  const int max_batch_;
  std::function<void()> on_stage_call_;
  std::mutex queue_mu_;
  std::deque<Pending*> queue_;
};

}  // namespace swarm
