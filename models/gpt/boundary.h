// boundary: the compression-aware layers at a stage cut (SWARM §4.3), on any Backend.
//
// The cut after stage i carries [N, W] with W = C/k instead of the residual
// stream [N, C] (N = B*T rows, C = d_model), so the wire moves k times fewer
// values:
//
//   stage i (sender)                             stage i+1 (receiver)
//   x -> LayerNorm(C) -> bottleneck: Linear(C -> W)    wire -> Linear(W -> C) -> LayerNorm(C) -> blocks
//                        maxout:     max over k slices
//
// Maxout's output j is max_g ln[g*W + j], the max over the k contiguous slices
// of the row; its backward routes each gradient to the first index reaching the
// maximum (ties go to the lowest slice), recomputed from the saved input.
//
// Why LayerNorm sits where it does: the sender normalizes before compressing,
// so the projection (or the max, which compares features across slices) sees
// features on one scale whatever the residual stream's drift, and the 8-bit
// codec meets a well-conditioned tensor. The receiver normalizes after
// expanding, so the next block reads a residual stream of unit scale whatever
// the up-projection's scale; the stage's first block then adds to that stream
// as usual.
//
// Parameters are global names keyed by the cut, so every peer of a stage and
// every split with the same cut initializes them alike:
//   sender   boundary.<i>.ln.{weight,bias}, boundary.<i>.down.{weight,bias} (bottleneck only)
//   receiver boundary.<i>.up.{weight,bias}, boundary.<i>.up_ln.{weight,bias}
//
//   sending_boundary_forward<B>(layer, params, acts, x, N, C, stream);    // acts.wire_out
//   receiving_boundary_forward<B>(layer, params, acts, wire, N, C, stream);  // acts.up_ln
#pragma once

#include <string>

#include "models/gpt/config.h"
#include "models/gpt/init.h"
#include "swarm/api/backend.h"
#include "swarm/core/tensor.h"

namespace swarm::gpt {

// Where one end of a cut keeps its parameters in the stage's list; -1: absent
// (no compressing cut there, or maxout's missing projection). proj is the
// sender's down-projection or the receiver's up-projection.
struct BoundaryParamIndices {
  int ln_w = -1, ln_b = -1, proj_w = -1, proj_b = -1;
};

// The weights one call computes with, and the float gradients it adds into.
template <Backend B>
struct BoundaryParams {
  using X = typename B::value_type;
  const X *ln_w = nullptr, *ln_b = nullptr, *proj_w = nullptr, *proj_b = nullptr;
  float *ln_w_grad = nullptr, *ln_b_grad = nullptr, *proj_w_grad = nullptr, *proj_b_grad = nullptr;
};

// One forward's boundary tensors, parked with the rest of the forward. Only the
// ends a stage has are allocated.
struct BoundaryActivations {
  Tensor send_ln, send_ln_mean, send_ln_rstd, wire_out;  // sender: [N, C], [N], [N], [N, W]
  Tensor up, up_ln, up_ln_mean, up_ln_rstd;              // receiver: [N, C], [N, C], [N], [N]
  Tensor wire_out_grad;                                  // sender: the uploaded output gradient [N, W]
  Tensor wire_in_grad;                                   // receiver: the input gradient [N, W]
  Tensor scratch;                                        // [N, C], between the two layers of an end
};

// add(name, shape, kind, stddev) -> index creates one parameter of the stage.
template <typename Add>
BoundaryParamIndices add_sending_boundary_params(const BoundaryLayer& layer, int cut, int64_t C, Add&& add) {
  BoundaryParamIndices p;
  if (!layer.compresses()) return p;
  const std::string prefix = "boundary." + std::to_string(cut) + ".";
  p.ln_w = add(prefix + "ln.weight", Shape{C}, InitKind::ones, 0.0f);
  p.ln_b = add(prefix + "ln.bias", Shape{C}, InitKind::zeros, 0.0f);
  if (layer.kind == BoundaryKind::bottleneck) {
    const int64_t W = layer.wire_width(static_cast<int>(C));
    p.proj_w = add(prefix + "down.weight", Shape{W, C}, InitKind::normal, 0.02f);
    p.proj_b = add(prefix + "down.bias", Shape{W}, InitKind::zeros, 0.0f);
  }
  return p;
}

template <typename Add>
BoundaryParamIndices add_receiving_boundary_params(const BoundaryLayer& layer, int cut, int64_t C, Add&& add) {
  BoundaryParamIndices p;
  if (!layer.compresses()) return p;
  const std::string prefix = "boundary." + std::to_string(cut) + ".";
  const int64_t W = layer.wire_width(static_cast<int>(C));
  p.proj_w = add(prefix + "up.weight", Shape{C, W}, InitKind::normal, 0.02f);
  p.proj_b = add(prefix + "up.bias", Shape{C}, InitKind::zeros, 0.0f);
  p.ln_w = add(prefix + "up_ln.weight", Shape{C}, InitKind::ones, 0.0f);
  p.ln_b = add(prefix + "up_ln.bias", Shape{C}, InitKind::zeros, 0.0f);
  return p;
}

template <Backend B>
Status allocate_boundary_buffers(BoundaryActivations& a, const BoundaryLayer& send, const BoundaryLayer& receive,
                                 int64_t N, int64_t C) {
  auto make = [&](Tensor* t, Shape shape, DType dtype = dtype_of_v<typename B::value_type>) -> Status {
    SWARM_ASSIGN_OR_RETURN(*t, Tensor::empty(shape, dtype, B::device));
    return Status::ok();
  };
  if (send.compresses()) {
    const int64_t W = send.wire_width(static_cast<int>(C));
    SWARM_RETURN_IF_ERROR(make(&a.send_ln, Shape{N, C}));
    SWARM_RETURN_IF_ERROR(make(&a.send_ln_mean, Shape{N}, DType::f32));
    SWARM_RETURN_IF_ERROR(make(&a.send_ln_rstd, Shape{N}, DType::f32));
    SWARM_RETURN_IF_ERROR(make(&a.wire_out, Shape{N, W}));
    SWARM_RETURN_IF_ERROR(make(&a.wire_out_grad, Shape{N, W}));
  }
  if (receive.compresses()) {
    const int64_t W = receive.wire_width(static_cast<int>(C));
    SWARM_RETURN_IF_ERROR(make(&a.up, Shape{N, C}));
    SWARM_RETURN_IF_ERROR(make(&a.up_ln, Shape{N, C}));
    SWARM_RETURN_IF_ERROR(make(&a.up_ln_mean, Shape{N}, DType::f32));
    SWARM_RETURN_IF_ERROR(make(&a.up_ln_rstd, Shape{N}, DType::f32));
    SWARM_RETURN_IF_ERROR(make(&a.wire_in_grad, Shape{N, W}));
  }
  if (send.compresses() || receive.compresses()) SWARM_RETURN_IF_ERROR(make(&a.scratch, Shape{N, C}));
  return Status::ok();
}

namespace boundary_detail {
template <Backend B>
typename B::value_type* values(const Tensor& t) {
  return t.template data<typename B::value_type>();
}
inline float* floats(const Tensor& t) { return t.data<float>(); }
}  // namespace boundary_detail

// x [N, C] (the last block's output) -> a.wire_out [N, W].
template <Backend B>
void sending_boundary_forward(const BoundaryLayer& layer, const BoundaryParams<B>& p, BoundaryActivations& a,
                              const typename B::value_type* x, int N, int C, typename B::stream_type stream) {
  using boundary_detail::floats;
  using boundary_detail::values;
  B::layernorm_forward(values<B>(a.send_ln), floats(a.send_ln_mean), floats(a.send_ln_rstd), x, p.ln_w, p.ln_b, N,
                       C, stream);
  if (layer.kind == BoundaryKind::bottleneck) {
    B::matmul_forward(values<B>(a.wire_out), values<B>(a.send_ln), p.proj_w, p.proj_b, N, C,
                      layer.wire_width(C), stream);
  } else if constexpr (MaxoutBackend<B>) {
    B::maxout_forward(values<B>(a.wire_out), values<B>(a.send_ln), N, C, layer.k, stream);
  }  // else: GptStage::create refuses maxout on a backend without the op
}

// From a.wire_out_grad = dL/d(wire_out) [N, W]: overwrites dx [N, C] with dL/dx
// and adds the parameter gradients.
template <Backend B>
void sending_boundary_backward(const BoundaryLayer& layer, const BoundaryParams<B>& p, BoundaryActivations& a,
                               const typename B::value_type* x, typename B::value_type* dx, int N, int C,
                               typename B::stream_type stream) {
  using boundary_detail::floats;
  using boundary_detail::values;
  const int64_t NC = int64_t{N} * C;
  B::fill_zero(values<B>(a.scratch), NC, stream);
  if (layer.kind == BoundaryKind::bottleneck) {
    B::matmul_backward(values<B>(a.scratch), p.proj_w_grad, p.proj_b_grad, values<B>(a.wire_out_grad),
                       values<B>(a.send_ln), p.proj_w, N, C, layer.wire_width(C), stream);
  } else if constexpr (MaxoutBackend<B>) {
    B::maxout_backward(values<B>(a.scratch), values<B>(a.wire_out_grad), values<B>(a.send_ln), N, C, layer.k,
                       stream);
  }
  B::fill_zero(dx, NC, stream);
  B::layernorm_backward(dx, p.ln_w_grad, p.ln_b_grad, values<B>(a.scratch), x, p.ln_w, floats(a.send_ln_mean),
                        floats(a.send_ln_rstd), N, C, stream);
}

// wire [N, W] (the stage input) -> a.up_ln [N, C], the stream the first block reads.
template <Backend B>
void receiving_boundary_forward(const BoundaryLayer& layer, const BoundaryParams<B>& p, BoundaryActivations& a,
                                const typename B::value_type* wire, int N, int C, typename B::stream_type stream) {
  using boundary_detail::floats;
  using boundary_detail::values;
  B::matmul_forward(values<B>(a.up), wire, p.proj_w, p.proj_b, N, layer.wire_width(C), C, stream);
  B::layernorm_forward(values<B>(a.up_ln), floats(a.up_ln_mean), floats(a.up_ln_rstd), values<B>(a.up), p.ln_w,
                       p.ln_b, N, C, stream);
}

// From d = dL/d(up_ln) [N, C]: returns dL/d(wire) [N, W] (a.wire_in_grad) and
// adds the parameter gradients.
template <Backend B>
const typename B::value_type* receiving_boundary_backward(const BoundaryLayer& layer, const BoundaryParams<B>& p,
                                                          BoundaryActivations& a, const typename B::value_type* wire,
                                                          const typename B::value_type* d, int N, int C,
                                                          typename B::stream_type stream) {
  using boundary_detail::floats;
  using boundary_detail::values;
  const int W = layer.wire_width(C);
  B::fill_zero(values<B>(a.scratch), int64_t{N} * C, stream);
  B::layernorm_backward(values<B>(a.scratch), p.ln_w_grad, p.ln_b_grad, d, values<B>(a.up), p.ln_w,
                        floats(a.up_ln_mean), floats(a.up_ln_rstd), N, C, stream);
  B::fill_zero(values<B>(a.wire_in_grad), int64_t{N} * W, stream);
  B::matmul_backward(values<B>(a.wire_in_grad), p.proj_w_grad, p.proj_b_grad, values<B>(a.scratch), wire, p.proj_w,
                     N, W, C, stream);
  return values<B>(a.wire_in_grad);
}

}  // namespace swarm::gpt
