// cudnn_attention: the cuDNN backend-API graphs for causal attention, their plans,
// and the per-device state that keeps them. See cudnn_attention.h for the contract.
//
// The graphs follow the operation pattern cuDNN's fused flash-attention engines
// match (the same one cudnn-frontend lowers its SDPA nodes to for cuDNN < 9.21):
//
//   forward:  S = (Q·Kᵀ)·scale; S = row >= col ? S : -inf;
//             m = rowmax S; E = exp(S - m); l = rowsum E; stats = m + log l;
//             O = bf16(E / l)·V
//   backward: D = rowsum(dO ⊙ O)            (a real float tensor in our workspace)
//             P = exp(mask((Q·Kᵀ)·scale - stats));
//             dV = bf16(P)ᵀ·dO; dS = P ⊙ (dO·Vᵀ - D)·scale;
//             dK = bf16(dS)ᵀ·Q; dQ = dS·K
//
// K (and V in backward) enter as their transposes: the same memory with the last
// two dims and strides swapped. Virtual tensors carry float, except the operands
// the engines feed to the second GEMMs, which are bf16 like the inputs.
#include "kernels/cuda/cudnn_attention.h"

#include <cudnn_graph.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "kernels/cuda/cuda_check.h"

namespace swarm::cuda {
namespace cudnn_attention_detail {
// dst += src, elementwise (cudnn_attention_add.cu).
Status add_into(bf16* dst, const bf16* src, int64_t n, cudaStream_t stream);
}  // namespace cudnn_attention_detail

namespace {

// ---------------------------------------------------------------------------------
// Checked cuDNN calls.

Status cudnn_status(cudnnStatus_t status, const char* call, const char* file, int line) {
  if (status == CUDNN_STATUS_SUCCESS) return Status::ok();
  char detail[1024] = {0};
  cudnnGetLastErrorString(detail, sizeof(detail));
  StatusCode code = StatusCode::internal;
  // cuDNN 9 groups its codes by thousands; 3xxx all mean "not supported".
  if (static_cast<int>(status) / 1000 == CUDNN_STATUS_NOT_SUPPORTED / 1000) code = StatusCode::unimplemented;
  if (status == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
      status == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED) {
    code = StatusCode::resource_exhausted;
  }
  return Status(code, fmt::format("{}:{}: {} failed: {} ({}){}{}", file, line, call, cudnnGetErrorString(status),
                                  static_cast<int>(status), detail[0] != '\0' ? ": " : "", detail));
}

#define SWARM_CUDNN_RETURN_IF_ERROR(call) \
  SWARM_RETURN_IF_ERROR(cudnn_status((call), #call, __FILE__, __LINE__))

// Owns one backend descriptor.
class Descriptor {
 public:
  Descriptor() = default;
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  Descriptor(Descriptor&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  Descriptor& operator=(Descriptor&& other) noexcept {
    if (this != &other) {
      reset();
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  ~Descriptor() { reset(); }

  Status create(cudnnBackendDescriptorType_t type) {
    reset();
    SWARM_CUDNN_RETURN_IF_ERROR(cudnnBackendCreateDescriptor(type, &handle_));
    return Status::ok();
  }
  cudnnBackendDescriptor_t get() const { return handle_; }

 private:
  void reset() {
    if (handle_ != nullptr) cudnnBackendDestroyDescriptor(handle_);
    handle_ = nullptr;
  }
  cudnnBackendDescriptor_t handle_ = nullptr;
};

// The attribute number goes into the message: the call text alone would not say which.
Status set_attr(cudnnBackendDescriptor_t desc, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                int64_t count, const void* values) {
  Status status = cudnn_status(cudnnBackendSetAttribute(desc, name, type, count, values), "cudnnBackendSetAttribute",
                               __FILE__, __LINE__);
  return status.with_context(fmt::format("attribute {}", static_cast<int>(name)));
}

Status set_desc(cudnnBackendDescriptor_t desc, cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t value) {
  return set_attr(desc, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
}

Status finalize(cudnnBackendDescriptor_t desc, const char* what) {
  return cudnn_status(cudnnBackendFinalize(desc), "cudnnBackendFinalize", __FILE__, __LINE__).with_context(what);
}

// ---------------------------------------------------------------------------------
// Graph construction.

using Dims = std::array<int64_t, 4>;

// Tensor ids the variant pack names; virtual tensors count up from kFirstVirtualUid.
enum : int64_t {
  kUidQ = 1,
  kUidK,
  kUidV,
  kUidO,
  kUidStats,
  kUidScale,
  kUidNegInf,
  kUidOne,
  kUidDO,
  kUidDQ,
  kUidDK,
  kUidDV,
  kUidRowDot,
  kUidDQAccum,
  kFirstVirtualUid = 100,
};

struct Shape {
  int64_t B, T, C, NH, hd;
  friend bool operator<(const Shape& a, const Shape& b) {
    return std::tie(a.B, a.T, a.C, a.NH) < std::tie(b.B, b.T, b.C, b.NH);
  }
};

// Every layout the graphs use, derived once from the shape.
struct Layouts {
  Dims heads, qkv_strides, out_strides, packed_heads;  // [B, NH, T, hd]
  Dims transposed_heads, qkv_transposed_strides;       // [B, NH, hd, T]
  Dims scores, scores_strides, scores_transposed_strides;  // [B, NH, T, T]
  Dims rows, rows_strides;                                 // [B, NH, T, 1]
  Dims scalar, scalar_strides;                             // [1, 1, 1, 1]

  explicit Layouts(const Shape& s) {
    const int64_t B = s.B, T = s.T, C = s.C, NH = s.NH, hd = s.hd;
    heads = {B, NH, T, hd};
    qkv_strides = {T * 3 * C, hd, 3 * C, 1};
    out_strides = {T * C, hd, C, 1};
    packed_heads = {NH * T * hd, T * hd, hd, 1};
    transposed_heads = {B, NH, hd, T};
    qkv_transposed_strides = {T * 3 * C, hd, 1, 3 * C};
    scores = {B, NH, T, T};
    scores_strides = {NH * T * T, T * T, T, 1};
    scores_transposed_strides = {NH * T * T, T * T, 1, T};
    rows = {B, NH, T, 1};
    rows_strides = {NH * T, T, 1, 1};
    scalar = {1, 1, 1, 1};
    scalar_strides = {1, 1, 1, 1};
  }
};

// Builds one operation graph; owns every descriptor it creates, so the finalized
// plan never outlives anything it was built from.
class GraphBuilder {
 public:
  Result<cudnnBackendDescriptor_t> create(cudnnBackendDescriptorType_t type) {
    auto desc = std::make_unique<Descriptor>();
    SWARM_RETURN_IF_ERROR(desc->create(type));
    cudnnBackendDescriptor_t handle = desc->get();
    owned_.push_back(std::move(desc));
    return handle;
  }

  Result<cudnnBackendDescriptor_t> tensor(int64_t uid, cudnnDataType_t type, const Dims& dims, const Dims& strides,
                                          bool is_virtual = false, bool by_value = false) {
    SWARM_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t t, create(CUDNN_BACKEND_TENSOR_DESCRIPTOR));
    const int64_t alignment = 16;
    SWARM_RETURN_IF_ERROR(set_attr(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type));
    SWARM_RETURN_IF_ERROR(set_attr(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data()));
    SWARM_RETURN_IF_ERROR(set_attr(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data()));
    SWARM_RETURN_IF_ERROR(set_attr(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
    SWARM_RETURN_IF_ERROR(set_attr(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment));
    if (is_virtual) {
      const bool yes = true;
      SWARM_RETURN_IF_ERROR(set_attr(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes));
    }
    if (by_value) {
      const bool yes = true;
      SWARM_RETURN_IF_ERROR(set_attr(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes));
    }
    SWARM_RETURN_IF_ERROR(finalize(t, "tensor descriptor"));
    return t;
  }

  Result<cudnnBackendDescriptor_t> virtual_tensor(cudnnDataType_t type, const Dims& dims, const Dims& strides) {
    return tensor(next_virtual_uid_++, type, dims, strides, /*is_virtual=*/true);
  }

  // y = mode(x[, b[, t]]); b and t may be null for unary and binary modes.
  Status pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t math, cudnnBackendDescriptor_t x,
                   cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                   int64_t axis = -1) {
    SWARM_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t pw, create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR));
    SWARM_RETURN_IF_ERROR(set_attr(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode));
    SWARM_RETURN_IF_ERROR(set_attr(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math));
    if (axis >= 0) SWARM_RETURN_IF_ERROR(set_attr(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis));
    SWARM_RETURN_IF_ERROR(finalize(pw, "pointwise descriptor"));

    SWARM_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t op, create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR));
    SWARM_RETURN_IF_ERROR(set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw));
    SWARM_RETURN_IF_ERROR(set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x));
    if (b != nullptr) SWARM_RETURN_IF_ERROR(set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b));
    if (t != nullptr) SWARM_RETURN_IF_ERROR(set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t));
    SWARM_RETURN_IF_ERROR(set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y));
    const float one = 1.0f;
    SWARM_RETURN_IF_ERROR(set_attr(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one));
    SWARM_RETURN_IF_ERROR(set_attr(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one));
    SWARM_RETURN_IF_ERROR(finalize(op, "pointwise operation"));
    ops_.push_back(op);
    return Status::ok();
  }

  // y = reduce(x) over the dims where y has extent 1.
  Status reduction(cudnnReduceTensorOp_t reduce, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    SWARM_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t red, create(CUDNN_BACKEND_REDUCTION_DESCRIPTOR));
    const cudnnDataType_t math = CUDNN_DATA_FLOAT;
    SWARM_RETURN_IF_ERROR(
        set_attr(red, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &reduce));
    SWARM_RETURN_IF_ERROR(set_attr(red, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &math));
    SWARM_RETURN_IF_ERROR(finalize(red, "reduction descriptor"));

    SWARM_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t op, create(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR));
    SWARM_RETURN_IF_ERROR(set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x));
    SWARM_RETURN_IF_ERROR(set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y));
    SWARM_RETURN_IF_ERROR(set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, red));
    SWARM_RETURN_IF_ERROR(finalize(op, "reduction operation"));
    ops_.push_back(op);
    return Status::ok();
  }

  // c = a·b over the last two dims, batched over the first two.
  Status matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    SWARM_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t mm, create(CUDNN_BACKEND_MATMUL_DESCRIPTOR));
    const cudnnDataType_t math = CUDNN_DATA_FLOAT;
    SWARM_RETURN_IF_ERROR(set_attr(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &math));
    SWARM_RETURN_IF_ERROR(finalize(mm, "matmul descriptor"));

    SWARM_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t op, create(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR));
    SWARM_RETURN_IF_ERROR(set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a));
    SWARM_RETURN_IF_ERROR(set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b));
    SWARM_RETURN_IF_ERROR(set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c));
    SWARM_RETURN_IF_ERROR(set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm));
    SWARM_RETURN_IF_ERROR(finalize(op, "matmul operation"));
    ops_.push_back(op);
    return Status::ok();
  }

  // y views the same values as x under y's dims and strides (used for transposes).
  Status reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    SWARM_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t op, create(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR));
    SWARM_RETURN_IF_ERROR(set_desc(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x));
    SWARM_RETURN_IF_ERROR(set_desc(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y));
    SWARM_RETURN_IF_ERROR(finalize(op, "reshape operation"));
    ops_.push_back(op);
    return Status::ok();
  }

  // x with every score above the diagonal (key after query) replaced by neg_inf.
  Result<cudnnBackendDescriptor_t> causal_mask(const Layouts& l, cudnnBackendDescriptor_t x,
                                               cudnnBackendDescriptor_t neg_inf) {
    SWARM_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t row, virtual_tensor(CUDNN_DATA_INT32, l.scores, l.scores_strides));
    SWARM_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t col, virtual_tensor(CUDNN_DATA_INT32, l.scores, l.scores_strides));
    SWARM_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t keep,
                           virtual_tensor(CUDNN_DATA_BOOLEAN, l.scores, l.scores_strides));
    SWARM_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t y, virtual_tensor(CUDNN_DATA_FLOAT, l.scores, l.scores_strides));
    SWARM_RETURN_IF_ERROR(pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, x, nullptr, nullptr, row, 2));
    SWARM_RETURN_IF_ERROR(pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, x, nullptr, nullptr, col, 3));
    SWARM_RETURN_IF_ERROR(pointwise(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, nullptr, keep));
    // BINARY_SELECT: y = t ? x : b.
    SWARM_RETURN_IF_ERROR(pointwise(CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, x, neg_inf, keep, y));
    return y;
  }

  Result<cudnnBackendDescriptor_t> finalize_graph(cudnnHandle_t handle) {
    SWARM_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t graph, create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR));
    if (handle != nullptr) {
      SWARM_RETURN_IF_ERROR(set_attr(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle));
    }
    SWARM_RETURN_IF_ERROR(set_attr(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                   static_cast<int64_t>(ops_.size()), ops_.data()));
    SWARM_RETURN_IF_ERROR(finalize(graph, "operation graph"));
    return graph;
  }

 private:
  std::vector<std::unique_ptr<Descriptor>> owned_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_virtual_uid_ = kFirstVirtualUid;
};

enum class Direction { forward, backward };

// How the backward produces dQ. direct: the dS·K GEMM writes dQ itself (cuDNN's
// deterministic form on Hopper). accumulated: it accumulates into a float buffer
// that an identity op then converts (the default elsewhere; may use atomics).
enum class DQMode { direct, accumulated };

Status build_forward_graph(GraphBuilder& g, const Layouts& l) {
  SWARM_ASSIGN_OR_RETURN(auto q, g.tensor(kUidQ, CUDNN_DATA_BFLOAT16, l.heads, l.qkv_strides));
  SWARM_ASSIGN_OR_RETURN(auto kt, g.tensor(kUidK, CUDNN_DATA_BFLOAT16, l.transposed_heads, l.qkv_transposed_strides));
  SWARM_ASSIGN_OR_RETURN(auto v, g.tensor(kUidV, CUDNN_DATA_BFLOAT16, l.heads, l.qkv_strides));
  SWARM_ASSIGN_OR_RETURN(auto o, g.tensor(kUidO, CUDNN_DATA_BFLOAT16, l.heads, l.out_strides));
  SWARM_ASSIGN_OR_RETURN(auto stats, g.tensor(kUidStats, CUDNN_DATA_FLOAT, l.rows, l.rows_strides));
  SWARM_ASSIGN_OR_RETURN(auto scale, g.tensor(kUidScale, CUDNN_DATA_FLOAT, l.scalar, l.scalar_strides, false, true));
  SWARM_ASSIGN_OR_RETURN(auto neg_inf,
                         g.tensor(kUidNegInf, CUDNN_DATA_FLOAT, l.scalar, l.scalar_strides, false, true));

  SWARM_ASSIGN_OR_RETURN(auto s, g.virtual_tensor(CUDNN_DATA_FLOAT, l.scores, l.scores_strides));
  SWARM_RETURN_IF_ERROR(g.matmul(q, kt, s));
  SWARM_ASSIGN_OR_RETURN(auto scaled, g.virtual_tensor(CUDNN_DATA_FLOAT, l.scores, l.scores_strides));
  SWARM_RETURN_IF_ERROR(g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s, scale, nullptr, scaled));
  SWARM_ASSIGN_OR_RETURN(auto masked, g.causal_mask(l, scaled, neg_inf));

  SWARM_ASSIGN_OR_RETURN(auto row_max, g.virtual_tensor(CUDNN_DATA_FLOAT, l.rows, l.rows_strides));
  SWARM_RETURN_IF_ERROR(g.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, row_max));
  SWARM_ASSIGN_OR_RETURN(auto centered, g.virtual_tensor(CUDNN_DATA_FLOAT, l.scores, l.scores_strides));
  SWARM_RETURN_IF_ERROR(g.pointwise(CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, masked, row_max, nullptr, centered));
  SWARM_ASSIGN_OR_RETURN(auto e, g.virtual_tensor(CUDNN_DATA_FLOAT, l.scores, l.scores_strides));
  SWARM_RETURN_IF_ERROR(g.pointwise(CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, centered, nullptr, nullptr, e));
  SWARM_ASSIGN_OR_RETURN(auto row_sum, g.virtual_tensor(CUDNN_DATA_FLOAT, l.rows, l.rows_strides));
  SWARM_RETURN_IF_ERROR(g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, row_sum));
  SWARM_ASSIGN_OR_RETURN(auto log_sum, g.virtual_tensor(CUDNN_DATA_FLOAT, l.rows, l.rows_strides));
  SWARM_RETURN_IF_ERROR(g.pointwise(CUDNN_POINTWISE_LOG, CUDNN_DATA_FLOAT, row_sum, nullptr, nullptr, log_sum));
  SWARM_RETURN_IF_ERROR(g.pointwise(CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, row_max, log_sum, nullptr, stats));
  // The engines run the second GEMM on 16-bit probabilities, as the input type.
  SWARM_ASSIGN_OR_RETURN(auto p, g.virtual_tensor(CUDNN_DATA_BFLOAT16, l.scores, l.scores_strides));
  SWARM_RETURN_IF_ERROR(g.pointwise(CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, e, row_sum, nullptr, p));
  SWARM_RETURN_IF_ERROR(g.matmul(p, v, o));
  return Status::ok();
}

Status build_backward_graph(GraphBuilder& g, const Layouts& l, DQMode dq_mode) {
  SWARM_ASSIGN_OR_RETURN(auto q, g.tensor(kUidQ, CUDNN_DATA_BFLOAT16, l.heads, l.qkv_strides));
  SWARM_ASSIGN_OR_RETURN(auto kt, g.tensor(kUidK, CUDNN_DATA_BFLOAT16, l.transposed_heads, l.qkv_transposed_strides));
  SWARM_ASSIGN_OR_RETURN(auto vt, g.tensor(kUidV, CUDNN_DATA_BFLOAT16, l.transposed_heads, l.qkv_transposed_strides));
  SWARM_ASSIGN_OR_RETURN(auto o, g.tensor(kUidO, CUDNN_DATA_BFLOAT16, l.heads, l.out_strides));
  SWARM_ASSIGN_OR_RETURN(auto d_o, g.tensor(kUidDO, CUDNN_DATA_BFLOAT16, l.heads, l.out_strides));
  SWARM_ASSIGN_OR_RETURN(auto stats, g.tensor(kUidStats, CUDNN_DATA_FLOAT, l.rows, l.rows_strides));
  SWARM_ASSIGN_OR_RETURN(auto dq, g.tensor(kUidDQ, CUDNN_DATA_BFLOAT16, l.heads, l.qkv_strides));
  SWARM_ASSIGN_OR_RETURN(auto dk, g.tensor(kUidDK, CUDNN_DATA_BFLOAT16, l.heads, l.qkv_strides));
  SWARM_ASSIGN_OR_RETURN(auto dv, g.tensor(kUidDV, CUDNN_DATA_BFLOAT16, l.heads, l.qkv_strides));
  SWARM_ASSIGN_OR_RETURN(auto scale, g.tensor(kUidScale, CUDNN_DATA_FLOAT, l.scalar, l.scalar_strides, false, true));
  SWARM_ASSIGN_OR_RETURN(auto neg_inf,
                         g.tensor(kUidNegInf, CUDNN_DATA_FLOAT, l.scalar, l.scalar_strides, false, true));
  SWARM_ASSIGN_OR_RETURN(auto one, g.tensor(kUidOne, CUDNN_DATA_FLOAT, l.scalar, l.scalar_strides, false, true));
  // D = rowsum(dO ⊙ O) is a real tensor: the engines precompute it into memory we give them.
  SWARM_ASSIGN_OR_RETURN(auto row_dot, g.tensor(kUidRowDot, CUDNN_DATA_FLOAT, l.rows, l.rows_strides));

  SWARM_ASSIGN_OR_RETURN(auto do_o, g.virtual_tensor(CUDNN_DATA_FLOAT, l.heads, l.packed_heads));
  SWARM_RETURN_IF_ERROR(g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, d_o, o, nullptr, do_o));
  SWARM_ASSIGN_OR_RETURN(auto do_o_sum, g.virtual_tensor(CUDNN_DATA_FLOAT, l.rows, l.rows_strides));
  SWARM_RETURN_IF_ERROR(g.reduction(CUDNN_REDUCE_TENSOR_ADD, do_o, do_o_sum));
  // The "× 1" stands where a dropout graph scales by the keep probability.
  SWARM_RETURN_IF_ERROR(g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, do_o_sum, one, nullptr, row_dot));

  // Recompute P from the saved statistics.
  SWARM_ASSIGN_OR_RETURN(auto s, g.virtual_tensor(CUDNN_DATA_FLOAT, l.scores, l.scores_strides));
  SWARM_RETURN_IF_ERROR(g.matmul(q, kt, s));
  SWARM_ASSIGN_OR_RETURN(auto scaled, g.virtual_tensor(CUDNN_DATA_FLOAT, l.scores, l.scores_strides));
  SWARM_RETURN_IF_ERROR(g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s, scale, nullptr, scaled));
  SWARM_ASSIGN_OR_RETURN(auto centered, g.virtual_tensor(CUDNN_DATA_FLOAT, l.scores, l.scores_strides));
  SWARM_RETURN_IF_ERROR(g.pointwise(CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, scaled, stats, nullptr, centered));
  SWARM_ASSIGN_OR_RETURN(auto masked, g.causal_mask(l, centered, neg_inf));
  SWARM_ASSIGN_OR_RETURN(auto p, g.virtual_tensor(CUDNN_DATA_FLOAT, l.scores, l.scores_strides));
  SWARM_RETURN_IF_ERROR(g.pointwise(CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, masked, nullptr, nullptr, p));

  // dV = Pᵀ·dO.
  SWARM_ASSIGN_OR_RETURN(auto p_t, g.virtual_tensor(CUDNN_DATA_BFLOAT16, l.scores, l.scores_transposed_strides));
  SWARM_RETURN_IF_ERROR(g.reshape(p, p_t));
  SWARM_RETURN_IF_ERROR(g.matmul(p_t, d_o, dv));

  // dS = P ⊙ (dO·Vᵀ - D) · scale.
  SWARM_ASSIGN_OR_RETURN(auto dp, g.virtual_tensor(CUDNN_DATA_FLOAT, l.scores, l.scores_strides));
  SWARM_RETURN_IF_ERROR(g.matmul(d_o, vt, dp));
  SWARM_ASSIGN_OR_RETURN(auto dp_centered, g.virtual_tensor(CUDNN_DATA_FLOAT, l.scores, l.scores_strides));
  SWARM_RETURN_IF_ERROR(g.pointwise(CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, dp, row_dot, nullptr, dp_centered));
  SWARM_ASSIGN_OR_RETURN(auto ds_unscaled, g.virtual_tensor(CUDNN_DATA_FLOAT, l.scores, l.scores_strides));
  SWARM_RETURN_IF_ERROR(g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dp_centered, p, nullptr, ds_unscaled));
  SWARM_ASSIGN_OR_RETURN(auto ds, g.virtual_tensor(CUDNN_DATA_FLOAT, l.scores, l.scores_strides));
  SWARM_RETURN_IF_ERROR(g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, ds_unscaled, scale, nullptr, ds));

  // dK = dSᵀ·Q.
  SWARM_ASSIGN_OR_RETURN(auto ds_t, g.virtual_tensor(CUDNN_DATA_BFLOAT16, l.scores, l.scores_transposed_strides));
  SWARM_RETURN_IF_ERROR(g.reshape(ds, ds_t));
  SWARM_RETURN_IF_ERROR(g.matmul(ds_t, q, dk));

  // dQ = dS·K, with K recovered from Kᵀ by swapping the last two dims back.
  SWARM_ASSIGN_OR_RETURN(auto k, g.virtual_tensor(CUDNN_DATA_FLOAT, l.heads, l.qkv_strides));
  SWARM_RETURN_IF_ERROR(g.reshape(kt, k));
  if (dq_mode == DQMode::direct) {
    SWARM_RETURN_IF_ERROR(g.matmul(ds, k, dq));
  } else {
    SWARM_ASSIGN_OR_RETURN(auto dq_accum, g.tensor(kUidDQAccum, CUDNN_DATA_FLOAT, l.heads, l.packed_heads));
    SWARM_RETURN_IF_ERROR(g.matmul(ds, k, dq_accum));
    SWARM_RETURN_IF_ERROR(g.pointwise(CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, dq_accum, nullptr, nullptr, dq));
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------------
// Plans.

// A finalized execution plan and everything it was built from.
struct Plan {
  // Declared in build order, so they are destroyed plan first, graph last.
  GraphBuilder graph;
  std::vector<Descriptor> engine_configs;
  Descriptor plan;
  int64_t workspace_bytes = 0;
  bool deterministic = false;
  DQMode dq_mode = DQMode::direct;
  // Host values the by-value tensors point at; their addresses go into the variant pack.
  float scale = 1.0f;
  float neg_inf = -std::numeric_limits<float>::infinity();
  float one = 1.0f;
};

// Whether cuDNN marks the engine behind this configuration nondeterministic.
// Unknown counts as nondeterministic.
bool engine_is_deterministic(cudnnBackendDescriptor_t engine_config) {
  Descriptor engine;
  if (!engine.create(CUDNN_BACKEND_ENGINE_DESCRIPTOR).is_ok()) return false;
  cudnnBackendDescriptor_t engine_handle = engine.get();
  int64_t count = 0;
  if (cudnnBackendGetAttribute(engine_config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count,
                               &engine_handle) != CUDNN_STATUS_SUCCESS) {
    return false;
  }
  std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
  int64_t note_count = 0;
  if (cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               static_cast<int64_t>(notes.size()), &note_count, notes.data()) != CUDNN_STATUS_SUCCESS) {
    return false;
  }
  for (int64_t i = 0; i < note_count && i < static_cast<int64_t>(notes.size()); ++i) {
    if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) return false;
  }
  return true;
}

// Finalizes the first engine configuration cuDNN's heuristics offer for the graph
// (only deterministic ones when asked); unimplemented, with cuDNN's last reason,
// when none finalizes. Plans for the device behind `handle`, or, with no handle,
// for the one `device` describes (cuDNN's deviceless ahead-of-time path: the plan
// cannot execute, but cuDNN's support checks and kernel compilation run without a
// GPU, which is how these graphs were checked against the sm_90 engines).
Status finalize_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t device, cudnnBackendDescriptor_t graph,
                     bool deterministic_only, Plan& plan) {
  std::string last_reason = "cuDNN's heuristics offered no engine configuration";
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    Descriptor heuristics;
    SWARM_RETURN_IF_ERROR(heuristics.create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR));
    SWARM_RETURN_IF_ERROR(set_desc(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph));
    SWARM_RETURN_IF_ERROR(set_attr(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode));
    if (device != nullptr) SWARM_RETURN_IF_ERROR(set_desc(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, device));
    if (Status status = finalize(heuristics.get(), "engine heuristics"); !status.is_ok()) {
      last_reason = status.message();
      continue;
    }
    int64_t available = 0;
    SWARM_CUDNN_RETURN_IF_ERROR(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &available, nullptr));
    if (available <= 0) continue;
    std::vector<Descriptor> configs(static_cast<size_t>(available));
    std::vector<cudnnBackendDescriptor_t> config_handles;
    for (Descriptor& config : configs) {
      SWARM_RETURN_IF_ERROR(config.create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
      config_handles.push_back(config.get());
    }
    int64_t returned = 0;
    SWARM_CUDNN_RETURN_IF_ERROR(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, available, &returned,
                                                         config_handles.data()));
    for (int64_t i = 0; i < returned && i < available; ++i) {
      cudnnBackendDescriptor_t config = config_handles[static_cast<size_t>(i)];
      const bool deterministic = engine_is_deterministic(config);
      if (deterministic_only && !deterministic) continue;
      Descriptor candidate;
      SWARM_RETURN_IF_ERROR(candidate.create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR));
      if (handle != nullptr) {
        SWARM_RETURN_IF_ERROR(
            set_attr(candidate.get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle));
      }
      if (device != nullptr) {
        SWARM_RETURN_IF_ERROR(set_desc(candidate.get(), CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, device));
      }
      SWARM_RETURN_IF_ERROR(set_desc(candidate.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config));
      if (Status status = finalize(candidate.get(), "execution plan"); !status.is_ok()) {
        last_reason = status.message();
        continue;
      }
      int64_t workspace = 0;
      int64_t count = 0;
      SWARM_CUDNN_RETURN_IF_ERROR(cudnnBackendGetAttribute(candidate.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                           CUDNN_TYPE_INT64, 1, &count, &workspace));
      plan.plan = std::move(candidate);
      plan.engine_configs = std::move(configs);
      plan.workspace_bytes = workspace < 0 ? 0 : workspace;
      // The accumulating dQ form adds with atomics whatever the engine notes say.
      plan.deterministic = deterministic && plan.dq_mode == DQMode::direct;
      return Status::ok();
    }
  }
  return unimplemented("no cuDNN engine runs this attention graph{}: {}",
                       deterministic_only ? " deterministically" : "", last_reason);
}

Result<std::unique_ptr<Plan>> build_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t device, const Shape& shape,
                                         Direction direction) {
  const Layouts layouts(shape);
  const float scale = 1.0f / std::sqrt(static_cast<float>(shape.hd));
  // cuDNN before 9.10 preferred the lowest finite float as the mask value.
  const float neg_inf = cudnnGetVersion() < 91000 ? std::numeric_limits<float>::lowest()
                                                  : -std::numeric_limits<float>::infinity();

  auto build = [&](DQMode dq_mode, bool deterministic_only) -> Result<std::unique_ptr<Plan>> {
    auto plan = std::make_unique<Plan>();
    plan->scale = scale;
    plan->neg_inf = neg_inf;
    plan->dq_mode = dq_mode;
    if (direction == Direction::forward) {
      SWARM_RETURN_IF_ERROR(build_forward_graph(plan->graph, layouts));
    } else {
      SWARM_RETURN_IF_ERROR(build_backward_graph(plan->graph, layouts, dq_mode));
    }
    SWARM_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t graph, plan->graph.finalize_graph(handle));
    SWARM_RETURN_IF_ERROR(finalize_plan(handle, device, graph, deterministic_only, *plan));
    return plan;
  };

  // Deterministic first; the accumulating dQ form only when nothing else runs.
  const std::vector<std::pair<DQMode, bool>> attempts =
      direction == Direction::forward
          ? std::vector<std::pair<DQMode, bool>>{{DQMode::direct, true}, {DQMode::direct, false}}
          : std::vector<std::pair<DQMode, bool>>{{DQMode::direct, true},
                                                 {DQMode::accumulated, true},
                                                 {DQMode::direct, false},
                                                 {DQMode::accumulated, false}};
  Status last_failure;
  for (const auto& [dq_mode, deterministic_only] : attempts) {
    auto plan = build(dq_mode, deterministic_only);
    if (plan.is_ok()) return std::move(plan).value();
    last_failure = plan.status();
    // Only "no engine" is worth another form; anything else is a real error.
    if (last_failure.code() != StatusCode::unimplemented) break;
  }
  return last_failure.with_context(fmt::format("cuDNN attention {} for B={} T={} C={} NH={}",
                                                direction == Direction::forward ? "forward" : "backward", shape.B,
                                                shape.T, shape.C, shape.NH));
}

// ---------------------------------------------------------------------------------
// Per-device state.

struct CachedPlan {
  Status status;  // why cuDNN has no engine for it, once known
  std::unique_ptr<Plan> plan;
};

struct DeviceState {
  cudnnHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // Recorded after every call's last use of the workspace; the next call's stream
  // waits on it, so calls on different streams never share the bytes at once.
  cudaEvent_t workspace_released = nullptr;
  std::map<std::pair<Shape, Direction>, CachedPlan> plans;
};

std::mutex& state_mutex() {
  static std::mutex mutex;
  return mutex;
}

// Never destroyed: handles and device memory must not be released after the CUDA
// runtime has shut down at process exit.
std::map<int, DeviceState>& device_states() {
  static auto* states = new std::map<int, DeviceState>();
  return *states;
}

Result<DeviceState*> state_for_current_device() {
  int device = 0;
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  if (cudnnGetVersion() < 90000) {
    return unimplemented("cudnn_attention needs cuDNN 9 at run time; found version {}", cudnnGetVersion());
  }
  DeviceState& state = device_states()[device];
  if (state.workspace_released == nullptr) {
    SWARM_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&state.workspace_released, cudaEventDisableTiming));
  }
  if (state.handle == nullptr) SWARM_CUDNN_RETURN_IF_ERROR(cudnnCreate(&state.handle));
  return &state;
}

Result<Plan*> plan_for(DeviceState& state, const Shape& shape, Direction direction) {
  CachedPlan& cached = state.plans[{shape, direction}];
  if (cached.plan == nullptr && cached.status.is_ok()) {
    auto built = build_plan(state.handle, /*device=*/nullptr, shape, direction);
    if (built.is_ok()) {
      cached.plan = std::move(built).value();
    } else if (built.status().code() == StatusCode::unimplemented) {
      cached.status = built.status();  // cuDNN will not change its mind; other failures are retried
    } else {
      return built.status();
    }
  }
  if (cached.plan == nullptr) return cached.status;
  return cached.plan.get();
}

constexpr size_t kSegmentAlignment = 256;

size_t align_up(size_t bytes) { return (bytes + kSegmentAlignment - 1) / kSegmentAlignment * kSegmentAlignment; }

// The device workspace, at least `bytes` long, ordered after every earlier use.
Result<char*> acquire_workspace(DeviceState& state, size_t bytes, cudaStream_t stream) {
  if (bytes > state.workspace_bytes) {
    if (state.workspace != nullptr) {
      // Earlier calls may still be reading it on their streams.
      SWARM_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(state.workspace_released));
      SWARM_CUDA_RETURN_IF_ERROR(cudaFree(state.workspace));
      state.workspace = nullptr;
      state.workspace_bytes = 0;
    }
    SWARM_CUDA_RETURN_IF_ERROR(cudaMalloc(&state.workspace, bytes));
    state.workspace_bytes = bytes;
  }
  SWARM_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, state.workspace_released, 0));
  return static_cast<char*>(state.workspace);
}

Status release_workspace(DeviceState& state, cudaStream_t stream) {
  SWARM_CUDA_RETURN_IF_ERROR(cudaEventRecord(state.workspace_released, stream));
  return Status::ok();
}

Status execute(cudnnHandle_t handle, const Plan& plan, const std::vector<int64_t>& uids,
               const std::vector<void*>& pointers, void* workspace) {
  Descriptor pack;
  SWARM_RETURN_IF_ERROR(pack.create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR));
  SWARM_RETURN_IF_ERROR(set_attr(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                                 static_cast<int64_t>(uids.size()), uids.data()));
  SWARM_RETURN_IF_ERROR(set_attr(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                                 static_cast<int64_t>(pointers.size()), pointers.data()));
  SWARM_RETURN_IF_ERROR(set_attr(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace));
  SWARM_RETURN_IF_ERROR(finalize(pack.get(), "variant pack"));
  SWARM_CUDNN_RETURN_IF_ERROR(cudnnBackendExecute(handle, plan.plan.get(), pack.get()));
  return Status::ok();
}

// ---------------------------------------------------------------------------------
// Argument checks, shared by both element types so they fail the same way.

Status check_arguments(const char* op, std::initializer_list<const void*> pointers, int B, int T, int C, int NH) {
  for (const void* p : pointers) {
    if (p == nullptr) return invalid_argument("{}: null pointer", op);
  }
  if (B < 1 || T < 1 || C < 1 || NH < 1) {
    return invalid_argument("{}: B={} T={} C={} NH={} must all be at least 1", op, B, T, C, NH);
  }
  if (C % NH != 0) return invalid_argument("{}: C={} is not divisible by NH={}", op, C, NH);
  return Status::ok();
}

// What cuDNN's fused attention can run, checked before touching the device.
Status check_supported(const char* op, std::initializer_list<const void*> pointers, int C, int NH) {
  const int hd = C / NH;
  if (hd % 8 != 0 || hd > 256) {
    return unimplemented(
        "{}: head dim {} is not supported by cuDNN's fused attention (it needs a multiple of 8, at most 256; "
        "at most 128 for backward before Hopper)",
        op, hd);
  }
  for (const void* p : pointers) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
      return unimplemented("{}: cuDNN's fused attention needs 16-byte aligned buffers", op);
    }
  }
  return Status::ok();
}

Shape shape_of(int B, int T, int C, int NH) { return Shape{B, T, C, NH, C / NH}; }

}  // namespace

int64_t cudnn_attention_scratch_floats(int B, int T, int NH) {
  return static_cast<int64_t>(B) * NH * T;
}

Status cudnn_attention_forward(bf16* out, float* scratch, const bf16* qkv, int B, int T, int C, int NH,
                               cudaStream_t stream) {
  constexpr const char* kOp = "cudnn_attention_forward";
  SWARM_RETURN_IF_ERROR(check_arguments(kOp, {out, scratch, qkv}, B, T, C, NH));
  SWARM_RETURN_IF_ERROR(check_supported(kOp, {out, scratch, qkv}, C, NH));
  const Shape shape = shape_of(B, T, C, NH);

  std::lock_guard<std::mutex> lock(state_mutex());
  SWARM_ASSIGN_OR_RETURN(DeviceState * state, state_for_current_device());
  SWARM_ASSIGN_OR_RETURN(Plan * plan, plan_for(*state, shape, Direction::forward));
  SWARM_ASSIGN_OR_RETURN(char* workspace,
                         acquire_workspace(*state, align_up(static_cast<size_t>(plan->workspace_bytes)), stream));

  SWARM_CUDNN_RETURN_IF_ERROR(cudnnSetStream(state->handle, stream));
  bf16* q = const_cast<bf16*>(qkv);  // cuDNN's variant pack takes void*; it only reads inputs
  const std::vector<int64_t> uids = {kUidQ, kUidK, kUidV, kUidO, kUidStats, kUidScale, kUidNegInf};
  const std::vector<void*> pointers = {q, q + C, q + 2 * C, out, scratch, &plan->scale, &plan->neg_inf};
  Status status = execute(state->handle, *plan, uids, pointers, workspace);
  SWARM_RETURN_IF_ERROR(release_workspace(*state, stream));
  return status;
}

Status cudnn_attention_forward(float* out, float* scratch, const float* qkv, int B, int T, int C, int NH,
                               cudaStream_t stream) {
  SWARM_RETURN_IF_ERROR(check_arguments("cudnn_attention_forward", {out, scratch, qkv}, B, T, C, NH));
  return unimplemented("cudnn_attention_forward: cuDNN's fused attention runs on 16-bit inputs only; use bf16");
}

Status cudnn_attention_backward(bf16* dqkv, float* scratch, const bf16* dout, const bf16* qkv, const bf16* out,
                                int B, int T, int C, int NH, cudaStream_t stream) {
  constexpr const char* kOp = "cudnn_attention_backward";
  SWARM_RETURN_IF_ERROR(check_arguments(kOp, {dqkv, scratch, dout, qkv, out}, B, T, C, NH));
  SWARM_RETURN_IF_ERROR(check_supported(kOp, {dqkv, scratch, dout, qkv, out}, C, NH));
  // cuDNN up to 9.15 needed an explicit padding mask when T is not a multiple of 128.
  if (cudnnGetVersion() < 91600 && T % 128 != 0) {
    return unimplemented("{}: cuDNN {} needs T to be a multiple of 128 for the backward (T={}); 9.16+ does not",
                         kOp, cudnnGetVersion(), T);
  }
  const Shape shape = shape_of(B, T, C, NH);

  std::lock_guard<std::mutex> lock(state_mutex());
  SWARM_ASSIGN_OR_RETURN(DeviceState * state, state_for_current_device());
  SWARM_ASSIGN_OR_RETURN(Plan * plan, plan_for(*state, shape, Direction::backward));

  // Workspace: [cuDNN's | D, float B*NH*T | dQ accumulator, float B*NH*T*hd (accumulating
  // form only) | the gradients cuDNN writes, bf16 B*T*3C, added into dqkv at the end].
  const size_t cudnn_bytes = align_up(static_cast<size_t>(plan->workspace_bytes));
  const size_t row_dot_bytes = align_up(sizeof(float) * static_cast<size_t>(B) * NH * T);
  const size_t dq_accum_bytes =
      plan->dq_mode == DQMode::accumulated ? align_up(sizeof(float) * static_cast<size_t>(B) * NH * T * shape.hd) : 0;
  const int64_t grad_elements = static_cast<int64_t>(B) * T * 3 * C;
  const size_t grad_bytes = align_up(sizeof(bf16) * static_cast<size_t>(grad_elements));
  SWARM_ASSIGN_OR_RETURN(char* workspace,
                         acquire_workspace(*state, cudnn_bytes + row_dot_bytes + dq_accum_bytes + grad_bytes, stream));
  float* row_dot = reinterpret_cast<float*>(workspace + cudnn_bytes);
  float* dq_accum = reinterpret_cast<float*>(workspace + cudnn_bytes + row_dot_bytes);
  bf16* grads = reinterpret_cast<bf16*>(workspace + cudnn_bytes + row_dot_bytes + dq_accum_bytes);

  Status status = [&]() -> Status {
    SWARM_CUDNN_RETURN_IF_ERROR(cudnnSetStream(state->handle, stream));
    bf16* q = const_cast<bf16*>(qkv);  // the variant pack takes void*; inputs are only read
    std::vector<int64_t> uids = {kUidQ,  kUidK,  kUidV,  kUidO,     kUidDO,      kUidStats, kUidDQ,
                                 kUidDK, kUidDV, kUidScale, kUidNegInf, kUidOne, kUidRowDot};
    std::vector<void*> pointers = {q,         q + C,          q + 2 * C,  const_cast<bf16*>(out),
                                   const_cast<bf16*>(dout), scratch, grads,     grads + C,
                                   grads + 2 * C, &plan->scale, &plan->neg_inf, &plan->one,
                                   row_dot};
    if (plan->dq_mode == DQMode::accumulated) {
      // cuDNN before 9.6 expected the accumulator zeroed by the caller; later ones ignore the old bytes.
      SWARM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dq_accum, 0, dq_accum_bytes, stream));
      uids.push_back(kUidDQAccum);
      pointers.push_back(dq_accum);
    }
    SWARM_RETURN_IF_ERROR(execute(state->handle, *plan, uids, pointers, workspace));
    return cudnn_attention_detail::add_into(dqkv, grads, grad_elements, stream);
  }();
  SWARM_RETURN_IF_ERROR(release_workspace(*state, stream));
  return status;
}

Status cudnn_attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* out,
                                int B, int T, int C, int NH, cudaStream_t stream) {
  SWARM_RETURN_IF_ERROR(check_arguments("cudnn_attention_backward", {dqkv, scratch, dout, qkv, out}, B, T, C, NH));
  return unimplemented("cudnn_attention_backward: cuDNN's fused attention runs on 16-bit inputs only; use bf16");
}

bool cudnn_attention_backward_is_deterministic(int B, int T, int C, int NH) {
  if (B < 1 || T < 1 || C < 1 || NH < 1 || C % NH != 0) return false;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  std::lock_guard<std::mutex> lock(state_mutex());
  auto state = device_states().find(device);
  if (state == device_states().end()) return false;
  auto cached = state->second.plans.find({shape_of(B, T, C, NH), Direction::backward});
  if (cached == state->second.plans.end() || cached->second.plan == nullptr) return false;
  return cached->second.plan->deterministic;
}

}  // namespace swarm::cuda
