// seeded_random: seeded draws and shuffles that give the same result on every machine.
//
// std::shuffle and std::uniform_int_distribution are free to differ between
// standard libraries, which would make a run's data order depend on the build.
// std::mt19937_64 itself is fully specified, so everything here is built on it.
//
//   std::mt19937_64 rng(swarm::mix_seed(run_seed, epoch));
//   std::vector<int64_t> order = swarm::shuffled_indices(100, rng);
//   uint64_t die = swarm::uniform_below(rng, 6);   // 0..5, unbiased
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace swarm {

// A uniform value in [0, bound); bound must be positive. Unbiased: draws that
// fall in the short last stretch of the 2^64 range are rejected and redrawn.
uint64_t uniform_below(std::mt19937_64& rng, uint64_t bound);

// Fisher-Yates in place with uniform_below.
void seeded_shuffle(std::span<int64_t> values, std::mt19937_64& rng);

// 0, 1, ..., count-1 in a seeded random order.
std::vector<int64_t> shuffled_indices(int64_t count, std::mt19937_64& rng);

// Derives an independent seed for a sub-stream (an epoch, a peer): nearby
// (seed, stream) pairs give unrelated results, so seed s epoch 1 does not
// replay seed s+1 epoch 0.
uint64_t mix_seed(uint64_t seed, uint64_t stream);

}  // namespace swarm
