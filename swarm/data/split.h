// split: a seeded train/validation split by blocks, so both sides see the same kind of text.
//
// Taking the last 10% of a corpus as validation would make it a different
// distribution (fortunes' files are topical and read in name order). Instead
// the stream is cut into blocks and a seeded random subset of blocks is held out.
//
//   SWARM_ASSIGN_OR_RETURN(swarm::DataSplit split,
//                          swarm::split_train_validation(corpus, 0.1, 4096, seed));
//   auto sampler = swarm::BatchSampler::create(&split.train, 8, 256, seed);
#pragma once

#include <cstdint>
#include <vector>

#include "swarm/core/status.h"
#include "swarm/data/token_dataset.h"

namespace swarm {

struct DataSplit {
  std::vector<int32_t> train;
  std::vector<int32_t> validation;
};

// Cuts `dataset.tokens` into blocks of `block_tokens` and holds out
// round(validation_fraction * blocks) of them (at least 1, leaving at least 1
// for training), chosen by a seeded shuffle of the block indices. Both sides
// keep their blocks in the original order. A short tail past the last full
// block always goes to train, so every validation block has full length.
// Block boundaries become seams in the concatenated streams, so pick
// block_tokens well above the sequence length.
// Errors (invalid_argument): fraction outside (0, 1), block_tokens < 1, fewer
// than two full blocks.
Result<DataSplit> split_train_validation(const TokenDataset& dataset, double validation_fraction,
                                         int64_t block_tokens, uint64_t seed);

}  // namespace swarm
