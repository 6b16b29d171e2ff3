// backend: the Backend concept, a compute device that runs a GPT stage.
//
// A backend opts in explicitly with `using backend_concept = swarm::backend_t;`
// (a type with the right member names but no tag is not a backend), names its
// Device and stream type, and provides the op set as static functions that take
// device pointers and the stream last. Model code is written once against
// this concept and instantiated per backend.
//
//   template <swarm::Backend B>
//   void project(float* y, const float* x, const float* w, int N, int C, int OC,
//                typename B::stream_type stream) {
//     B::matmul_forward(y, x, w, nullptr, N, C, OC, stream);
//   }
#pragma once

#include <concepts>
#include <cstdint>

#include "swarm/core/tensor.h"

namespace swarm {

struct backend_t {};

template <typename B>
concept Backend =
    std::same_as<typename B::backend_concept, backend_t> &&
    std::same_as<std::remove_cvref_t<decltype(B::device)>, Device> &&
    requires(float* f, const float* cf, const int32_t* ci, int n, int64_t n64,
             typename B::stream_type stream) {
      { B::embedding_forward(f, ci, cf, cf, n, n, n, stream) };
      { B::embedding_backward(f, f, cf, ci, n, n, n, stream) };
      { B::layernorm_forward(f, f, f, cf, cf, cf, n, n, stream) };
      { B::layernorm_backward(f, f, f, cf, cf, cf, cf, cf, n, n, stream) };
      { B::matmul_forward(f, cf, cf, cf, n, n, n, stream) };
      { B::matmul_backward(f, f, f, cf, cf, cf, n, n, n, stream) };
      { B::gelu_forward(f, cf, n64, stream) };
      { B::gelu_backward(f, cf, cf, n64, stream) };
      { B::attention_forward(f, f, cf, n, n, n, n, stream) };
      { B::attention_backward(f, cf, cf, cf, n, n, n, n, stream) };
      { B::residual_forward(f, cf, cf, n64, stream) };
      { B::accumulate(f, cf, n64, stream) };
      { B::fill_zero(f, n64, stream) };
      { B::cross_entropy_forward_backward(f, f, cf, ci, n, n, 1.0f, stream) };
      { B::synchronize(stream) };
    };

}  // namespace swarm
