// attention (CUDA): causal multi-head self-attention, flash style, float and bf16,
// with the CPU backend's layout (kernels/cpu/attention.cc): qkv [B, T, 3C] holds
// q, k, v side by side, head h in columns h*hd .. (h+1)*hd of each; out [B, T, C].
//
// Design: no T x T matrix ever reaches global memory. Forward walks key tiles
// with an online softmax per query row (kernels/common/flash_tile.h) and keeps
// only each row's log-sum-exp. Backward recomputes the probabilities from it and
// is deterministic without atomics: one kernel owns a key tile and sums dK, dV
// over query tiles in order; another owns a query tile and sums dQ over key
// tiles in order; D = rowsum(dO * O) comes first from a small kernel. bf16 runs
// the tile products on tensor cores (wmma, float accumulators); float uses FMAs.
//
//   // scratch: attention_scratch_floats(B, T, NH) floats of device memory, kept from forward to backward
//   SWARM_RETURN_IF_ERROR(attention_forward(out, scratch, qkv, B, T, C, NH, stream));
//   SWARM_RETURN_IF_ERROR(attention_backward(dqkv, scratch, dout, qkv, out, B, T, C, NH, stream));
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "swarm/core/dtype.h"
#include "swarm/core/status.h"

namespace swarm::cuda {

// Floats of device scratch forward and backward share: lse [B, NH, T] at offset 0
// (forward writes it, backward reads it), then D [B, NH, T] for backward.
int64_t attention_scratch_floats(int B, int T, int NH);

// All pointers are device pointers. Head size hd = C / NH must be 32, 64 or 128
// (else unimplemented); sizes below 1, C % NH != 0 or a null pointer give
// invalid_argument. Forward writes out and lse[(b*NH + h)*T + t], the natural-log
// log-sum-exp of query row t's scaled scores (the statistic cuDNN's SDPA reports).
Status attention_forward(float* out, float* scratch, const float* qkv, int B, int T, int C, int NH,
                         cudaStream_t stream);
Status attention_forward(bf16* out, float* scratch, const bf16* qkv, int B, int T, int C, int NH,
                         cudaStream_t stream);

// ADDS into dqkv [B, T, 3C]; reads lse from scratch (as forward left it) and
// overwrites the D part.
Status attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* out,
                          int B, int T, int C, int NH, cudaStream_t stream);
Status attention_backward(bf16* dqkv, float* scratch, const bf16* dout, const bf16* qkv, const bf16* out, int B,
                          int T, int C, int NH, cudaStream_t stream);

}  // namespace swarm::cuda
