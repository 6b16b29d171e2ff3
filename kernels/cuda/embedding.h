// embedding (CUDA): token plus position embeddings, forward and backward, with the
// CPU backend's contract (kernels/cpu/ops.h): backward ADDS into dwte and dwpe.
//
// Design: forward is one block per (b, t) row, 16-byte vector copies where the
// pointers and C allow. Backward is deterministic without float atomics: positions
// are stable-sorted by token (cub radix sort), then one warp per distinct token sums
// its dout rows in position order onto dwte, the very order of the CPU backend; dwpe
// is one thread per (t, c) summing over b in order. Scratch for the sort comes from
// cudaMallocAsync on the stream.
//
//   SWARM_RETURN_IF_ERROR(swarm::cuda::embedding_forward(x, tokens, wte, wpe, B, T, C, V, stream));
//   SWARM_RETURN_IF_ERROR(swarm::cuda::embedding_backward(dwte, dwpe, dx, tokens, B, T, C, V, stream));
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "swarm/core/dtype.h"
#include "swarm/core/status.h"

namespace swarm::cuda {

// All pointers are device pointers. tokens is [B, T], wte is [V, C], wpe has at
// least T rows of C, out and dout are [B, T, C]. invalid_argument for B < 0,
// T < 0, C < 1, V < 1, B * T beyond int, or a null pointer when B * T > 0.
//
// A token outside [0, V) never causes an out-of-bounds access: forward writes a
// zero row for it (not even wpe is added) and backward skips its dout row for both
// dwte and dwpe (the gradient of that zero row). Callers should still validate
// tokens first (the model does); this only contains the damage.

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]
Status embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                         int C, int V, cudaStream_t stream);
Status embedding_forward(swarm::bf16* out, const int32_t* tokens, const swarm::bf16* wte, const swarm::bf16* wpe,
                         int B, int T, int C, int V, cudaStream_t stream);

// dwte[tokens[b,t],:] += dout[b,t,:]; dwpe[t,:] += dout[b,t,:]. Bit-identical
// on every run.
Status embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C,
                          int V, cudaStream_t stream);
Status embedding_backward(float* dwte, float* dwpe, const swarm::bf16* dout, const int32_t* tokens, int B, int T,
                          int C, int V, cudaStream_t stream);

}  // namespace swarm::cuda
