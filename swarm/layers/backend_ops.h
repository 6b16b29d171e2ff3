// backend_ops: the ops that swarm/layers needs beyond the Backend concept, as
// opt-in refinements in the manner of swarm/api/backend.h.
//
// A GPT stage never uses tanh or a mean-squared-error loss, so the Backend
// concept leaves them out; the Tanh and MeanSquaredError layers ask for them
// here instead. A backend opts in with the tag as well as the functions, so a
// same-named function elsewhere is never picked up by accident. HostOps
// (host_ops.h) adds both to any CPU backend.
//
//   template <swarm::layers::TanhBackend B>
//   void squash(float* y, const float* x, int64_t n, typename B::stream_type s) {
//     B::tanh_forward(y, x, n, s);
//   }
#pragma once

#include <concepts>
#include <cstdint>

#include "swarm/api/backend.h"

namespace swarm::layers {

struct tanh_t {};
struct mean_squared_error_t {};

// out = tanh(inp); the backward ADDS dout * (1 - tanh(inp)^2) into dinp,
// recomputing tanh from inp as gelu_backward does.
template <typename B>
concept TanhBackend =
    Backend<B> && std::same_as<typename B::tanh_concept, tanh_t> &&
    requires(typename B::value_type* x, const typename B::value_type* cx, int64_t n, typename B::stream_type s) {
      B::tanh_forward(x, cx, n, s);
      B::tanh_backward(x, cx, cx, n, s);
    };

// Over rows of pred and targets [N, C]: losses[N] gets the row's mean of
// (pred - target)^2; dpred (if not null) is overwritten with
// 2 * (pred - target) / C * dloss_scale, as cross_entropy_forward_backward does
// for its logits.
template <typename B>
concept MeanSquaredErrorBackend =
    Backend<B> && std::same_as<typename B::mean_squared_error_concept, mean_squared_error_t> &&
    requires(float* losses, typename B::value_type* x, const typename B::value_type* cx, int n,
             typename B::stream_type s) {
      B::mean_squared_error_forward_backward(losses, x, cx, cx, n, n, 1.0f, s);
    };

}  // namespace swarm::layers
