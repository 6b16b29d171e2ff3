// batch_sampler: seeded training batches and in-order validation windows from a token stream.
//
// Each epoch picks a random start offset, cuts the stream into non-overlapping
// windows of seq_len + 1 tokens and visits them in a seeded random order; the
// next epoch does the same with a seed derived from the run seed and the epoch.
// The same seed gives the same batches on any machine and standard library.
//
//   SWARM_ASSIGN_OR_RETURN(auto sampler, swarm::BatchSampler::create(&split.train, 8, 256, seed));
//   std::vector<int32_t> inputs(8 * 256), targets(8 * 256);
//   sampler.next(inputs.data(), targets.data());   // targets[i] is the token after inputs[i]
#pragma once

#include <cstdint>
#include <vector>

#include "swarm/api/data_source.h"
#include "swarm/core/status.h"

namespace swarm {

// A DataSource of token batches: i32 [batch_size, seq_len] inputs and targets.
class BatchSampler {
 public:
  using data_source_concept = data_source_t;

  // Checks what the constructor assumes. Errors (invalid_argument): null
  // tokens, batch_size or seq_len below 1, fewer than seq_len + 1 tokens.
  static Result<BatchSampler> create(const std::vector<int32_t>* tokens, int batch_size,
                                     int seq_len, uint64_t seed);

  // For arguments already known to be valid; invalid ones fail a SWARM_CHECK.
  // `tokens` is not copied: it must outlive the sampler and keep its size.
  BatchSampler(const std::vector<int32_t>* tokens, int batch_size, int seq_len, uint64_t seed);

  // Fills batch_size * seq_len row-major tokens into each array. A batch may
  // span the end of one epoch and the start of the next.
  void next(int32_t* inputs, int32_t* targets);
  // The same as tensors; `units` counts the batch's tokens.
  Result<Microbatch> next();

  int batch_size() const { return batch_size_; }
  int seq_len() const { return seq_len_; }
  // The epoch the next window comes from, counting from 0.
  int64_t epoch() const { return epoch_; }
  // How many windows the current epoch has (it depends on the epoch's offset).
  int64_t windows_in_epoch() const { return static_cast<int64_t>(window_starts_.size()); }

 private:
  void start_epoch(int64_t epoch);

  const std::vector<int32_t>* tokens_;
  int batch_size_;
  int seq_len_;
  uint64_t seed_;
  int64_t epoch_ = 0;
  std::vector<int64_t> window_starts_;  // this epoch's windows, in visiting order
  size_t next_window_ = 0;
};

// One evaluation sequence: targets[i] is the token after inputs[i].
struct TokenWindow {
  std::vector<int32_t> inputs;
  std::vector<int32_t> targets;
};

// Validation windows in stream order, always the same, so that validation
// losses of different runs and steps compare. Window k's inputs start at
// k * seq_len, so inputs never overlap and every token after the first is a
// target exactly once. max_windows caps the count (0: as many as fit).
// Errors (invalid_argument): seq_len < 1, max_windows < 0, fewer than
// seq_len + 1 tokens.
Result<std::vector<TokenWindow>> validation_windows(const std::vector<int32_t>& tokens, int seq_len,
                                                    int max_windows);

// The windows as microbatches of up to `rows` windows each, in order, counting
// tokens: what a validation over any data source (validate_until) takes.
// Errors (invalid_argument): rows < 1, windows of different lengths.
Result<std::vector<Microbatch>> window_microbatches(const std::vector<TokenWindow>& windows, int rows);

static_assert(DataSource<BatchSampler>);

}  // namespace swarm
