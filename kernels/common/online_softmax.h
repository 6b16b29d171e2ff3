// online_softmax: the running (max, sum of exp) pair of a softmax computed in one pass.
//
// Flash-style attention sees a row of scores one tile at a time and never holds the
// whole row, so it keeps m = max so far and l = sum of exp(x - m), rescaling l when
// m grows. Partial states of different tiles merge the same way. The CPU tests
// check this arithmetic against a direct log-sum-exp; the CUDA kernels use it as is.
//
//   swarm::kernels::OnlineSoftmax s;
//   for (float x : scores) s.add(x);
//   float p_i = expf(scores[i] - s.max) / s.sum;
#pragma once

#include <cmath>

#include "swarm/core/dtype.h"  // SWARM_HOST_DEVICE

namespace swarm::kernels {

struct OnlineSoftmax {
  float max = -INFINITY;
  float sum = 0.0f;  // of exp(x - max)

  SWARM_HOST_DEVICE void add(float x) {
    if (x > max) {
      sum = sum * expf(max - x) + 1.0f;  // expf(-inf) = 0 on the first element
      max = x;
    } else if (x != -INFINITY) {  // exp(-inf) adds nothing; -inf - -inf would be NaN
      sum += expf(x - max);
    }
  }

  SWARM_HOST_DEVICE void merge(const OnlineSoftmax& other) {
    if (other.max == -INFINITY) return;
    if (max == -INFINITY) {
      *this = other;
      return;
    }
    const float m = fmaxf(max, other.max);
    sum = sum * expf(max - m) + other.sum * expf(other.max - m);
    max = m;
  }

  // The factor a partial output accumulated under an old max needs under the new one.
  SWARM_HOST_DEVICE static float rescale(float old_max, float new_max) {
    return old_max == -INFINITY ? 0.0f : expf(old_max - new_max);
  }

  SWARM_HOST_DEVICE float log_sum_exp() const { return max + logf(sum); }
};

}  // namespace swarm::kernels
