// optimizer (CUDA): AdamW and LAMB steps over a DeviceParamList, bit-identical to
// swarm::optim::AdamW / Lamb on the CPU, with no host round trip inside a step.
//
// Design: every element goes through the optim_math.h functions the CPU uses, in the CPU's order,
// compiled without FMA contraction (--fmad=false, IEEE division and sqrt), so the weights and
// moments match the CPU bit for bit. The clip coefficient and the refusal flag come from the
// GradNormResult that global_grad_norm wrote in device memory; a refused step (non-finite norm)
// changes nothing, as on the CPU.
//
// LAMB needs ||u|| before it can apply u. Its first pass computes u per element without writing
// anything and sums ||w||^2 and ||u||^2 per kNormChunk chunk in the CPU's sequential double
// order; the second pass recomputes u from the same inputs (so the same bits) while it writes.
// That costs one more read of g, m, v and w than keeping u, but needs no scratch the size of
// the model, and the update stays one optim_math expression.
//
//   SWARM_RETURN_IF_ERROR(global_grad_norm(list, config.clip_norm, d_norm, stream));
//   auto c = swarm::optim::adam_coefficients(config.beta1, config.beta2, config.eps, step);
//   SWARM_RETURN_IF_ERROR(lamb_step(list, d_norm, c, lr, config.weight_decay, config.max_trust_ratio, stream));
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/cuda/grad_norm.h"
#include "swarm/core/status.h"
#include "swarm/core/optim_math.h"

namespace swarm::cuda {

// Both steps read grad_norm (device memory, written by global_grad_norm earlier on `stream`) and
// update weight, m, v and compute_copy of every param. The step count behind `coefficients`
// (optim::adam_coefficients(beta1, beta2, eps, step)) is the caller's: on the CPU a refused step
// does not count, so a caller that reads GradNormResult::refused later should not count it either.
//
// invalid_argument, before touching the device: a null grad_norm; lr not finite or negative;
// beta1 or beta2 outside [0, 1); eps not finite and positive; a bias correction outside (0, 1];
// weight_decay not finite or negative; (LAMB) max_trust_ratio not finite (<= 0: no clamp).
Status adamw_step(const DeviceParamList& params, const GradNormResult* grad_norm,
                  optim::AdamCoefficients coefficients, float lr, float weight_decay, cudaStream_t stream);

Status lamb_step(const DeviceParamList& params, const GradNormResult* grad_norm,
                 optim::AdamCoefficients coefficients, float lr, float weight_decay, float max_trust_ratio,
                 cudaStream_t stream);

}  // namespace swarm::cuda
