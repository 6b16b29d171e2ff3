// row_stats: mean and variance of a row by Welford's method, in chunks that merge.
//
// The layernorm kernels on every backend compute row statistics with this one
// piece of math: a CPU loop adds elements one by one, a CUDA warp gives each lane a
// strided share and merges the lanes in a fixed shuffle tree. Merging (Chan et al.)
// keeps the result stable where sum-of-squares would cancel, and a fixed merge order
// keeps it deterministic.
//
//   swarm::kernels::Welford w;
//   for (int c = 0; c < C; ++c) w.add(x[c]);
//   float rstd = w.rstd(1e-5f);
#pragma once

#include <cmath>

#include "swarm/core/dtype.h"  // SWARM_HOST_DEVICE

namespace swarm::kernels {

struct Welford {
  float count = 0.0f;
  float mean = 0.0f;
  float m2 = 0.0f;  // sum of squared deviations from the mean

  SWARM_HOST_DEVICE void add(float x) {
    count += 1.0f;
    const float delta = x - mean;
    mean += delta / count;
    m2 += delta * (x - mean);
  }

  SWARM_HOST_DEVICE void merge(const Welford& other) {
    if (other.count == 0.0f) return;
    if (count == 0.0f) {
      *this = other;
      return;
    }
    const float total = count + other.count;
    const float delta = other.mean - mean;
    const float weight = other.count / total;
    mean += delta * weight;
    m2 += other.m2 + delta * delta * count * weight;
    count = total;
  }

  // Population variance, as layernorm uses.
  SWARM_HOST_DEVICE float variance() const { return count > 0.0f ? m2 / count : 0.0f; }
  SWARM_HOST_DEVICE float rstd(float eps) const { return 1.0f / sqrtf(variance() + eps); }
};

}  // namespace swarm::kernels
