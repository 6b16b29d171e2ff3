#include "swarm/data/split.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include <doctest/doctest.h>

namespace swarm {
namespace {

// Token i has id i, so every token tells where in the stream it came from.
TokenDataset counting_dataset(int64_t count) {
  TokenDataset dataset{.tokens = std::vector<int32_t>(static_cast<size_t>(count)),
                       .vocab_size = static_cast<int>(count),
                       .source = "counting"};
  std::iota(dataset.tokens.begin(), dataset.tokens.end(), 0);
  return dataset;
}

std::set<int32_t> blocks_of(const std::vector<int32_t>& tokens, int64_t block_tokens) {
  std::set<int32_t> blocks;
  for (int32_t token : tokens) blocks.insert(static_cast<int32_t>(token / block_tokens));
  return blocks;
}

TEST_CASE("the split is disjoint, covers every block and keeps stream order") {
  const int64_t block_tokens = 16;
  TokenDataset dataset = counting_dataset(100 * block_tokens + 5);  // 100 blocks and a short tail
  auto split = split_train_validation(dataset, 0.1, block_tokens, 7);
  REQUIRE(split.is_ok());

  CHECK(split->validation.size() == 10 * block_tokens);
  CHECK(split->train.size() + split->validation.size() == dataset.tokens.size());
  CHECK(std::is_sorted(split->train.begin(), split->train.end()));
  CHECK(std::is_sorted(split->validation.begin(), split->validation.end()));

  std::set<int32_t> train_blocks = blocks_of(split->train, block_tokens);
  std::set<int32_t> validation_blocks = blocks_of(split->validation, block_tokens);
  CHECK(validation_blocks.size() == 10);
  for (int32_t block : validation_blocks) CHECK(train_blocks.count(block) == 0);
  CHECK(train_blocks.size() + validation_blocks.size() == 101);  // the tail counts as block 100
  CHECK(train_blocks.count(100) == 1);
  // Held-out blocks are whole: each contributes exactly block_tokens tokens.
  for (size_t i = 0; i < split->validation.size(); i += block_tokens) {
    CHECK(split->validation[i] % block_tokens == 0);
    CHECK(split->validation[i + block_tokens - 1] == split->validation[i] + block_tokens - 1);
  }
}

TEST_CASE("the split is reproducible by seed and spread over the stream") {
  TokenDataset dataset = counting_dataset(200 * 8);
  auto first = split_train_validation(dataset, 0.25, 8, 123);
  auto again = split_train_validation(dataset, 0.25, 8, 123);
  auto other = split_train_validation(dataset, 0.25, 8, 124);
  REQUIRE(first.is_ok());
  REQUIRE(again.is_ok());
  REQUIRE(other.is_ok());
  CHECK(first->validation == again->validation);
  CHECK(first->train == again->train);
  CHECK(first->validation != other->validation);

  // Not simply the end of the stream: held-out blocks come from both halves.
  std::set<int32_t> blocks = blocks_of(first->validation, 8);
  CHECK(*blocks.begin() < 100);
  CHECK(*blocks.rbegin() >= 100);
}

TEST_CASE("a tiny fraction still holds out one block and a large one leaves one for training") {
  TokenDataset dataset = counting_dataset(10 * 4);
  auto tiny = split_train_validation(dataset, 0.001, 4, 1);
  REQUIRE(tiny.is_ok());
  CHECK(tiny->validation.size() == 4);
  auto huge = split_train_validation(dataset, 0.999, 4, 1);
  REQUIRE(huge.is_ok());
  CHECK(huge->train.size() == 4);
  CHECK(huge->validation.size() == 36);
}

TEST_CASE("the split rejects bad arguments and too little data") {
  TokenDataset dataset = counting_dataset(100);
  CHECK(split_train_validation(dataset, 0.0, 10, 1).status().code() == StatusCode::invalid_argument);
  CHECK(split_train_validation(dataset, 1.0, 10, 1).status().code() == StatusCode::invalid_argument);
  CHECK(split_train_validation(dataset, std::nan(""), 10, 1).status().code() ==
        StatusCode::invalid_argument);
  CHECK(split_train_validation(dataset, 0.1, 0, 1).status().code() == StatusCode::invalid_argument);
  auto too_few = split_train_validation(dataset, 0.1, 51, 1);
  CHECK(too_few.status().code() == StatusCode::invalid_argument);
  CHECK(too_few.status().message().find("counting") != std::string::npos);
  CHECK(split_train_validation(dataset, 0.1, 50, 1).is_ok());
}

}  // namespace
}  // namespace swarm
