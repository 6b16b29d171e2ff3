// random: SplitMix64, the project's one seedable generator.
//
// Tiny, seedable from any value (zero included) and identical on every
// platform, unlike the std distributions, so a seed replays the same run:
// weight init, routing tie-breaks and emulated packet loss all draw from it.
//
//   swarm::SplitMix64 rng(seed);
//   uint64_t pick = rng.below(peers.size());
//   double u = rng.next_unit();   // [0, 1)
#pragma once

#include <cstdint>

namespace swarm {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  // Uniform in [0, n) by multiply-high; the bias is at most n / 2^64.
  uint64_t below(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
  }

  // Uniform in [0, 1), from the top 53 bits so every double step is reachable.
  double next_unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

}  // namespace swarm
