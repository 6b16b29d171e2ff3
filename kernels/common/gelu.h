// gelu: GPT-2's GELU (tanh approximation) and its derivative, one element at a time.
//
// The CUDA element-wise kernels call these per element; the CPU backend evaluates the
// same formulas on Eigen arrays (kernels/cpu/elementwise.cc). Operations are written
// in the CPU's association order, so the only difference between backends is the
// tanh implementation. The CPU test checks both functions against the CPU backend and
// the derivative against a finite difference.
//
//   float y = swarm::kernels::gelu_tanh(x);
//   dx += swarm::kernels::gelu_tanh_derivative(x) * dy;
#pragma once

#include <cmath>

#include "swarm/core/dtype.h"  // SWARM_HOST_DEVICE

namespace swarm::kernels {

inline constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
inline constexpr float kGeluCubic = 0.044715f;

SWARM_HOST_DEVICE inline float gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(kGeluScale * (x + kGeluCubic * (x * x * x))));
}

// d/dx of gelu_tanh: 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2),
// with t the tanh of gelu_tanh.
SWARM_HOST_DEVICE inline float gelu_tanh_derivative(float x) {
  const float t = tanhf(kGeluScale * (x + kGeluCubic * (x * x * x)));
  return 0.5f * (1.0f + t) + x * 0.5f * (1.0f - t * t) * kGeluScale * (1.0f + 3.0f * kGeluCubic * (x * x));
}

}  // namespace swarm::kernels
