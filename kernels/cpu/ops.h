// ops: the fp32 CPU reference kernels of a GPT stage, forward and backward.
//
// Every other backend is checked against these. Layout follows llm.c: row-major
// activations of N = B*T rows, weights stored [out_features, in_features].
// Backward kernels ADD into their gradient outputs (parameter gradients
// accumulate over microbatches; input gradients meet at residual joins), so
// callers zero a gradient buffer before its first use.
//
// Reductions use a fixed partition of the work, never the thread count, so
// results are bit-identical at 1 or many threads.
//
//   swarm::cpu::matmul_forward(out, inp, weight, bias, N, C, OC);
//   swarm::cpu::matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
#pragma once

#include <cstdint>

namespace swarm::cpu {

// Threads used by every kernel (OpenMP and Eigen), process-wide. 0 = all cores.
// OpenMP's own setting is per calling thread, so a kernel called from a
// server's I/O thread would ignore it; kernels pass this count explicitly.
void set_num_threads(int threads);
int num_threads();
inline int kernel_threads() { return num_threads(); }

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                       int T, int C);
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                        int T, int C);

// Per row: out = (inp - mean) * rstd * weight + bias; saves mean and rstd [N].
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C);

// out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias[OC] (bias may be null).
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC);
// dinp may be null (first layer); dbias may be null (no bias).
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int N, int C, int OC);

// GELU, tanh approximation (GPT-2's).
void gelu_forward(float* out, const float* inp, int64_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n);

// Causal multi-head self-attention. qkv[B,T,3C] holds q, k, v side by side;
// out[B,T,C]; att[B,NH,T,T] keeps the softmax probabilities for backward.
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B,
                        int T, int C, int NH);

// out = a + b
void residual_forward(float* out, const float* a, const float* b, int64_t n);
// dst += src
void accumulate(float* dst, const float* src, int64_t n);

// Maxout over k contiguous slices of each row of inp [N, C]: out [N, C/k] with
// out[n, j] = max over g < k of inp[n, g * C/k + j]. C % k == 0.
void maxout_forward(float* out, const float* inp, int N, int C, int k);
// dinp[n, g* * C/k + j] += dout[n, j], g* the first g reaching the maximum (a NaN
// counts as the maximum), recomputed from inp rather than saved by the forward.
void maxout_backward(float* dinp, const float* dout, const float* inp, int N, int C, int k);

// Fused softmax cross-entropy over rows of logits[N,V]: losses[N] gets
// -log softmax(logits)[target]; dlogits (if not null) is overwritten with
// (softmax - onehot(target)) * dloss_scale. A target outside [0, V) is a
// programming error; validate tokens before calling.
void cross_entropy_forward_backward(float* losses, float* dlogits, const float* logits,
                                    const int32_t* targets, int N, int V, float dloss_scale);

}  // namespace swarm::cpu
