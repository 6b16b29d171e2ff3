// optim_math: the per-element and per-tensor arithmetic of AdamW and LAMB, shared by CPU and CUDA.
//
// Everything here is an inline SWARM_HOST_DEVICE function of plain floats, so the CPU optimizer
// and a future CUDA kernel compute the same expressions in the same order. The per-step
// constants (AdamCoefficients) are made once on the host and handed to both.
//
//   auto c = swarm::optim::adam_coefficients(0.9f, 0.95f, 1e-6f, /*step=*/1);
//   float direction = swarm::optim::adam_update_element(grad, m, v, c);    // m, v updated in place
//   w -= lr * (direction + swarm::optim::decoupled_weight_decay(w, 0.01f, /*apply=*/true));
//
// Bit-identical replicas need the same rounding everywhere: build users of these functions
// without floating-point contraction (-ffp-contract=off on the host, --fmad=false in nvcc).
#pragma once

#include <math.h>  // ::sqrtf, which nvcc also provides in device code

#include <cmath>
#include <cstdint>

#include "swarm/core/dtype.h"

namespace swarm::optim {

// Constants of one Adam step. The bias corrections depend only on the step number, so they are
// computed once (in double, on the host) instead of per element with a device pow().
struct AdamCoefficients {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-6f;
  float bias_correction1 = 1.0f;  // 1 - beta1^step
  float bias_correction2 = 1.0f;  // 1 - beta2^step
};

// `step` counts from 1: the first update has step 1. Host only.
inline AdamCoefficients adam_coefficients(float beta1, float beta2, float eps, int64_t step) {
  AdamCoefficients c;
  c.beta1 = beta1;
  c.beta2 = beta2;
  c.eps = eps;
  const double t = static_cast<double>(step);
  c.bias_correction1 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), t));
  c.bias_correction2 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), t));
  return c;
}

// Advances the two moments with one gradient element and returns the bias-corrected Adam
// direction m_hat / (sqrt(v_hat) + eps). Clipping, if any, is already folded into `grad`.
SWARM_HOST_DEVICE inline float adam_update_element(float grad, float& m, float& v,
                                                   const AdamCoefficients& c) {
  m = c.beta1 * m + (1.0f - c.beta1) * grad;
  v = c.beta2 * v + (1.0f - c.beta2) * (grad * grad);
  const float m_hat = m / c.bias_correction1;
  const float v_hat = v / c.bias_correction2;
  return m_hat / (::sqrtf(v_hat) + c.eps);
}

// The decoupled (AdamW-style) decay term added to the direction. Decoupled means it is not fed
// through the moments, so it shrinks weights at the same rate whatever the gradient scale.
SWARM_HOST_DEVICE inline float decoupled_weight_decay(float weight, float weight_decay, bool apply) {
  return apply ? weight_decay * weight : 0.0f;
}

// LAMB's per-tensor scale. A zero norm means either a fresh zero tensor (so nothing to be
// relative to) or no update at all; both fall back to plain Adam with ratio 1. The clamp keeps a
// tensor with tiny updates from taking a huge step; max_ratio <= 0 turns it off.
SWARM_HOST_DEVICE inline float trust_ratio(float weight_norm, float update_norm,
                                           float max_ratio = 10.0f) {
  if (!(weight_norm > 0.0f) || !(update_norm > 0.0f)) return 1.0f;
  const float ratio = weight_norm / update_norm;
  return (max_ratio > 0.0f && ratio > max_ratio) ? max_ratio : ratio;
}

// Keeps the coefficient finite when the norm is exactly zero.
inline constexpr float kClipEpsilon = 1e-6f;

// The factor every gradient is multiplied by so the global norm is at most max_norm.
// max_norm <= 0 disables clipping.
SWARM_HOST_DEVICE inline float clip_coefficient(float global_norm, float max_norm) {
  if (!(max_norm > 0.0f)) return 1.0f;
  const float coefficient = max_norm / (global_norm + kClipEpsilon);
  return coefficient < 1.0f ? coefficient : 1.0f;
}

}  // namespace swarm::optim
