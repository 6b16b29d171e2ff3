#include "swarm/data/batch_sampler.h"

#include <numeric>
#include <set>

#include <doctest/doctest.h>

namespace swarm {
namespace {

// Token i has id i, so a window's first input tells where it starts.
std::vector<int32_t> counting_tokens(int count) {
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  std::iota(tokens.begin(), tokens.end(), 0);
  return tokens;
}

struct Batch {
  std::vector<int32_t> inputs;
  std::vector<int32_t> targets;
};

Batch next_batch(BatchSampler& sampler) {
  const size_t size = static_cast<size_t>(sampler.batch_size()) * sampler.seq_len();
  Batch batch{std::vector<int32_t>(size, -1), std::vector<int32_t>(size, -1)};
  sampler.next(batch.inputs.data(), batch.targets.data());
  return batch;
}

std::vector<Batch> batches(const std::vector<int32_t>& tokens, uint64_t seed, int count) {
  BatchSampler sampler(&tokens, 4, 8, seed);
  std::vector<Batch> result;
  for (int i = 0; i < count; ++i) result.push_back(next_batch(sampler));
  return result;
}

bool same_batches(const std::vector<Batch>& a, const std::vector<Batch>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].inputs != b[i].inputs || a[i].targets != b[i].targets) return false;
  }
  return true;
}

TEST_CASE("targets are the inputs shifted by one token, row by row") {
  std::vector<int32_t> tokens = counting_tokens(1000);
  auto sampler = BatchSampler::create(&tokens, 3, 16, 11);
  REQUIRE(sampler.is_ok());
  for (int step = 0; step < 30; ++step) {
    Batch batch = next_batch(*sampler);
    for (int row = 0; row < 3; ++row) {
      const int32_t first = batch.inputs[row * 16];
      for (int i = 0; i < 16; ++i) {
        REQUIRE(batch.inputs[row * 16 + i] == first + i);  // a contiguous stretch of the stream
        REQUIRE(batch.targets[row * 16 + i] == first + i + 1);
      }
    }
  }
}

TEST_CASE("the same seed gives the same batches and another seed different ones") {
  std::vector<int32_t> tokens = counting_tokens(500);
  // 30 batches of 4 windows of 9 tokens pass several epochs of about 55 windows.
  std::vector<Batch> first = batches(tokens, 2024, 30);
  CHECK(same_batches(first, batches(tokens, 2024, 30)));
  CHECK_FALSE(same_batches(first, batches(tokens, 2025, 30)));
}

TEST_CASE("an epoch visits non-overlapping windows once each, then reshuffles") {
  std::vector<int32_t> tokens = counting_tokens(2000);
  BatchSampler sampler(&tokens, 1, 9, 99);  // windows of 10 tokens
  std::vector<std::vector<int32_t>> epoch_starts;
  for (int epoch = 0; epoch < 3; ++epoch) {
    REQUIRE(sampler.epoch() == epoch);
    const int64_t windows = sampler.windows_in_epoch();
    CHECK(windows >= 199);  // 2000 tokens, minus an offset below 10
    std::vector<int32_t> starts;
    for (int64_t i = 0; i < windows; ++i) starts.push_back(next_batch(sampler).inputs[0]);
    std::set<int32_t> distinct(starts.begin(), starts.end());
    CHECK(distinct.size() == starts.size());
    // All windows share the epoch's offset, so none overlaps another.
    const int32_t offset = *distinct.begin();
    CHECK(offset < 10);
    for (int32_t start : distinct) CHECK((start - offset) % 10 == 0);
    CHECK(*distinct.rbegin() + 10 <= 2000);
    epoch_starts.push_back(starts);
  }
  CHECK(sampler.epoch() == 3);
  CHECK(epoch_starts[0] != epoch_starts[1]);
  CHECK(epoch_starts[1] != epoch_starts[2]);
}

TEST_CASE("a stream of exactly one window is served every time") {
  std::vector<int32_t> tokens = counting_tokens(6);
  auto sampler = BatchSampler::create(&tokens, 2, 5, 3);
  REQUIRE(sampler.is_ok());
  Batch batch = next_batch(*sampler);
  CHECK(batch.inputs == std::vector<int32_t>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4});
  CHECK(batch.targets == std::vector<int32_t>{1, 2, 3, 4, 5, 1, 2, 3, 4, 5});
}

TEST_CASE("BatchSampler::create rejects what the sampler cannot serve") {
  std::vector<int32_t> tokens = counting_tokens(10);
  auto too_short = BatchSampler::create(&tokens, 1, 10, 0);
  CHECK(too_short.status().code() == StatusCode::invalid_argument);
  CHECK(too_short.status().message().find("10 tokens") != std::string::npos);
  CHECK(BatchSampler::create(&tokens, 1, 9, 0).is_ok());
  CHECK(BatchSampler::create(nullptr, 1, 4, 0).status().code() == StatusCode::invalid_argument);
  CHECK(BatchSampler::create(&tokens, 0, 4, 0).status().code() == StatusCode::invalid_argument);
  CHECK(BatchSampler::create(&tokens, 1, 0, 0).status().code() == StatusCode::invalid_argument);
}

TEST_CASE("validation windows walk the stream in order and score each token once") {
  std::vector<int32_t> tokens = counting_tokens(35);
  auto windows = validation_windows(tokens, 8, 0);
  REQUIRE(windows.is_ok());
  REQUIRE(windows->size() == 4);  // (35 - 1) / 8
  std::vector<int32_t> all_targets;
  for (size_t k = 0; k < windows->size(); ++k) {
    const TokenWindow& window = (*windows)[k];
    REQUIRE(window.inputs.size() == 8);
    REQUIRE(window.targets.size() == 8);
    CHECK(window.inputs.front() == static_cast<int32_t>(k * 8));
    for (int i = 0; i < 8; ++i) CHECK(window.targets[i] == window.inputs[i] + 1);
    all_targets.insert(all_targets.end(), window.targets.begin(), window.targets.end());
  }
  CHECK(all_targets == std::vector<int32_t>(tokens.begin() + 1, tokens.begin() + 33));

  auto again = validation_windows(tokens, 8, 0);
  REQUIRE(again.is_ok());
  CHECK((*again)[3].inputs == (*windows)[3].inputs);

  auto capped = validation_windows(tokens, 8, 2);
  REQUIRE(capped.is_ok());
  CHECK(capped->size() == 2);
}

TEST_CASE("validation windows reject too little data and bad arguments") {
  std::vector<int32_t> tokens = counting_tokens(8);
  CHECK(validation_windows(tokens, 8, 0).status().code() == StatusCode::invalid_argument);
  CHECK(validation_windows(tokens, 7, 0).is_ok());
  CHECK(validation_windows(tokens, 0, 0).status().code() == StatusCode::invalid_argument);
  CHECK(validation_windows(tokens, 4, -1).status().code() == StatusCode::invalid_argument);
}

}  // namespace
}  // namespace swarm
