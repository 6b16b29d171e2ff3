// cudnn_attention (CUDA): causal multi-head attention, forward and backward, through
// cuDNN 9's fused flash-attention engines. Same contract as the hand-written
// kernels/cuda/attention.h, so the model can pick either at compile time.
//
// Design: cuDNN has no single "SDPA" call for this version (the fused SDPA
// operation needs 9.21 for masks), so the graph is spelled out operation by
// operation through the backend (descriptor) API in the shape the fused engines
// recognise: Q·Kᵀ, scale, causal mask (index compare + select), softmax with
// log-sum-exp statistics, P·V; and for backward the matching recompute graph.
// Q, K, V, O and their gradients are strided [B, NH, T, hd] views straight into
// qkv [B, T, 3C] and out [B, T, C]: no transposing copies. One cuDNN handle per
// device, one finalized plan per (device, B, T, C, NH, direction), one workspace
// per device grown on demand; all behind one mutex. The backward first asks for
// cuDNN's deterministic form (dQ written by the GEMM, no atomic accumulator) and
// only falls back to the accumulating form when no engine takes the first.
//
//   SWARM_RETURN_IF_ERROR(cudnn_attention_forward(out, lse, qkv, B, T, C, NH, stream));
//   SWARM_RETURN_IF_ERROR(cudnn_attention_backward(dqkv, lse, dout, qkv, out, B, T, C, NH, stream));
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "swarm/core/dtype.h"
#include "swarm/core/status.h"

namespace swarm::cuda {

// Floats of scratch the caller keeps between forward and backward: B*NH*T, the
// softmax statistics lse[(b*NH + h)*T + t] (natural-log log-sum-exp of the scaled
// scores of query row t).
int64_t cudnn_attention_scratch_floats(int B, int T, int NH);

// qkv [B, T, 3C] (q | k | v per token, head h in columns h*hd .. (h+1)*hd of each
// third), out [B, T, C]; causal, scale 1/sqrt(hd), hd = C / NH. Device pointers,
// 16-byte aligned. Writes out and the statistics into scratch.
// invalid_argument: a null pointer, a dimension < 1, or C not divisible by NH.
// unimplemented: float (cuDNN's fused attention is 16-bit only), a head dim cuDNN
// rejects (not a multiple of 8 or above 256), misaligned pointers, or no cuDNN
// engine for the graph (the message carries cuDNN's reason).
Status cudnn_attention_forward(bf16* out, float* scratch, const bf16* qkv, int B, int T, int C, int NH,
                               cudaStream_t stream);
Status cudnn_attention_forward(float* out, float* scratch, const float* qkv, int B, int T, int C, int NH,
                               cudaStream_t stream);

// ADDS the gradients into dqkv [B, T, 3C]; reads the statistics the forward left in
// scratch, and out from the forward. Same status codes as the forward.
Status cudnn_attention_backward(bf16* dqkv, float* scratch, const bf16* dout, const bf16* qkv, const bf16* out,
                                int B, int T, int C, int NH, cudaStream_t stream);
Status cudnn_attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                                const float* out, int B, int T, int C, int NH, cudaStream_t stream);

// Whether the backward plan already built for this shape on the current device
// gives the same bits on every run (false if none is built yet). cuDNN decides
// which engines exist; this reports what it chose.
bool cudnn_attention_backward_is_deterministic(int B, int T, int C, int NH);

}  // namespace swarm::cuda
