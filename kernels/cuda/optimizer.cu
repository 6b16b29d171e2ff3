// See optimizer.h for the design. Built with --fmad=false: see optim_math.h.
#include "kernels/cuda/optimizer.h"

#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/element_types.cuh"
#include "kernels/cuda/grad_norm.h"
#include "swarm/core/optim_math.h"

namespace swarm::cuda {
namespace {

constexpr int kApplyThreads = 256;  // one block per chunk: 64 elements a thread, coalesced
constexpr int kChunkThreads = 128;  // one thread per chunk (the CPU's sequential sums)
constexpr int kScaleThreads = 128;  // one thread per param

// The CPU's u: the Adam direction of the clipped gradient plus the decoupled decay; advances m, v.
__device__ __forceinline__ float update_direction(float grad, float clip, float& m, float& v, float weight,
                                                  const optim::AdamCoefficients& c, float weight_decay,
                                                  bool apply_weight_decay) {
  const float direction = optim::adam_update_element(grad * clip, m, v, c);
  return direction + optim::decoupled_weight_decay(weight, weight_decay, apply_weight_decay);
}

// w -= scale * u for every element of one chunk, with scale = lr (AdamW) or lr * trust ratio of
// the param (LAMB, param_scale). Writes m, v, w and the bf16 copy.
__global__ void apply_update_kernel(const DeviceParam* params, const int64_t* first_chunk, const int32_t* chunk_param,
                                    const float* param_scale, float lr, optim::AdamCoefficients c, float weight_decay,
                                    const GradNormResult* grad_norm) {
  if (grad_norm->refused != 0) return;  // the whole grid leaves: a refused step changes nothing
  const float clip = grad_norm->clip_coefficient;
  const int64_t chunk = blockIdx.x;
  const int32_t k = chunk_param[chunk];
  const DeviceParam p = params[k];
  const float scale = param_scale != nullptr ? param_scale[k] : lr;
  const ChunkRange range = chunk_range(p.numel, chunk - first_chunk[k]);
  __nv_bfloat16* copy = reinterpret_cast<__nv_bfloat16*>(p.compute_copy);  // device_cast is host-only
  for (int64_t i = range.begin + threadIdx.x; i < range.end; i += blockDim.x) {
    float m = p.m[i];
    float v = p.v[i];
    const float w = p.weight[i];
    const float u = update_direction(p.grad[i], clip, m, v, w, c, weight_decay, p.apply_weight_decay);
    const float updated = w - scale * u;
    p.m[i] = m;
    p.v[i] = v;
    p.weight[i] = updated;
    if (copy != nullptr) store_float(copy + i, updated);
  }
}

// LAMB pass 1, one thread per chunk: ||w||^2 and ||u||^2 of the chunk, summed in double in index
// order as the CPU does. Reads only; u is recomputed by apply_update_kernel.
__global__ void lamb_chunk_norms_kernel(const DeviceParam* params, const int64_t* first_chunk,
                                        const int32_t* chunk_param, int64_t chunk_count, optim::AdamCoefficients c,
                                        float weight_decay, const GradNormResult* grad_norm, double* chunk_sums) {
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (chunk >= chunk_count || grad_norm->refused != 0) return;
  const float clip = grad_norm->clip_coefficient;
  const int32_t k = chunk_param[chunk];
  const DeviceParam p = params[k];
  const ChunkRange range = chunk_range(p.numel, chunk - first_chunk[k]);
  double weight_sq = 0.0;
  double update_sq = 0.0;
  const auto accumulate = [&](float g, float m, float v, float w) {
    const float u = update_direction(g, clip, m, v, w, c, weight_decay, p.apply_weight_decay);
    weight_sq += static_cast<double>(w) * w;
    update_sq += static_cast<double>(u) * u;
  };
  int64_t i = range.begin;
  if (is_16_byte_aligned(p.grad + i) && is_16_byte_aligned(p.m + i) && is_16_byte_aligned(p.v + i) &&
      is_16_byte_aligned(p.weight + i)) {
    for (; i + 4 <= range.end; i += 4) {
      const float4 g = load_float4(p.grad + i);
      const float4 m = load_float4(p.m + i);
      const float4 v = load_float4(p.v + i);
      const float4 w = load_float4(p.weight + i);
      accumulate(g.x, m.x, v.x, w.x);
      accumulate(g.y, m.y, v.y, w.y);
      accumulate(g.z, m.z, v.z, w.z);
      accumulate(g.w, m.w, v.w, w.w);
    }
  }
  for (; i < range.end; ++i) accumulate(p.grad[i], p.m[i], p.v[i], p.weight[i]);
  chunk_sums[chunk] = weight_sq;
  chunk_sums[chunk_count + chunk] = update_sq;
}

// LAMB, one thread per param: its chunks in order, the trust ratio, and lr * ratio.
__global__ void lamb_scale_kernel(const int64_t* first_chunk, int64_t param_count, int64_t chunk_count,
                                  const double* chunk_sums, float lr, float max_trust_ratio,
                                  const GradNormResult* grad_norm, float* param_scale) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= param_count || grad_norm->refused != 0) return;
  double weight_total = 0.0;
  double update_total = 0.0;
  for (int64_t chunk = first_chunk[k]; chunk < first_chunk[k + 1]; ++chunk) {
    weight_total += chunk_sums[chunk];
    update_total += chunk_sums[chunk_count + chunk];
  }
  const float ratio = optim::trust_ratio(static_cast<float>(sqrt(weight_total)),
                                         static_cast<float>(sqrt(update_total)), max_trust_ratio);
  param_scale[k] = lr * ratio;
}

Status check_step(const char* name, const GradNormResult* grad_norm, const optim::AdamCoefficients& c, float lr,
                  float weight_decay) {
  if (grad_norm == nullptr) return invalid_argument("{}: null grad_norm", name);
  if (!(std::isfinite(lr) && lr >= 0.0f)) {
    return invalid_argument("{}: learning rate {} must be finite and >= 0", name, lr);
  }
  if (!(c.beta1 >= 0.0f && c.beta1 < 1.0f)) return invalid_argument("{}: beta1 {} must be in [0, 1)", name, c.beta1);
  if (!(c.beta2 >= 0.0f && c.beta2 < 1.0f)) return invalid_argument("{}: beta2 {} must be in [0, 1)", name, c.beta2);
  if (!(std::isfinite(c.eps) && c.eps > 0.0f)) {
    return invalid_argument("{}: eps {} must be finite and > 0", name, c.eps);
  }
  if (!(c.bias_correction1 > 0.0f && c.bias_correction1 <= 1.0f) ||
      !(c.bias_correction2 > 0.0f && c.bias_correction2 <= 1.0f)) {
    return invalid_argument("{}: bias corrections {} and {} must be in (0, 1] (steps count from 1)", name,
                            c.bias_correction1, c.bias_correction2);
  }
  if (!(std::isfinite(weight_decay) && weight_decay >= 0.0f)) {
    return invalid_argument("{}: weight_decay {} must be finite and >= 0", name, weight_decay);
  }
  return Status::ok();
}

}  // namespace

Status adamw_step(const DeviceParamList& params, const GradNormResult* grad_norm,
                  optim::AdamCoefficients coefficients, float lr, float weight_decay, cudaStream_t stream) {
  SWARM_RETURN_IF_ERROR(check_step("adamw_step", grad_norm, coefficients, lr, weight_decay));
  const int64_t chunk_count = params.chunk_count();
  if (chunk_count == 0) return Status::ok();
  const DeviceParamList::DeviceArrays& d = params.device_arrays();
  apply_update_kernel<<<static_cast<unsigned>(chunk_count), kApplyThreads, 0, stream>>>(
      d.params, d.first_chunk, d.chunk_param, /*param_scale=*/nullptr, lr, coefficients, weight_decay, grad_norm);
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::ok();
}

Status lamb_step(const DeviceParamList& params, const GradNormResult* grad_norm,
                 optim::AdamCoefficients coefficients, float lr, float weight_decay, float max_trust_ratio,
                 cudaStream_t stream) {
  SWARM_RETURN_IF_ERROR(check_step("lamb_step", grad_norm, coefficients, lr, weight_decay));
  if (!std::isfinite(max_trust_ratio)) {
    return invalid_argument("lamb_step: max_trust_ratio {} must be finite", max_trust_ratio);
  }
  const int64_t chunk_count = params.chunk_count();
  if (chunk_count == 0) return Status::ok();
  const DeviceParamList::DeviceArrays& d = params.device_arrays();
  const int64_t norm_blocks = (chunk_count + kChunkThreads - 1) / kChunkThreads;
  lamb_chunk_norms_kernel<<<static_cast<unsigned>(norm_blocks), kChunkThreads, 0, stream>>>(
      d.params, d.first_chunk, d.chunk_param, chunk_count, coefficients, weight_decay, grad_norm, d.chunk_sums);
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  const int64_t scale_blocks = (params.size() + kScaleThreads - 1) / kScaleThreads;
  lamb_scale_kernel<<<static_cast<unsigned>(scale_blocks), kScaleThreads, 0, stream>>>(
      d.first_chunk, params.size(), chunk_count, d.chunk_sums, lr, max_trust_ratio, grad_norm, d.param_scale);
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  apply_update_kernel<<<static_cast<unsigned>(chunk_count), kApplyThreads, 0, stream>>>(
      d.params, d.first_chunk, d.chunk_param, d.param_scale, lr, coefficients, weight_decay, grad_norm);
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::ok();
}

}  // namespace swarm::cuda
