#include "swarm/data/split.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "swarm/data/seeded_random.h"

namespace swarm {

Result<DataSplit> split_train_validation(const TokenDataset& dataset, double validation_fraction,
                                         int64_t block_tokens, uint64_t seed) {
  // Written as a negation so that NaN is rejected too.
  if (!(validation_fraction > 0.0 && validation_fraction < 1.0)) {
    return invalid_argument("validation fraction {} is not between 0 and 1", validation_fraction);
  }
  if (block_tokens < 1) return invalid_argument("block size {} is not positive", block_tokens);
  const auto total_tokens = static_cast<int64_t>(dataset.tokens.size());
  const int64_t full_blocks = total_tokens / block_tokens;
  if (full_blocks < 2) {
    return invalid_argument(
        "{}: {} tokens are too few to split: need at least 2 blocks of {} tokens", dataset.source,
        total_tokens, block_tokens);
  }
  const int64_t validation_blocks = std::clamp<int64_t>(
      std::llround(validation_fraction * static_cast<double>(full_blocks)), 1, full_blocks - 1);

  std::mt19937_64 rng(seed);
  std::vector<int64_t> order = shuffled_indices(full_blocks, rng);
  std::vector<bool> is_validation(static_cast<size_t>(full_blocks), false);
  for (int64_t i = 0; i < validation_blocks; ++i) is_validation[order[i]] = true;

  DataSplit split;
  const int64_t validation_tokens = validation_blocks * block_tokens;
  split.validation.reserve(static_cast<size_t>(validation_tokens));
  split.train.reserve(static_cast<size_t>(total_tokens - validation_tokens));
  const auto first = dataset.tokens.begin();
  for (int64_t block = 0; block < full_blocks; ++block) {
    auto& side = is_validation[block] ? split.validation : split.train;
    side.insert(side.end(), first + block * block_tokens, first + (block + 1) * block_tokens);
  }
  split.train.insert(split.train.end(), first + full_blocks * block_tokens, dataset.tokens.end());
  return split;
}

}  // namespace swarm
