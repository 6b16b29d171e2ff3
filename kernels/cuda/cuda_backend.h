// cuda_backend: the CUDA models of the Backend concept, over the hand-written
// kernels in kernels/cuda, cuBLASLt GEMMs and (optionally) cuDNN attention.
//
// CudaBackendT<Value, Attention> is a template so the value type (float or
// bf16) and the attention implementation are chosen at compile time; the three
// useful instantiations have names below. Ops are stream-ordered and return at
// once; a launcher's error Status is kept in the stream's error slot and
// returned by the next synchronize(), so model code stays free of checks while
// no failure is lost. Beyond the concept, the backend offers fused ops (residual
// + layernorm, GEMM + GELU epilogues) that GptStage uses when present, and the
// maxout op (MaxoutBackend) of maxout boundary layers.
//
//   static_assert(swarm::Backend<swarm::CudaBf16Backend>);
//   auto stage = swarm::gpt::GptStage<swarm::CudaBf16Backend>::create(config, layout, seed);
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <utility>

#include "swarm/api/backend.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/device_updater.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/layernorm.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/maxout.h"

namespace swarm {

// A CUDA stream plus the first error of the ops queued on it since the last
// synchronize(). Copies share the slot. The null handle is the legacy default
// stream, which orders against the allocator's synchronous copies.
struct CudaStream {
  cudaStream_t handle = nullptr;
  std::shared_ptr<Status> first_error = std::make_shared<Status>();

  void record(Status status) const {
    if (!status.is_ok() && first_error->is_ok()) *first_error = std::move(status);
  }
};

enum class CudaAttention { flash, cudnn };

template <typename Value, CudaAttention kAttention = CudaAttention::flash>
struct CudaBackendT {
  using backend_concept = backend_t;
  using fused_residual_layernorm_concept = fused_residual_layernorm_t;
  using fused_matmul_gelu_concept = fused_matmul_gelu_t;
  using maxout_concept = maxout_t;
  using stream_type = CudaStream;
  using value_type = Value;
  using updater_type = cuda::DeviceUpdater;  // steps the fp32 masters where they live
  static constexpr Device device = Device::cuda;

  static Status initialize() { return cuda::install_cuda_allocator(); }

  static void to_values(Value* dst, const float* src, int64_t n, CudaStream s) { convert(dst, src, n, s); }
  static void to_floats(float* dst, const Value* src, int64_t n, CudaStream s) { convert(dst, src, n, s); }

  static void embedding_forward(Value* out, const int32_t* tokens, const Value* wte, const Value* wpe, int B, int T,
                                int C, int V, CudaStream s) {
    s.record(cuda::embedding_forward(out, tokens, wte, wpe, B, T, C, V, s.handle));
  }
  static void embedding_backward(float* dwte, float* dwpe, const Value* dout, const int32_t* tokens, int B, int T,
                                 int C, int V, CudaStream s) {
    s.record(cuda::embedding_backward(dwte, dwpe, dout, tokens, B, T, C, V, s.handle));
  }
  static void layernorm_forward(Value* out, float* mean, float* rstd, const Value* inp, const Value* weight,
                                const Value* bias, int N, int C, CudaStream s) {
    s.record(cuda::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, s.handle));
  }
  static void residual_layernorm_forward(Value* residual, Value* out, float* mean, float* rstd, const Value* a,
                                         const Value* b, const Value* weight, const Value* bias, int N, int C,
                                         CudaStream s) {
    s.record(cuda::residual_layernorm_forward(residual, out, mean, rstd, a, b, weight, bias, N, C, s.handle));
  }
  static void layernorm_backward(Value* dinp, float* dweight, float* dbias, const Value* dout, const Value* inp,
                                 const Value* weight, const float* mean, const float* rstd, int N, int C,
                                 CudaStream s) {
    s.record(cuda::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, s.handle));
  }
  static void matmul_forward(Value* out, const Value* inp, const Value* weight, const Value* bias, int N, int C,
                             int OC, CudaStream s) {
    s.record(cuda::matmul_forward(out, inp, weight, bias, N, C, OC, s.handle));
  }
  static void matmul_gelu_forward(Value* out, Value* pre_gelu, const Value* inp, const Value* weight,
                                  const Value* bias, int N, int C, int OC, CudaStream s) {
    s.record(cuda::matmul_gelu_forward(out, pre_gelu, inp, weight, bias, N, C, OC, s.handle));
  }
  static void matmul_backward(Value* dinp, float* dweight, float* dbias, const Value* dout, const Value* inp,
                              const Value* weight, int N, int C, int OC, CudaStream s) {
    s.record(cuda::matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, s.handle));
  }
  static void matmul_backward_dgelu(Value* dpre, float* dweight, float* dbias, const Value* dout, const Value* inp,
                                    const Value* weight, const Value* pre_gelu, int N, int C, int OC, CudaStream s) {
    s.record(cuda::matmul_backward_dgelu(dpre, dweight, dbias, dout, inp, weight, pre_gelu, N, C, OC, s.handle));
  }
  static void gelu_forward(Value* out, const Value* inp, int64_t n, CudaStream s) {
    s.record(cuda::gelu_forward(out, inp, n, s.handle));
  }
  static void gelu_backward(Value* dinp, const Value* inp, const Value* dout, int64_t n, CudaStream s) {
    s.record(cuda::gelu_backward(dinp, inp, dout, n, s.handle));
  }

  static int64_t attention_scratch_floats(int B, int T, int NH) {
    if constexpr (kAttention == CudaAttention::cudnn) {
      return cuda::cudnn_attention_scratch_floats(B, T, NH);
    } else {
      return cuda::attention_scratch_floats(B, T, NH);
    }
  }
  static void attention_forward(Value* out, float* scratch, const Value* qkv, int B, int T, int C, int NH,
                                CudaStream s) {
    if constexpr (kAttention == CudaAttention::cudnn) {
      s.record(cuda::cudnn_attention_forward(out, scratch, qkv, B, T, C, NH, s.handle));
    } else {
      s.record(cuda::attention_forward(out, scratch, qkv, B, T, C, NH, s.handle));
    }
  }
  static void attention_backward(Value* dqkv, float* scratch, const Value* dout, const Value* qkv, const Value* out,
                                 int B, int T, int C, int NH, CudaStream s) {
    if constexpr (kAttention == CudaAttention::cudnn) {
      s.record(cuda::cudnn_attention_backward(dqkv, scratch, dout, qkv, out, B, T, C, NH, s.handle));
    } else {
      s.record(cuda::attention_backward(dqkv, scratch, dout, qkv, out, B, T, C, NH, s.handle));
    }
  }

  static void residual_forward(Value* out, const Value* a, const Value* b, int64_t n, CudaStream s) {
    s.record(cuda::residual_forward(out, a, b, n, s.handle));
  }
  static void accumulate(Value* dst, const Value* src, int64_t n, CudaStream s) {
    s.record(cuda::accumulate(dst, src, n, s.handle));
  }
  static void maxout_forward(Value* out, const Value* inp, int N, int C, int k, CudaStream s) {
    s.record(cuda::maxout_forward(out, inp, N, C, k, s.handle));
  }
  static void maxout_backward(Value* dinp, const Value* dout, const Value* inp, int N, int C, int k, CudaStream s) {
    s.record(cuda::maxout_backward(dinp, dout, inp, N, C, k, s.handle));
  }
  static void fill_zero(float* dst, int64_t n, CudaStream s) { s.record(cuda::fill_zero(dst, n, s.handle)); }
  static void fill_zero(bf16* dst, int64_t n, CudaStream s)
    requires std::is_same_v<Value, bf16>
  {
    s.record(cuda::fill_zero(dst, n, s.handle));
  }
  static void cross_entropy_forward_backward(float* losses, Value* dlogits, const Value* logits,
                                             const int32_t* targets, int N, int V, float dloss_scale, CudaStream s) {
    s.record(cuda::cross_entropy_forward_backward(losses, dlogits, logits, targets, N, V, dloss_scale, s.handle));
  }

  // Waits for the stream; returns the first error of the ops since the last call.
  static Status synchronize(CudaStream s) {
    s.record(cuda::cuda_status(cudaStreamSynchronize(s.handle), "cudaStreamSynchronize", __FILE__, __LINE__));
    return std::exchange(*s.first_error, Status::ok());
  }

 private:
  // Between float and Value: a copy when they are the same type, else a conversion.
  template <typename Dst, typename Src>
  static void convert(Dst* dst, const Src* src, int64_t n, CudaStream s) {
    if constexpr (std::is_same_v<Dst, Src>) {
      if (dst == src) return;
      s.record(cuda::cuda_status(cudaMemcpyAsync(dst, src, n * sizeof(Dst), cudaMemcpyDeviceToDevice, s.handle),
                                 "cudaMemcpyAsync", __FILE__, __LINE__));
    } else {
      s.record(cuda::convert(dst, src, n, s.handle));
    }
  }
};

// fp32 everywhere: the reference-accuracy CUDA path.
using CudaBackend = CudaBackendT<float>;
// bf16 activations and compute weights, fp32 masters, gradients and statistics.
using CudaBf16Backend = CudaBackendT<bf16>;
// As CudaBf16Backend, with cuDNN's fused attention instead of the hand-written one.
using CudaBf16CudnnBackend = CudaBackendT<bf16, CudaAttention::cudnn>;

static_assert(Backend<CudaBackend>);
static_assert(Backend<CudaBf16Backend>);
static_assert(Backend<CudaBf16CudnnBackend>);
// Every CUDA backend fuses the residual into the LayerNorm and the GELU into the GEMM epilogue.
static_assert(FusedResidualLayernormBackend<CudaBackend> && FusedMatmulGeluBackend<CudaBackend>);
static_assert(FusedResidualLayernormBackend<CudaBf16Backend> && FusedMatmulGeluBackend<CudaBf16Backend>);
static_assert(FusedResidualLayernormBackend<CudaBf16CudnnBackend> && FusedMatmulGeluBackend<CudaBf16CudnnBackend>);
// Every CUDA backend computes maxout boundary layers.
static_assert(MaxoutBackend<CudaBackend> && MaxoutBackend<CudaBf16Backend> && MaxoutBackend<CudaBf16CudnnBackend>);

}  // namespace swarm
