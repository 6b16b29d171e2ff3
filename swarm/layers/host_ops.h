// host_ops: a CPU backend plus the ops of backend_ops.h, computed on the host.
//
// swarm/ never includes kernels/, so the CPU kernels cannot grow these ops from
// here; instead HostOps<B> derives from any f32 backend whose memory is host
// memory and adds them, keeping every op and tag of B. Layers are then
// instantiated on HostOps<B> in place of B.
//
//   using Cpu = swarm::layers::HostOps<swarm::CpuBackend>;
//   static_assert(swarm::layers::TanhBackend<Cpu>);
#pragma once

#include <cmath>
#include <concepts>
#include <cstdint>

#include "swarm/api/backend.h"
#include "swarm/layers/backend_ops.h"

namespace swarm::layers {

template <Backend B>
  requires(B::device == Device::cpu && std::same_as<typename B::value_type, float>)
struct HostOps : B {
  using tanh_concept = tanh_t;
  using mean_squared_error_concept = mean_squared_error_t;
  using stream_type = typename B::stream_type;

  static void tanh_forward(float* out, const float* inp, int64_t n, stream_type) {
    for (int64_t i = 0; i < n; ++i) out[i] = std::tanh(inp[i]);
  }

  static void tanh_backward(float* dinp, const float* inp, const float* dout, int64_t n, stream_type) {
    for (int64_t i = 0; i < n; ++i) {
      const float y = std::tanh(inp[i]);
      dinp[i] += dout[i] * (1.0f - y * y);
    }
  }

  static void mean_squared_error_forward_backward(float* losses, float* dpred, const float* pred,
                                                  const float* targets, int N, int C, float dloss_scale,
                                                  stream_type) {
    const float gradient_scale = 2.0f * dloss_scale / static_cast<float>(C);
    for (int64_t row = 0; row < N; ++row) {
      const float* p = pred + row * C;
      const float* t = targets + row * C;
      // Summed in double so a wide row's loss does not drift with C.
      double squares = 0;
      for (int c = 0; c < C; ++c) squares += double(p[c] - t[c]) * (p[c] - t[c]);
      losses[row] = static_cast<float>(squares / C);
      if (dpred == nullptr) continue;
      for (int c = 0; c < C; ++c) dpred[row * C + c] = gradient_scale * (p[c] - t[c]);
    }
  }
};

}  // namespace swarm::layers
