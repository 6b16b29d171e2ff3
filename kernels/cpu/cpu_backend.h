// cpu_backend: the CPU model of the Backend concept, over the fp32 kernels in ops.h.
//
// The stream is a no-op token: CPU kernels finish before they return. Beyond the
// concept it has the maxout op (MaxoutBackend) of maxout boundary layers.
//
//   static_assert(swarm::Backend<swarm::CpuBackend>);
//   swarm::CpuBackend::matmul_forward(y, x, w, b, N, C, OC, swarm::CpuStream{});
#pragma once

#include <cstring>

#include "swarm/api/backend.h"
#include "kernels/cpu/ops.h"

namespace swarm {

struct CpuStream {};

struct CpuBackend {
  using backend_concept = backend_t;
  using maxout_concept = maxout_t;
  using stream_type = CpuStream;
  using value_type = float;
  static constexpr Device device = Device::cpu;

  static Status initialize() { return Status::ok(); }
  static void to_values(float* dst, const float* src, int64_t n, CpuStream) { copy(dst, src, n); }
  static void to_floats(float* dst, const float* src, int64_t n, CpuStream) { copy(dst, src, n); }

  static void embedding_forward(float* out, const int32_t* tokens, const float* wte,
                                const float* wpe, int B, int T, int C, int /*V: tokens are validated*/,
                                CpuStream) {
    cpu::embedding_forward(out, tokens, wte, wpe, B, T, C);
  }
  static void embedding_backward(float* dwte, float* dwpe, const float* dout,
                                 const int32_t* tokens, int B, int T, int C, int /*V*/, CpuStream) {
    cpu::embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
  }
  static void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                const float* weight, const float* bias, int N, int C, CpuStream) {
    cpu::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
  }
  static void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                 const float* inp, const float* weight, const float* mean,
                                 const float* rstd, int N, int C, CpuStream) {
    cpu::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  static void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                             int N, int C, int OC, CpuStream) {
    cpu::matmul_forward(out, inp, weight, bias, N, C, OC);
  }
  static void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                              const float* inp, const float* weight, int N, int C, int OC,
                              CpuStream) {
    cpu::matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
  }
  static void gelu_forward(float* out, const float* inp, int64_t n, CpuStream) {
    cpu::gelu_forward(out, inp, n);
  }
  static void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n,
                            CpuStream) {
    cpu::gelu_backward(dinp, inp, dout, n);
  }
  // The scratch keeps the softmax probabilities [B, NH, T, T] for backward.
  static int64_t attention_scratch_floats(int B, int T, int NH) {
    return int64_t{B} * NH * T * T;
  }
  static void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C,
                                int NH, CpuStream) {
    cpu::attention_forward(out, att, qkv, B, T, C, NH);
  }
  static void attention_backward(float* dqkv, float* att, const float* dout, const float* qkv,
                                 const float* /*out*/, int B, int T, int C, int NH, CpuStream) {
    cpu::attention_backward(dqkv, dout, qkv, att, B, T, C, NH);
  }
  static void residual_forward(float* out, const float* a, const float* b, int64_t n, CpuStream) {
    cpu::residual_forward(out, a, b, n);
  }
  static void accumulate(float* dst, const float* src, int64_t n, CpuStream) {
    cpu::accumulate(dst, src, n);
  }
  static void maxout_forward(float* out, const float* inp, int N, int C, int k, CpuStream) {
    cpu::maxout_forward(out, inp, N, C, k);
  }
  static void maxout_backward(float* dinp, const float* dout, const float* inp, int N, int C, int k, CpuStream) {
    cpu::maxout_backward(dinp, dout, inp, N, C, k);
  }
  static void fill_zero(float* dst, int64_t n, CpuStream) {
    std::memset(dst, 0, static_cast<size_t>(n) * sizeof(float));
  }
  static void cross_entropy_forward_backward(float* losses, float* dlogits, const float* logits,
                                             const int32_t* targets, int N, int V,
                                             float dloss_scale, CpuStream) {
    cpu::cross_entropy_forward_backward(losses, dlogits, logits, targets, N, V, dloss_scale);
  }
  static Status synchronize(CpuStream) { return Status::ok(); }

 private:
  static void copy(float* dst, const float* src, int64_t n) {
    if (dst != src) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  }
};

static_assert(Backend<CpuBackend>);
static_assert(MaxoutBackend<CpuBackend>);

}  // namespace swarm
