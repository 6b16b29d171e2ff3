// See matmul.h for the design. Host code only: cuBLASLt calls, the per-device context
// and the fallbacks; the few kernels live in matmul_reduce.cu.
#include "kernels/cuda/matmul.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <compare>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/core.h>

#include "kernels/cuda/cuda_check.h"

namespace swarm::cuda {
namespace {

Status cublas_status(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return Status::ok();
  StatusCode code = StatusCode::internal;
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_ARCH_MISMATCH) code = StatusCode::unimplemented;
  if (status == CUBLAS_STATUS_ALLOC_FAILED) code = StatusCode::resource_exhausted;
  if (status == CUBLAS_STATUS_INVALID_VALUE) code = StatusCode::invalid_argument;
  if (status == CUBLAS_STATUS_NOT_INITIALIZED) code = StatusCode::unavailable;
  return Status(code, fmt::format("{}:{}: {} failed: {} ({})", file, line, call, cublasLtGetStatusString(status),
                                  cublasLtGetStatusName(status)));
}

#define SWARM_CUBLAS_RETURN_IF_ERROR(call) \
  SWARM_RETURN_IF_ERROR(::swarm::cuda::cublas_status((call), #call, __FILE__, __LINE__))

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

template <typename T>
constexpr cudaDataType_t data_type_of();
template <>
constexpr cudaDataType_t data_type_of<float>() {
  return CUDA_R_32F;
}
template <>
constexpr cudaDataType_t data_type_of<bf16>() {
  return CUDA_R_16BF;
}

std::string_view type_name(cudaDataType_t type) { return type == CUDA_R_32F ? "f32" : "bf16"; }

std::string_view role_name(GemmRole role) {
  switch (role) {
    case GemmRole::forward: return "forward";
    case GemmRole::backward_input: return "backward-input";
    case GemmRole::backward_weight: return "backward-weight";
  }
  return "?";
}

std::string_view epilogue_name(cublasLtEpilogue_t epilogue) {
  switch (epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT: return "none";
    case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX: return "GELU_AUX";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_DGELU: return "DGELU";
    default: return "other";
  }
}

// Largest power of two up to 256 that divides the address: what cuBLASLt's kernels may
// assume about a pointer, and so part of what a cached algorithm was chosen for.
uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

// Bias and aux pointers are not covered by cuBLASLt's alignment preferences; some
// kernels assume 16 bytes, so the fused path is taken only when that holds.
bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

struct GemmProblem {
  GemmRole role;
  int N, C, OC;
  cudaDataType_t ab_type, d_type;
  cublasLtEpilogue_t epilogue;
};

// D (also C, read when accumulating) and the epilogue's vectors. aux is the GELU input:
// written by GELU_AUX*, read by DGELU.
struct GemmOperands {
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;
  const void* bias = nullptr;
  const void* aux = nullptr;
  bool accumulate = false;  // beta = 1: D = A B + D
};

std::string describe(const GemmProblem& problem) {
  const GemmGeometry g = gemm_geometry(problem.role, problem.N, problem.C, problem.OC);
  return fmt::format("{} GEMM m={} n={} k={} ({} -> {}, epilogue {})", role_name(problem.role), g.m, g.n, g.k,
                     type_name(problem.ab_type), type_name(problem.d_type), epilogue_name(problem.epilogue));
}

struct PlanKey {
  int role, N, C, OC, ab_type, d_type, epilogue;
  uint32_t align_a, align_b, align_d, align_bias, align_aux;
  friend auto operator<=>(const PlanKey&, const PlanKey&) = default;
};

// Descriptors, layouts and heuristic candidates for one problem; `support` says why
// cuBLASLt cannot run it when there are no candidates.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  std::vector<cublasLtMatmulHeuristicResult_t> algos;
  Status support;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

struct DeviceContext {
  std::mutex mu;  // guards plans, and the descriptors' pointer attributes up to the enqueue
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
};

// The current device's context, made on first use. Contexts live until the process
// ends: releasing handles and device memory from static destructors would race the
// CUDA runtime's own teardown.
Result<DeviceContext*> device_context() {
  int device = 0;
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  static std::mutex contexts_mu;
  static auto* contexts = new std::map<int, DeviceContext*>();
  std::lock_guard<std::mutex> lock(contexts_mu);
  if (auto it = contexts->find(device); it != contexts->end()) return it->second;
  auto context = std::make_unique<DeviceContext>();
  SWARM_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&context->handle));
  const Status allocated =
      cuda_status(cudaMalloc(&context->workspace, kWorkspaceBytes), "cudaMalloc(workspace)", __FILE__, __LINE__);
  if (!allocated.is_ok()) {
    cublasLtDestroy(context->handle);
    return allocated;
  }
  DeviceContext* raw = context.release();
  contexts->emplace(device, raw);
  return raw;
}

template <typename V>
cublasStatus_t set_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const V& value) {
  return cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value));
}

template <typename V>
cublasStatus_t set_preference(cublasLtMatmulPreference_t preference, cublasLtMatmulPreferenceAttributes_t attribute,
                              const V& value) {
  return cublasLtMatmulPreferenceSetAttribute(preference, attribute, &value, sizeof(value));
}

struct PreferenceHolder {
  cublasLtMatmulPreference_t preference = nullptr;
  ~PreferenceHolder() {
    if (preference != nullptr) cublasLtMatmulPreferenceDestroy(preference);
  }
};

// Fills `plan`. A problem cuBLASLt has no algorithm for is not an error here: it is
// recorded in plan.support (unimplemented), so callers can take their fallback.
Status build_plan(cublasLtHandle_t handle, const GemmProblem& problem, const GemmOperands& operands,
                  const PlanKey& key, Plan& plan) {
  const GemmGeometry g = gemm_geometry(problem.role, problem.N, problem.C, problem.OC);
  SWARM_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&plan.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const int32_t transpose_a = g.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int32_t transpose_b = g.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const uint32_t epilogue = problem.epilogue;
  SWARM_CUBLAS_RETURN_IF_ERROR(set_attribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, transpose_a));
  SWARM_CUBLAS_RETURN_IF_ERROR(set_attribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, transpose_b));
  SWARM_CUBLAS_RETURN_IF_ERROR(set_attribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue));
  // The heuristic reads the bias and aux pointers for their alignment.
  if (operands.bias != nullptr) {
    SWARM_CUBLAS_RETURN_IF_ERROR(set_attribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, operands.bias));
  }
  if (operands.aux != nullptr) {
    // The aux matrix has D's shape; its leading dimension is D's (a multiple of 8, checked by callers).
    const int64_t aux_ld = g.d.ld;
    SWARM_CUBLAS_RETURN_IF_ERROR(set_attribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, operands.aux));
    SWARM_CUBLAS_RETURN_IF_ERROR(set_attribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld));
  }
  SWARM_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan.a, problem.ab_type, g.a.rows, g.a.cols, g.a.ld));
  SWARM_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan.b, problem.ab_type, g.b.rows, g.b.cols, g.b.ld));
  SWARM_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan.d, problem.d_type, g.d.rows, g.d.cols, g.d.ld));

  PreferenceHolder holder;
  SWARM_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&holder.preference));
  const uint64_t workspace_bytes = kWorkspaceBytes;
  SWARM_CUBLAS_RETURN_IF_ERROR(
      set_preference(holder.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace_bytes));
  SWARM_CUBLAS_RETURN_IF_ERROR(
      set_preference(holder.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a));
  SWARM_CUBLAS_RETURN_IF_ERROR(
      set_preference(holder.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b));
  SWARM_CUBLAS_RETURN_IF_ERROR(
      set_preference(holder.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_d));
  SWARM_CUBLAS_RETURN_IF_ERROR(
      set_preference(holder.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d));

  cublasLtMatmulHeuristicResult_t results[kMatmulMaxAlgos] = {};
  int returned = 0;
  const Status heuristic = cublas_status(cublasLtMatmulAlgoGetHeuristic(handle, plan.op, plan.a, plan.b, plan.d,
                                                                        plan.d, holder.preference, kMatmulMaxAlgos,
                                                                        results, &returned),
                                         "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
  if (heuristic.code() == StatusCode::unimplemented) {
    plan.support = heuristic.with_context(describe(problem));
    return Status::ok();
  }
  SWARM_RETURN_IF_ERROR(heuristic.with_context(describe(problem)));
  for (int i = 0; i < returned; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS) plan.algos.push_back(results[i]);
  }
  if (plan.algos.empty()) {
    plan.support = unimplemented("{}:{}: {}: cublasLtMatmulAlgoGetHeuristic returned no usable algorithm", __FILE__,
                                 __LINE__, describe(problem));
  }
  return Status::ok();
}

// Runs one GEMM with heuristic candidate `algo`, building and caching its plan on first
// use. unimplemented when cuBLASLt cannot run this problem (callers may fall back).
Status run_gemm(const GemmProblem& problem, const GemmOperands& operands, int algo, cudaStream_t stream) {
  SWARM_ASSIGN_OR_RETURN(DeviceContext * context, device_context());
  const PlanKey key{static_cast<int>(problem.role),
                    problem.N,
                    problem.C,
                    problem.OC,
                    static_cast<int>(problem.ab_type),
                    static_cast<int>(problem.d_type),
                    static_cast<int>(problem.epilogue),
                    alignment_of(operands.a),
                    alignment_of(operands.b),
                    alignment_of(operands.d),
                    operands.bias != nullptr ? alignment_of(operands.bias) : 0u,
                    operands.aux != nullptr ? alignment_of(operands.aux) : 0u};
  std::lock_guard<std::mutex> lock(context->mu);
  std::unique_ptr<Plan>& slot = context->plans[key];
  if (slot == nullptr) {
    auto plan = std::make_unique<Plan>();
    SWARM_RETURN_IF_ERROR(build_plan(context->handle, problem, operands, key, *plan));
    slot = std::move(plan);
  }
  Plan& plan = *slot;
  SWARM_RETURN_IF_ERROR(plan.support);
  if (algo < 0 || algo >= static_cast<int>(plan.algos.size())) {
    return out_of_range("{}: heuristic candidate {} of {}", describe(problem), algo, plan.algos.size());
  }
  if (operands.bias != nullptr) {
    SWARM_CUBLAS_RETURN_IF_ERROR(set_attribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, operands.bias));
  }
  if (operands.aux != nullptr) {
    SWARM_CUBLAS_RETURN_IF_ERROR(set_attribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, operands.aux));
  }
  const float alpha = 1.0f;
  const float beta = operands.accumulate ? 1.0f : 0.0f;
  // A refusal here (NOT_SUPPORTED, before launch) comes back as unimplemented: the
  // caller's fallback runs for this call, and the plan stays as it is.
  return cublas_status(
             cublasLtMatmul(context->handle, plan.op, &alpha, operands.a, plan.a, operands.b, plan.b, &beta,
                            operands.d, plan.d, operands.d, plan.d, &plan.algos[algo].algo, context->workspace,
                            kWorkspaceBytes, stream),
             "cublasLtMatmul", __FILE__, __LINE__)
      .with_context(describe(problem));
}

std::atomic<int64_t> epilogue_fallbacks{0};

Status check_shape(const char* op, int N, int C, int OC, std::initializer_list<const void*> required) {
  if (N < 0 || C < 1 || OC < 1) {
    return invalid_argument("{}: need N >= 0, C >= 1 and OC >= 1, got N={} C={} OC={}", op, N, C, OC);
  }
  if (N == 0) return Status::ok();
  for (const void* p : required) {
    if (p == nullptr) return invalid_argument("{}: a required device pointer is null", op);
  }
  return Status::ok();
}

Status check_algo(const char* op, int algo) {
  if (algo < 0 || algo >= kMatmulMaxAlgos) {
    return out_of_range("{}: algorithm index {} outside [0, {})", op, algo, kMatmulMaxAlgos);
  }
  return Status::ok();
}

// out = inp @ weight^T (+ bias).
template <typename T>
Status forward_gemm(int algo, T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC,
                    cudaStream_t stream) {
  GemmProblem problem{GemmRole::forward, N, C, OC, data_type_of<T>(), data_type_of<T>(), CUBLASLT_EPILOGUE_DEFAULT};
  GemmOperands operands{weight, inp, out, nullptr, nullptr, false};
  if (bias != nullptr && aligned16(bias)) {
    problem.epilogue = CUBLASLT_EPILOGUE_BIAS;
    operands.bias = bias;
    const Status fused = run_gemm(problem, operands, algo, stream);
    if (fused.code() != StatusCode::unimplemented) return fused;
    problem.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    operands.bias = nullptr;
  }
  SWARM_RETURN_IF_ERROR(run_gemm(problem, operands, algo, stream));
  if (bias == nullptr) return Status::ok();
  epilogue_fallbacks.fetch_add(1, std::memory_order_relaxed);
  return matmul_internal::add_bias(out, bias, N, OC, stream);
}

// pre_gelu = inp @ weight^T (+ bias); out = gelu(pre_gelu).
template <typename T>
Status gelu_forward_gemm(int algo, T* out, T* pre_gelu, const T* inp, const T* weight, const T* bias, int N, int C,
                         int OC, cudaStream_t stream) {
  if (OC % 8 == 0 && aligned16(pre_gelu) && (bias == nullptr || aligned16(bias))) {
    const GemmProblem problem{GemmRole::forward, N,
                              C,                 OC,
                              data_type_of<T>(), data_type_of<T>(),
                              bias != nullptr ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX};
    const GemmOperands operands{weight, inp, out, bias, pre_gelu, false};
    const Status fused = run_gemm(problem, operands, algo, stream);
    if (fused.code() != StatusCode::unimplemented) return fused;
  }
  epilogue_fallbacks.fetch_add(1, std::memory_order_relaxed);
  SWARM_RETURN_IF_ERROR(forward_gemm(algo, pre_gelu, inp, weight, bias, N, C, OC, stream));
  return matmul_internal::gelu_forward(out, pre_gelu, static_cast<int64_t>(N) * OC, stream);
}

// dinp += dout @ weight.
template <typename T>
Status backward_input_gemm(int algo, T* dinp, const T* dout, const T* weight, int N, int C, int OC,
                           cudaStream_t stream) {
  const GemmProblem problem{GemmRole::backward_input, N, C, OC, data_type_of<T>(), data_type_of<T>(),
                            CUBLASLT_EPILOGUE_DEFAULT};
  return run_gemm(problem, GemmOperands{weight, dout, dinp, nullptr, nullptr, true}, algo, stream);
}

// dpre = (dout @ weight) * gelu'(pre_gelu).
template <typename T>
Status backward_input_dgelu_gemm(int algo, T* dpre, const T* pre_gelu, const T* dout, const T* weight, int N, int C,
                                 int OC, cudaStream_t stream) {
  if (C % 8 == 0 && aligned16(pre_gelu)) {
    const GemmProblem problem{GemmRole::backward_input, N, C, OC, data_type_of<T>(), data_type_of<T>(),
                              CUBLASLT_EPILOGUE_DGELU};
    const Status fused = run_gemm(problem, GemmOperands{weight, dout, dpre, nullptr, pre_gelu, false}, algo, stream);
    if (fused.code() != StatusCode::unimplemented) return fused;
  }
  epilogue_fallbacks.fetch_add(1, std::memory_order_relaxed);
  const GemmProblem problem{GemmRole::backward_input, N, C, OC, data_type_of<T>(), data_type_of<T>(),
                            CUBLASLT_EPILOGUE_DEFAULT};
  SWARM_RETURN_IF_ERROR(run_gemm(problem, GemmOperands{weight, dout, dpre, nullptr, nullptr, false}, algo, stream));
  return matmul_internal::multiply_gelu_grad(dpre, pre_gelu, static_cast<int64_t>(N) * C, stream);
}

// dweight += dout^T @ inp, fp32 accumulator and output for every input type.
template <typename T>
Status backward_weight_gemm(int algo, float* dweight, const T* dout, const T* inp, int N, int C, int OC,
                            cudaStream_t stream) {
  const GemmProblem problem{GemmRole::backward_weight, N, C, OC, data_type_of<T>(), CUDA_R_32F,
                            CUBLASLT_EPILOGUE_DEFAULT};
  return run_gemm(problem, GemmOperands{inp, dout, dweight, nullptr, nullptr, true}, algo, stream);
}

template <typename T>
Status matmul_forward_impl(T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC,
                           cudaStream_t stream) {
  SWARM_RETURN_IF_ERROR(check_shape("matmul_forward", N, C, OC, {out, inp, weight}));
  if (N == 0) return Status::ok();
  return forward_gemm(0, out, inp, weight, bias, N, C, OC, stream);
}

template <typename T>
Status matmul_gelu_forward_impl(T* out, T* pre_gelu, const T* inp, const T* weight, const T* bias, int N, int C,
                                int OC, cudaStream_t stream) {
  SWARM_RETURN_IF_ERROR(check_shape("matmul_gelu_forward", N, C, OC, {out, pre_gelu, inp, weight}));
  if (N == 0) return Status::ok();
  return gelu_forward_gemm(0, out, pre_gelu, inp, weight, bias, N, C, OC, stream);
}

template <typename T>
Status matmul_backward_impl(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp, const T* weight,
                            int N, int C, int OC, cudaStream_t stream) {
  SWARM_RETURN_IF_ERROR(check_shape("matmul_backward", N, C, OC, {dweight, dout, inp, weight}));
  if (N == 0) return Status::ok();
  if (dinp != nullptr) SWARM_RETURN_IF_ERROR(backward_input_gemm(0, dinp, dout, weight, N, C, OC, stream));
  SWARM_RETURN_IF_ERROR(backward_weight_gemm(0, dweight, dout, inp, N, C, OC, stream));
  if (dbias != nullptr) SWARM_RETURN_IF_ERROR(matmul_internal::column_sum_accumulate(dbias, dout, N, OC, stream));
  return Status::ok();
}

template <typename T>
Status matmul_backward_dgelu_impl(T* dpre, float* dweight, float* dbias, const T* dout, const T* inp,
                                  const T* weight, const T* pre_gelu, int N, int C, int OC, cudaStream_t stream) {
  SWARM_RETURN_IF_ERROR(
      check_shape("matmul_backward_dgelu", N, C, OC, {dpre, dweight, dout, inp, weight, pre_gelu}));
  if (N == 0) return Status::ok();
  SWARM_RETURN_IF_ERROR(backward_weight_gemm(0, dweight, dout, inp, N, C, OC, stream));
  if (dbias != nullptr) SWARM_RETURN_IF_ERROR(matmul_internal::column_sum_accumulate(dbias, dout, N, OC, stream));
  return backward_input_dgelu_gemm(0, dpre, pre_gelu, dout, weight, N, C, OC, stream);
}

}  // namespace

Status matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC,
                      cudaStream_t stream) {
  return matmul_forward_impl(out, inp, weight, bias, N, C, OC, stream);
}
Status matmul_forward(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias, int N, int C, int OC,
                      cudaStream_t stream) {
  return matmul_forward_impl(out, inp, weight, bias, N, C, OC, stream);
}

Status matmul_gelu_forward(float* out, float* pre_gelu, const float* inp, const float* weight, const float* bias,
                           int N, int C, int OC, cudaStream_t stream) {
  return matmul_gelu_forward_impl(out, pre_gelu, inp, weight, bias, N, C, OC, stream);
}
Status matmul_gelu_forward(bf16* out, bf16* pre_gelu, const bf16* inp, const bf16* weight, const bf16* bias, int N,
                           int C, int OC, cudaStream_t stream) {
  return matmul_gelu_forward_impl(out, pre_gelu, inp, weight, bias, N, C, OC, stream);
}

Status matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const float* weight, int N, int C, int OC, cudaStream_t stream) {
  return matmul_backward_impl(dinp, dweight, dbias, dout, inp, weight, N, C, OC, stream);
}
Status matmul_backward(bf16* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp, const bf16* weight,
                       int N, int C, int OC, cudaStream_t stream) {
  return matmul_backward_impl(dinp, dweight, dbias, dout, inp, weight, N, C, OC, stream);
}

Status matmul_backward_dgelu(float* dpre, float* dweight, float* dbias, const float* dout, const float* inp,
                             const float* weight, const float* pre_gelu, int N, int C, int OC, cudaStream_t stream) {
  return matmul_backward_dgelu_impl(dpre, dweight, dbias, dout, inp, weight, pre_gelu, N, C, OC, stream);
}
Status matmul_backward_dgelu(bf16* dpre, float* dweight, float* dbias, const bf16* dout, const bf16* inp,
                             const bf16* weight, const bf16* pre_gelu, int N, int C, int OC, cudaStream_t stream) {
  return matmul_backward_dgelu_impl(dpre, dweight, dbias, dout, inp, weight, pre_gelu, N, C, OC, stream);
}

int64_t matmul_epilogue_fallbacks() { return epilogue_fallbacks.load(std::memory_order_relaxed); }

Status matmul_forward_with_algo(int algo, bf16* out, bf16* pre_gelu, const bf16* inp, const bf16* weight,
                                const bf16* bias, int N, int C, int OC, cudaStream_t stream) {
  SWARM_RETURN_IF_ERROR(check_shape("matmul_forward_with_algo", N, C, OC, {out, inp, weight}));
  SWARM_RETURN_IF_ERROR(check_algo("matmul_forward_with_algo", algo));
  if (N == 0) return Status::ok();
  if (pre_gelu == nullptr) return forward_gemm(algo, out, inp, weight, bias, N, C, OC, stream);
  return gelu_forward_gemm(algo, out, pre_gelu, inp, weight, bias, N, C, OC, stream);
}

Status matmul_backward_input_with_algo(int algo, bf16* dinp, const bf16* pre_gelu, const bf16* dout,
                                       const bf16* weight, int N, int C, int OC, cudaStream_t stream) {
  SWARM_RETURN_IF_ERROR(check_shape("matmul_backward_input_with_algo", N, C, OC, {dinp, dout, weight}));
  SWARM_RETURN_IF_ERROR(check_algo("matmul_backward_input_with_algo", algo));
  if (N == 0) return Status::ok();
  if (pre_gelu == nullptr) return backward_input_gemm(algo, dinp, dout, weight, N, C, OC, stream);
  return backward_input_dgelu_gemm(algo, dinp, pre_gelu, dout, weight, N, C, OC, stream);
}

Status matmul_backward_weight_with_algo(int algo, float* dweight, const bf16* dout, const bf16* inp, int N, int C,
                                        int OC, cudaStream_t stream) {
  SWARM_RETURN_IF_ERROR(check_shape("matmul_backward_weight_with_algo", N, C, OC, {dweight, dout, inp}));
  SWARM_RETURN_IF_ERROR(check_algo("matmul_backward_weight_with_algo", algo));
  if (N == 0) return Status::ok();
  return backward_weight_gemm(algo, dweight, dout, inp, N, C, OC, stream);
}

}  // namespace swarm::cuda
