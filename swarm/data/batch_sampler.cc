#include "swarm/data/batch_sampler.h"

#include <algorithm>
#include <random>

#include "swarm/core/check.h"
#include "swarm/data/seeded_random.h"

namespace swarm {
namespace {

Status check_sampler_arguments(const std::vector<int32_t>* tokens, int batch_size, int seq_len) {
  if (tokens == nullptr) return invalid_argument("the batch sampler got no token vector");
  if (batch_size < 1) return invalid_argument("batch size {} is not positive", batch_size);
  if (seq_len < 1) return invalid_argument("sequence length {} is not positive", seq_len);
  if (static_cast<int64_t>(tokens->size()) < int64_t{seq_len} + 1) {
    return invalid_argument("{} tokens are too few for one sequence of {} inputs and its targets",
                            tokens->size(), seq_len);
  }
  return Status::ok();
}

}  // namespace

Result<BatchSampler> BatchSampler::create(const std::vector<int32_t>* tokens, int batch_size,
                                          int seq_len, uint64_t seed) {
  SWARM_RETURN_IF_ERROR(check_sampler_arguments(tokens, batch_size, seq_len));
  return BatchSampler(tokens, batch_size, seq_len, seed);
}

BatchSampler::BatchSampler(const std::vector<int32_t>* tokens, int batch_size, int seq_len,
                           uint64_t seed)
    : tokens_(tokens), batch_size_(batch_size), seq_len_(seq_len), seed_(seed) {
  Status valid = check_sampler_arguments(tokens, batch_size, seq_len);
  SWARM_CHECK(valid.is_ok(), "{}", valid.message());
  start_epoch(0);
}

void BatchSampler::start_epoch(int64_t epoch) {
  epoch_ = epoch;
  std::mt19937_64 rng(mix_seed(seed_, static_cast<uint64_t>(epoch)));
  const auto total = static_cast<int64_t>(tokens_->size());
  const int64_t window = int64_t{seq_len_} + 1;
  // A random offset moves the window boundaries between epochs, so a pair of
  // neighbouring tokens split across two windows in one epoch is seen
  // together in another. It stays small enough to leave at least one window.
  const int64_t offset_choices = std::min(window, total - window + 1);
  const auto offset = static_cast<int64_t>(uniform_below(rng, static_cast<uint64_t>(offset_choices)));
  const int64_t count = (total - offset) / window;
  std::vector<int64_t> order = shuffled_indices(count, rng);
  window_starts_.resize(order.size());
  for (size_t i = 0; i < order.size(); ++i) window_starts_[i] = offset + order[i] * window;
  next_window_ = 0;
}

Result<Microbatch> BatchSampler::next() {
  const Shape shape{batch_size_, seq_len_};
  Microbatch batch;
  SWARM_ASSIGN_OR_RETURN(batch.inputs, Tensor::empty(shape, DType::i32));
  SWARM_ASSIGN_OR_RETURN(batch.targets, Tensor::empty(shape, DType::i32));
  next(batch.inputs.data<int32_t>(), batch.targets.data<int32_t>());
  batch.units = shape.numel();
  return batch;
}

void BatchSampler::next(int32_t* inputs, int32_t* targets) {
  const int32_t* stream = tokens_->data();
  for (int row = 0; row < batch_size_; ++row) {
    const int32_t* window = stream + window_starts_[next_window_++];
    std::copy(window, window + seq_len_, inputs + static_cast<int64_t>(row) * seq_len_);
    std::copy(window + 1, window + seq_len_ + 1, targets + static_cast<int64_t>(row) * seq_len_);
    // Eagerly, so that epoch() names the epoch of the next window.
    if (next_window_ == window_starts_.size()) start_epoch(epoch_ + 1);
  }
}

Result<std::vector<TokenWindow>> validation_windows(const std::vector<int32_t>& tokens, int seq_len,
                                                    int max_windows) {
  if (seq_len < 1) return invalid_argument("sequence length {} is not positive", seq_len);
  if (max_windows < 0) return invalid_argument("window cap {} is negative", max_windows);
  const auto total = static_cast<int64_t>(tokens.size());
  if (total < int64_t{seq_len} + 1) {
    return invalid_argument("{} validation tokens are too few for one sequence of {} and its targets",
                            total, seq_len);
  }
  // The last target of window k is the first input of window k + 1.
  int64_t count = (total - 1) / seq_len;
  if (max_windows > 0) count = std::min<int64_t>(count, max_windows);

  std::vector<TokenWindow> windows(static_cast<size_t>(count));
  for (int64_t k = 0; k < count; ++k) {
    auto start = tokens.begin() + k * seq_len;
    windows[k].inputs.assign(start, start + seq_len);
    windows[k].targets.assign(start + 1, start + seq_len + 1);
  }
  return windows;
}

Result<std::vector<Microbatch>> window_microbatches(const std::vector<TokenWindow>& windows, int rows) {
  if (rows < 1) return invalid_argument("{} rows per validation microbatch is not positive", rows);
  std::vector<Microbatch> batches;
  for (size_t begin = 0; begin < windows.size(); begin += static_cast<size_t>(rows)) {
    const size_t count = std::min(static_cast<size_t>(rows), windows.size() - begin);
    const size_t seq = windows[begin].inputs.size();
    const Shape shape{static_cast<int64_t>(count), static_cast<int64_t>(seq)};
    Microbatch batch;
    SWARM_ASSIGN_OR_RETURN(batch.inputs, Tensor::empty(shape, DType::i32));
    SWARM_ASSIGN_OR_RETURN(batch.targets, Tensor::empty(shape, DType::i32));
    for (size_t i = 0; i < count; ++i) {
      const TokenWindow& window = windows[begin + i];
      if (window.inputs.size() != seq || window.targets.size() != seq) {
        return invalid_argument("validation window {} has {} tokens, not {}", begin + i, window.inputs.size(), seq);
      }
      std::copy(window.inputs.begin(), window.inputs.end(), batch.inputs.data<int32_t>() + i * seq);
      std::copy(window.targets.begin(), window.targets.end(), batch.targets.data<int32_t>() + i * seq);
    }
    batch.units = static_cast<int64_t>(count * seq);
    batches.push_back(std::move(batch));
  }
  return batches;
}

}  // namespace swarm
