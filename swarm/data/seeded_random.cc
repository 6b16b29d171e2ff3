#include "swarm/data/seeded_random.h"

#include <numeric>
#include <utility>

#include "swarm/core/check.h"

namespace swarm {
namespace {

// splitmix64's finalizer: a bijection with good avalanche, so flipping one
// input bit changes about half of the output bits.
uint64_t splitmix64(uint64_t value) {
  value += 0x9e3779b97f4a7c15ull;
  value = (value ^ (value >> 30)) * 0xbf58476d1ce4e5b9ull;
  value = (value ^ (value >> 27)) * 0x94d049bb133111ebull;
  return value ^ (value >> 31);
}

}  // namespace

uint64_t uniform_below(std::mt19937_64& rng, uint64_t bound) {
  SWARM_CHECK(bound > 0, "uniform_below needs a positive bound");
  // 2^64 mod bound: the draws below it are the incomplete last cycle of residues.
  const uint64_t rejection_threshold = (0 - bound) % bound;
  while (true) {
    uint64_t draw = rng();
    if (draw >= rejection_threshold) return draw % bound;
  }
}

void seeded_shuffle(std::span<int64_t> values, std::mt19937_64& rng) {
  for (size_t i = values.size(); i > 1; --i) {
    size_t j = static_cast<size_t>(uniform_below(rng, i));
    std::swap(values[i - 1], values[j]);
  }
}

std::vector<int64_t> shuffled_indices(int64_t count, std::mt19937_64& rng) {
  std::vector<int64_t> indices(static_cast<size_t>(count > 0 ? count : 0));
  std::iota(indices.begin(), indices.end(), int64_t{0});
  seeded_shuffle(indices, rng);
  return indices;
}

uint64_t mix_seed(uint64_t seed, uint64_t stream) {
  return splitmix64(splitmix64(seed) ^ splitmix64(stream ^ 0x5851f42d4c957f2dull));
}

}  // namespace swarm
