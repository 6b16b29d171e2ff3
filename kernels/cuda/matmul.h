// matmul (CUDA): the GEMMs of a GPT stage on cuBLASLt, with the CPU backend's layout and
// contract (kernels/cpu/ops.h): row-major inp [N, C], weight [OC, C] (PyTorch Linear),
// out [N, OC]; backward ADDS into its gradients (except dpre, see below).
//
// Design: a row-major matrix is its transpose in column-major, so out = inp @ weight^T is
// cuBLASLt's D[OC, N] = op(weight)[OC, C] @ inp[C, N] with no copies (gemm_geometry below
// spells out all three GEMMs). Bias, GELU and GELU' ride in cuBLASLt epilogues so the
// activation never makes an extra trip through memory; cuBLASLt's GELU is the tanh
// approximation, GPT-2's. Where cuBLASLt has no kernel for an epilogue (its GELU aux
// matrix needs a leading dimension divisible by 8, i.e. OC resp. C % 8 == 0, and we ask
// for 16-byte aligned bias/aux), the plain GEMM runs and a small kernel applies the
// epilogue (matmul_reduce.cu); matmul_epilogue_fallbacks() counts those calls.
// dbias is our own two-pass column sum: a fixed partition of rows, so the same bits on
// every run, and it adds (cuBLASLt's BGRAD epilogues overwrite).
// Each device gets one cuBLASLt handle, a 32 MiB workspace and a mutex-guarded cache of
// descriptors, layouts and the top heuristic algorithm per (shape, types, epilogue,
// pointer alignment). float runs true fp32 (CUBLAS_COMPUTE_32F, no TF32); bf16 runs
// bf16 A/B with fp32 accumulation, and fp32 C/D for dweight.
// The workspace is per device, not per stream: GEMMs issued on two streams of one device
// must not run concurrently (order the streams, or use one).
//
//   SWARM_RETURN_IF_ERROR(swarm::cuda::matmul_forward(out, inp, weight, bias, N, C, OC, stream));
//   SWARM_RETURN_IF_ERROR(swarm::cuda::matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, stream));
#pragma once

#include <cuda_runtime_api.h>

#include <math.h>

#include <cstdint>

#include "swarm/core/dtype.h"
#include "swarm/core/status.h"

namespace swarm::cuda {

// All pointers are device pointers. invalid_argument for N < 0, C < 1, OC < 1 or a null
// required pointer (N == 0 is an ok no-op); unimplemented, with cuBLAS's reason and
// file:line, when cuBLASLt has no algorithm at all for the problem. Outputs must not
// overlap inputs.

// out = inp @ weight^T + bias. bias may be null.
Status matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC,
                      cudaStream_t stream);
Status matmul_forward(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias, int N, int C, int OC,
                      cudaStream_t stream);

// pre_gelu = inp @ weight^T + bias (kept for backward); out = gelu(pre_gelu), tanh
// approximation. bias may be null.
Status matmul_gelu_forward(float* out, float* pre_gelu, const float* inp, const float* weight, const float* bias,
                           int N, int C, int OC, cudaStream_t stream);
Status matmul_gelu_forward(bf16* out, bf16* pre_gelu, const bf16* inp, const bf16* weight, const bf16* bias, int N,
                           int C, int OC, cudaStream_t stream);

// dinp += dout @ weight (dinp may be null: first layer), dweight += dout^T @ inp,
// dbias += column sums of dout (may be null: no bias).
Status matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const float* weight, int N, int C, int OC, cudaStream_t stream);
Status matmul_backward(bf16* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp, const bf16* weight,
                       int N, int C, int OC, cudaStream_t stream);

// For a layer whose input was gelu(pre_gelu) (inp == gelu(pre_gelu), both [N, C]):
// dweight += dout^T @ inp, dbias += column sums of dout (may be null), and dpre is
// OVERWRITTEN with (dout @ weight) * gelu'(pre_gelu): the gradient that reaches the
// previous layer's output, GELU already undone.
Status matmul_backward_dgelu(float* dpre, float* dweight, float* dbias, const float* dout, const float* inp,
                             const float* weight, const float* pre_gelu, int N, int C, int OC, cudaStream_t stream);
Status matmul_backward_dgelu(bf16* dpre, float* dweight, float* dbias, const bf16* dout, const bf16* inp,
                             const bf16* weight, const bf16* pre_gelu, int N, int C, int OC, cudaStream_t stream);

// How many calls so far (process-wide) applied an epilogue with our own kernel because
// cuBLASLt had none for the problem. Tests and benchmarks print it.
int64_t matmul_epilogue_fallbacks();

// --- Benchmark support -------------------------------------------------------------------
// The GEMM inside the calls above, run with candidate `algo` of cuBLASLt's heuristic list
// for that exact problem (types, epilogue, alignment); candidate 0 is the one the calls
// above use. out_of_range past the last candidate (there are at most kMatmulMaxAlgos).

inline constexpr int kMatmulMaxAlgos = 16;

// pre_gelu == nullptr: out = inp @ weight^T + bias; otherwise as matmul_gelu_forward.
Status matmul_forward_with_algo(int algo, bf16* out, bf16* pre_gelu, const bf16* inp, const bf16* weight,
                                const bf16* bias, int N, int C, int OC, cudaStream_t stream);
// pre_gelu == nullptr: dinp += dout @ weight; otherwise dinp = (dout @ weight) * gelu'(pre_gelu).
Status matmul_backward_input_with_algo(int algo, bf16* dinp, const bf16* pre_gelu, const bf16* dout,
                                       const bf16* weight, int N, int C, int OC, cudaStream_t stream);
// dweight += dout^T @ inp.
Status matmul_backward_weight_with_algo(int algo, float* dweight, const bf16* dout, const bf16* inp, int N, int C,
                                        int OC, cudaStream_t stream);

// --- The column-major problems behind the row-major GEMMs (pure math, checked on the CPU) --

enum class GemmRole {
  forward,          // D = out [N, OC]:      A = weight, B = inp
  backward_input,   // D = dinp [N, C]:      A = weight, B = dout
  backward_weight,  // D = dweight [OC, C]:  A = inp,    B = dout
};

// A matrix as cuBLASLt sees the memory: column-major rows x cols with leading dimension ld.
struct StoredMatrix {
  int64_t rows = 0, cols = 0, ld = 0;
};

// D[m, n] = op(A)[m, k] @ op(B)[k, n], all column-major; op transposes when asked.
struct GemmGeometry {
  int64_t m = 0, n = 0, k = 0;
  bool transpose_a = false, transpose_b = false;
  StoredMatrix a, b, d;
};

constexpr GemmGeometry gemm_geometry(GemmRole role, int N, int C, int OC) {
  const int64_t n_rows = N, c = C, oc = OC;
  switch (role) {
    case GemmRole::forward:  // out^T[OC, N] = (weight^T)^T[OC, C] @ inp^T[C, N]
      return {oc, n_rows, c, true, false, {c, oc, c}, {c, n_rows, c}, {oc, n_rows, oc}};
    case GemmRole::backward_input:  // dinp^T[C, N] = weight^T[C, OC] @ dout^T[OC, N]
      return {c, n_rows, oc, false, false, {c, oc, c}, {oc, n_rows, oc}, {c, n_rows, c}};
    case GemmRole::backward_weight:  // dweight^T[C, OC] = inp^T[C, N] @ (dout^T)^T[N, OC]
      return {c, oc, n_rows, false, true, {c, n_rows, c}, {oc, n_rows, oc}, {c, oc, c}};
  }
  return {};
}

namespace matmul_internal {

// GELU, tanh approximation, and its derivative: the formulas of kernels/cpu/elementwise.cc,
// shared by the fallback kernels and the CPU tests.
inline constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
inline constexpr float kGeluCubic = 0.044715f;

SWARM_HOST_DEVICE inline float gelu(float x) {
  return 0.5f * x * (1.0f + tanhf(kGeluScale * (x + kGeluCubic * x * x * x)));
}

SWARM_HOST_DEVICE inline float gelu_grad(float x) {
  const float t = tanhf(kGeluScale * (x + kGeluCubic * x * x * x));
  return 0.5f * (1.0f + t) + x * 0.5f * (1.0f - t * t) * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
}

// The column sum for dbias: rows split into fixed chunks (partial sums in a scratch
// buffer), then the chunks summed in order. The chunk size grows only when the chunk
// count would pass CUDA's grid.y limit.
inline constexpr int kColumnSumRowsPerChunk = 256;
inline constexpr int kMaxGridY = 65535;

SWARM_HOST_DEVICE constexpr int column_sum_rows_per_chunk(int N) {
  const int64_t needed = (static_cast<int64_t>(N) + kMaxGridY - 1) / kMaxGridY;
  return needed > kColumnSumRowsPerChunk ? static_cast<int>(needed) : kColumnSumRowsPerChunk;
}

SWARM_HOST_DEVICE constexpr int column_sum_chunks(int N) {
  const int rows = column_sum_rows_per_chunk(N);
  return static_cast<int>((static_cast<int64_t>(N) + rows - 1) / rows);
}

// Launchers in matmul_reduce.cu (device pointers; shapes already checked by the caller).
Status add_bias(float* out, const float* bias, int N, int OC, cudaStream_t stream);
Status add_bias(bf16* out, const bf16* bias, int N, int OC, cudaStream_t stream);
Status gelu_forward(float* out, const float* pre, int64_t n, cudaStream_t stream);
Status gelu_forward(bf16* out, const bf16* pre, int64_t n, cudaStream_t stream);
Status multiply_gelu_grad(float* grad, const float* pre, int64_t n, cudaStream_t stream);
Status multiply_gelu_grad(bf16* grad, const bf16* pre, int64_t n, cudaStream_t stream);
// dbias[j] += sum_i dout[i, j], deterministic.
Status column_sum_accumulate(float* dbias, const float* dout, int N, int OC, cudaStream_t stream);
Status column_sum_accumulate(float* dbias, const bf16* dout, int N, int OC, cudaStream_t stream);

}  // namespace matmul_internal
}  // namespace swarm::cuda
