// backend: the Backend concept, a compute device that runs a GPT stage.
//
// A backend opts in explicitly with `using backend_concept = swarm::backend_t;`
// (a type with the right member names but no tag is not a backend), names its
// Device, its stream type and its value_type (the element type of activations
// and of the weights it computes with: float on the CPU, bf16 or float on
// CUDA), and provides the op set as static functions that take device pointers
// and the stream last. Parameter gradients, LayerNorm statistics, losses and
// the attention scratch are always float, so gradients accumulate over
// microbatches without bf16 rounding and the optimizer keeps fp32 master
// weights. Model code is written once against this concept.
//
// Ops may run asynchronously on the stream; a failure is reported by the next
// synchronize(), which returns the first error since the last one.
//
//   template <swarm::Backend B>
//   void project(typename B::value_type* y, const typename B::value_type* x,
//                const typename B::value_type* w, int N, int C, int OC,
//                typename B::stream_type stream) {
//     B::matmul_forward(y, x, w, nullptr, N, C, OC, stream);
//   }
#pragma once

#include <concepts>
#include <cstdint>

#include "swarm/core/status.h"
#include "swarm/core/tensor.h"

namespace swarm {

struct backend_t {};

template <typename B>
concept Backend =
    std::same_as<typename B::backend_concept, backend_t> &&
    std::same_as<std::remove_cvref_t<decltype(B::device)>, Device> &&
    requires(typename B::value_type* x, const typename B::value_type* cx, float* f, const float* cf,
             const int32_t* ci, int n, int64_t n64, typename B::stream_type stream) {
      { B::initialize() } -> std::same_as<Status>;
      // Activations and compute weights <-> float (the wire and the master weights).
      { B::to_values(x, cf, n64, stream) };
      { B::to_floats(f, cx, n64, stream) };
      { B::embedding_forward(x, ci, cx, cx, n, n, n, n, stream) };
      { B::embedding_backward(f, f, cx, ci, n, n, n, n, stream) };
      { B::layernorm_forward(x, f, f, cx, cx, cx, n, n, stream) };
      { B::layernorm_backward(x, f, f, cx, cx, cx, cf, cf, n, n, stream) };
      { B::matmul_forward(x, cx, cx, cx, n, n, n, stream) };
      { B::matmul_backward(x, f, f, cx, cx, cx, n, n, n, stream) };
      { B::gelu_forward(x, cx, n64, stream) };
      { B::gelu_backward(x, cx, cx, n64, stream) };
      { B::attention_scratch_floats(n, n, n) } -> std::same_as<int64_t>;
      { B::attention_forward(x, f, cx, n, n, n, n, stream) };
      { B::attention_backward(x, f, cx, cx, cx, n, n, n, n, stream) };
      { B::residual_forward(x, cx, cx, n64, stream) };
      { B::accumulate(x, cx, n64, stream) };
      { B::fill_zero(x, n64, stream) };
      { B::fill_zero(f, n64, stream) };
      { B::cross_entropy_forward_backward(f, x, cx, ci, n, n, 1.0f, stream) };
      { B::synchronize(stream) } -> std::same_as<Status>;
    };

// Refinements: optional ops and fused ops. A backend opts in with the tag as well as the
// functions, so a model never picks up a same-named function by accident.
struct fused_residual_layernorm_t {};
struct fused_matmul_gelu_t {};
struct maxout_t {};

// residual = a + b, then out = layernorm(residual), in one pass.
template <typename B>
concept FusedResidualLayernormBackend =
    Backend<B> && std::same_as<typename B::fused_residual_layernorm_concept, fused_residual_layernorm_t> &&
    requires(typename B::value_type* x, const typename B::value_type* cx, float* f, typename B::stream_type s) {
      B::residual_layernorm_forward(x, x, f, f, cx, cx, cx, cx, 1, 1, s);
    };

// GEMM with the GELU in its epilogue (keeping the pre-activation), and its backward
// with the GELU derivative fused.
template <typename B>
concept FusedMatmulGeluBackend =
    Backend<B> && std::same_as<typename B::fused_matmul_gelu_concept, fused_matmul_gelu_t> &&
    requires(typename B::value_type* x, const typename B::value_type* cx, float* f, typename B::stream_type s) {
      B::matmul_gelu_forward(x, x, cx, cx, cx, 1, 1, 1, s);
      B::matmul_backward_dgelu(x, f, f, cx, cx, cx, cx, 1, 1, 1, s);
    };

// Maxout over k contiguous slices of each row of C values, for the boundary
// layers of models/gpt: out[n, j] = max_g inp[n, g * C/k + j], [N, C/k]. The
// backward ADDS dout[n, j] into dinp at the first index of the maximum (ties go
// to the lowest g; a NaN counts as the maximum), recomputed from inp.
template <typename B>
concept MaxoutBackend =
    Backend<B> && std::same_as<typename B::maxout_concept, maxout_t> &&
    requires(typename B::value_type* x, const typename B::value_type* cx, typename B::stream_type s) {
      B::maxout_forward(x, cx, 1, 1, 1, s);
      B::maxout_backward(x, cx, cx, 1, 1, 1, s);
    };

}  // namespace swarm
