// CUDA matmul (cuBLASLt) against the CPU backend on random inputs: forward with and
// without bias, the GELU forward, the backward (dinp and dbias present or null) and the
// DGELU backward, for float and bf16, plus bitwise determinism of the backward.
// Device-free cases check the shape errors, the column-major mapping (a host GEMM that
// reads memory exactly as gemm_geometry tells cuBLASLt to, against the CPU GEMMs), the
// GELU math of the fallback kernels and the column-sum partition.
//
// Tolerances. A plain relative error means nothing where a dot product cancels to near
// zero, so errors are measured against the magnitude of what was summed:
//   error_i = |got_i - want_i| / scale_i,  scale_i = sum_k |a_ik b_kj| (+ |bias|, + |initial value|)
// with scale computed by the same CPU GEMMs on absolute values. It bounds floating-point
// error in a dot product, whatever the summation order.
//   float: 2e-5. Two fp32 summation orders differ by ~1e-7 of scale here; TF32 (10-bit
//          mantissa) would differ by ~2e-5 typically and ~1e-4 at worst, and fail.
//   bf16:  1e-2. Inputs are rounded through bf16 for the CPU too; what remains is one or
//          two bf16 roundings of the output (2^-9 each) times at most GELU's slope, 1.13.
// GELU itself (float): |out - gelu_tanh(pre)| <= 5e-5 (1 + |pre|) on the GPU's own pre,
// which tells the tanh approximation from the erf GELU (they differ by up to 4.7e-4).
#include <cuda_runtime_api.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include <fmt/core.h>

#include <doctest/doctest.h>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/matmul.h"
#include "tests/cuda/cuda_test_util.h"

namespace swarm::cuda {
namespace {

using testing::DeviceArray;
using testing::same_bits;
using testing::random_vector;

template <typename T>
constexpr double tolerance() {
  return std::is_same_v<T, float> ? 2e-5 : 1e-2;
}

template <typename T>
const char* type_name() {
  return std::is_same_v<T, float> ? "f32" : "bf16";
}

// The values a kernel of element type T actually sees.
template <typename T>
std::vector<float> seen(const std::vector<float>& v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else return testing::round_through_bf16(v);
}

template <typename T>
std::vector<T> device_values(const std::vector<float>& v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else return testing::to_bf16(v);
}

template <typename T>
std::vector<float> host_floats(const std::vector<T>& v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else return testing::from_bf16(v);
}

std::vector<float> abs_of(const std::vector<float>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = std::abs(v[i]);
  return out;
}

// max_i |got_i - want_i| / scale_i; NaN counts as the worst.
double max_scaled_error(const std::vector<float>& got, const std::vector<float>& want,
                        const std::vector<float>& scale) {
  if (got.size() != want.size() || got.size() != scale.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(double(got[i]) - want[i]) / (double(scale[i]) + 1e-30);
    if (!(err <= worst)) worst = err;
  }
  return worst;
}


// A layer's inputs as the kernel sees them: inp ~ N(0, 1), weight ~ N(0, 1/C) (outputs
// of order 1, as in a trained model), bias ~ N(0, 0.25).
template <typename T>
struct LayerData {
  std::vector<float> inp, weight, bias;
  LayerData(int N, int C, int OC, uint32_t seed)
      : inp(seen<T>(random_vector(size_t(N) * C, seed))),
        weight(seen<T>(random_vector(size_t(OC) * C, seed + 1, 1.0f / std::sqrt(float(C))))),
        bias(seen<T>(random_vector(OC, seed + 2, 0.5f))) {}
};

struct Shape {
  int N, C, OC;
};
constexpr Shape kShapes[] = {{37, 100, 33}, {64, 64, 128}, {256, 768, 2304}};

template <typename T>
void check_forward(Shape s, bool with_bias) {
  INFO(type_name<T>() << " N=" << s.N << " C=" << s.C << " OC=" << s.OC << " bias=" << with_bias);
  const LayerData<T> layer(s.N, s.C, s.OC, 10);
  const size_t n_out = size_t(s.N) * s.OC;
  std::vector<float> want(n_out), scale(n_out);
  cpu::matmul_forward(want.data(), layer.inp.data(), layer.weight.data(), with_bias ? layer.bias.data() : nullptr,
                      s.N, s.C, s.OC);
  const auto abs_bias = abs_of(layer.bias);
  cpu::matmul_forward(scale.data(), abs_of(layer.inp).data(), abs_of(layer.weight).data(),
                      with_bias ? abs_bias.data() : nullptr, s.N, s.C, s.OC);

  DeviceArray<T> d_inp(device_values<T>(layer.inp)), d_weight(device_values<T>(layer.weight)),
      d_bias(device_values<T>(layer.bias)), d_out(n_out);
  const Status status = matmul_forward(d_out.get(), d_inp.get(), d_weight.get(), with_bias ? d_bias.get() : nullptr,
                                       s.N, s.C, s.OC, nullptr);
  REQUIRE_MESSAGE(status.is_ok(), status.to_string());
  CHECK(max_scaled_error(host_floats(d_out.to_host()), want, scale) < tolerance<T>());
}

template <typename T>
void check_gelu_forward(Shape s, bool with_bias) {
  INFO(type_name<T>() << " N=" << s.N << " C=" << s.C << " OC=" << s.OC << " bias=" << with_bias);
  const LayerData<T> layer(s.N, s.C, s.OC, 20);
  const size_t n_out = size_t(s.N) * s.OC;
  std::vector<float> want_pre(n_out), want_out(n_out), scale(n_out);
  cpu::matmul_forward(want_pre.data(), layer.inp.data(), layer.weight.data(),
                      with_bias ? layer.bias.data() : nullptr, s.N, s.C, s.OC);
  cpu::gelu_forward(want_out.data(), want_pre.data(), int64_t(n_out));
  const auto abs_bias = abs_of(layer.bias);
  cpu::matmul_forward(scale.data(), abs_of(layer.inp).data(), abs_of(layer.weight).data(),
                      with_bias ? abs_bias.data() : nullptr, s.N, s.C, s.OC);

  DeviceArray<T> d_inp(device_values<T>(layer.inp)), d_weight(device_values<T>(layer.weight)),
      d_bias(device_values<T>(layer.bias)), d_out(n_out), d_pre(n_out);
  const Status status = matmul_gelu_forward(d_out.get(), d_pre.get(), d_inp.get(), d_weight.get(),
                                            with_bias ? d_bias.get() : nullptr, s.N, s.C, s.OC, nullptr);
  REQUIRE_MESSAGE(status.is_ok(), status.to_string());
  const auto got_pre = host_floats(d_pre.to_host());
  const auto got_out = host_floats(d_out.to_host());
  CHECK(max_scaled_error(got_pre, want_pre, scale) < tolerance<T>());
  CHECK(max_scaled_error(got_out, want_out, scale) < tolerance<T>());
  if constexpr (std::is_same_v<T, float>) {
    std::vector<float> gelu_of_got(n_out);
    cpu::gelu_forward(gelu_of_got.data(), got_pre.data(), int64_t(n_out));
    double worst = 0;
    for (size_t i = 0; i < n_out; ++i) {
      const double err = std::abs(double(got_out[i]) - gelu_of_got[i]) / (1.0 + std::abs(double(got_pre[i])));
      if (!(err <= worst)) worst = err;
    }
    CHECK(worst < 5e-5);
  }
}

template <typename T>
void check_backward(Shape s, bool with_dinp, bool with_dbias) {
  INFO(type_name<T>() << " N=" << s.N << " C=" << s.C << " OC=" << s.OC << " dinp=" << with_dinp
                      << " dbias=" << with_dbias);
  const LayerData<T> layer(s.N, s.C, s.OC, 30);
  const auto dout = seen<T>(random_vector(size_t(s.N) * s.OC, 33));
  // Backward adds: start every gradient from nonzero values.
  const auto dinp0 = seen<T>(random_vector(size_t(s.N) * s.C, 34, 0.5f));
  const auto dweight0 = random_vector(size_t(s.OC) * s.C, 35, 0.5f);
  const auto dbias0 = random_vector(s.OC, 36, 0.5f);

  auto want_dinp = dinp0, want_dweight = dweight0, want_dbias = dbias0;
  cpu::matmul_backward(with_dinp ? want_dinp.data() : nullptr, want_dweight.data(),
                       with_dbias ? want_dbias.data() : nullptr, dout.data(), layer.inp.data(), layer.weight.data(),
                       s.N, s.C, s.OC);
  auto scale_dinp = abs_of(dinp0), scale_dweight = abs_of(dweight0), scale_dbias = abs_of(dbias0);
  cpu::matmul_backward(scale_dinp.data(), scale_dweight.data(), scale_dbias.data(), abs_of(dout).data(),
                       abs_of(layer.inp).data(), abs_of(layer.weight).data(), s.N, s.C, s.OC);

  DeviceArray<T> d_inp(device_values<T>(layer.inp)), d_weight(device_values<T>(layer.weight)),
      d_dout(device_values<T>(dout));
  // Twice from the same start: the second run must give the same bits.
  std::vector<std::vector<T>> dinp_runs;
  std::vector<std::vector<float>> dweight_runs, dbias_runs;
  for (int run = 0; run < 2; ++run) {
    DeviceArray<T> d_dinp(device_values<T>(dinp0));
    DeviceArray<float> d_dweight(dweight0), d_dbias(dbias0);
    const Status status = matmul_backward(with_dinp ? d_dinp.get() : nullptr, d_dweight.get(),
                                          with_dbias ? d_dbias.get() : nullptr, d_dout.get(), d_inp.get(),
                                          d_weight.get(), s.N, s.C, s.OC, nullptr);
    REQUIRE_MESSAGE(status.is_ok(), status.to_string());
    dinp_runs.push_back(d_dinp.to_host());
    dweight_runs.push_back(d_dweight.to_host());
    dbias_runs.push_back(d_dbias.to_host());
  }
  if (with_dinp) CHECK(max_scaled_error(host_floats(dinp_runs[0]), want_dinp, scale_dinp) < tolerance<T>());
  CHECK(max_scaled_error(dweight_runs[0], want_dweight, scale_dweight) < tolerance<T>());
  if (with_dbias) CHECK(max_scaled_error(dbias_runs[0], want_dbias, scale_dbias) < tolerance<T>());
  CHECK(same_bits(dinp_runs[0], dinp_runs[1]));
  CHECK(same_bits(dweight_runs[0], dweight_runs[1]));
  CHECK(same_bits(dbias_runs[0], dbias_runs[1]));
}

template <typename T>
void check_backward_dgelu(Shape s, bool with_dbias) {
  INFO(type_name<T>() << " N=" << s.N << " C=" << s.C << " OC=" << s.OC << " dbias=" << with_dbias);
  const size_t n_in = size_t(s.N) * s.C;
  const LayerData<T> layer(s.N, s.C, s.OC, 40);
  // pre_gelu spread over GELU's curved region; the layer's input is gelu(pre_gelu).
  const auto pre = seen<T>(random_vector(n_in, 43, 1.5f));
  std::vector<float> gelu_of_pre(n_in);
  cpu::gelu_forward(gelu_of_pre.data(), pre.data(), int64_t(n_in));
  const auto inp = seen<T>(gelu_of_pre);
  const auto dout = seen<T>(random_vector(size_t(s.N) * s.OC, 44));
  const auto dweight0 = random_vector(size_t(s.OC) * s.C, 45, 0.5f);
  const auto dbias0 = random_vector(s.OC, 46, 0.5f);

  std::vector<float> dgelu_out(n_in, 0.0f), want_dpre(n_in, 0.0f);
  auto want_dweight = dweight0, want_dbias = dbias0;
  cpu::matmul_backward(dgelu_out.data(), want_dweight.data(), with_dbias ? want_dbias.data() : nullptr, dout.data(),
                       inp.data(), layer.weight.data(), s.N, s.C, s.OC);
  cpu::gelu_backward(want_dpre.data(), pre.data(), dgelu_out.data(), int64_t(n_in));
  // dpre's scale is that of dout @ weight: GELU's slope is at most 1.13.
  std::vector<float> scale_dpre(n_in, 0.0f);
  auto scale_dweight = abs_of(dweight0), scale_dbias = abs_of(dbias0);
  cpu::matmul_backward(scale_dpre.data(), scale_dweight.data(), scale_dbias.data(), abs_of(dout).data(),
                       abs_of(inp).data(), abs_of(layer.weight).data(), s.N, s.C, s.OC);

  DeviceArray<T> d_inp(device_values<T>(inp)), d_weight(device_values<T>(layer.weight)),
      d_dout(device_values<T>(dout)), d_pre(device_values<T>(pre));
  std::vector<std::vector<T>> dpre_runs;
  std::vector<std::vector<float>> dweight_runs, dbias_runs;
  for (int run = 0; run < 2; ++run) {
    // dpre is overwritten: start it from garbage.
    DeviceArray<T> d_dpre(device_values<T>(std::vector<float>(n_in, 7.0f)));
    DeviceArray<float> d_dweight(dweight0), d_dbias(dbias0);
    const Status status = matmul_backward_dgelu(d_dpre.get(), d_dweight.get(), with_dbias ? d_dbias.get() : nullptr,
                                                d_dout.get(), d_inp.get(), d_weight.get(), d_pre.get(), s.N, s.C,
                                                s.OC, nullptr);
    REQUIRE_MESSAGE(status.is_ok(), status.to_string());
    dpre_runs.push_back(d_dpre.to_host());
    dweight_runs.push_back(d_dweight.to_host());
    dbias_runs.push_back(d_dbias.to_host());
  }
  CHECK(max_scaled_error(host_floats(dpre_runs[0]), want_dpre, scale_dpre) < tolerance<T>());
  CHECK(max_scaled_error(dweight_runs[0], want_dweight, scale_dweight) < tolerance<T>());
  if (with_dbias) CHECK(max_scaled_error(dbias_runs[0], want_dbias, scale_dbias) < tolerance<T>());
  CHECK(same_bits(dpre_runs[0], dpre_runs[1]));
  CHECK(same_bits(dweight_runs[0], dweight_runs[1]));
  CHECK(same_bits(dbias_runs[0], dbias_runs[1]));
}

TEST_CASE("CUDA matmul forward matches the CPU backend, with and without bias") {
  if (testing::skip_without_device()) return;
  for (Shape s : kShapes) {
    for (bool with_bias : {true, false}) {
      check_forward<float>(s, with_bias);
      check_forward<bf16>(s, with_bias);
    }
  }
  fmt::print("matmul epilogue fallbacks so far: {}\n", matmul_epilogue_fallbacks());
}

TEST_CASE("CUDA matmul GELU forward matches the CPU backend (tanh GELU)") {
  if (testing::skip_without_device()) return;
  for (Shape s : kShapes) {
    for (bool with_bias : {true, false}) {
      check_gelu_forward<float>(s, with_bias);
      check_gelu_forward<bf16>(s, with_bias);
    }
  }
  fmt::print("matmul epilogue fallbacks so far: {}\n", matmul_epilogue_fallbacks());
}

TEST_CASE("CUDA matmul backward matches the CPU backend and is bitwise deterministic") {
  if (testing::skip_without_device()) return;
  for (Shape s : kShapes) {
    check_backward<float>(s, true, true);
    check_backward<bf16>(s, true, true);
  }
  for (Shape s : {kShapes[0], kShapes[1]}) {
    check_backward<float>(s, false, true);
    check_backward<bf16>(s, false, true);
    check_backward<float>(s, true, false);
    check_backward<bf16>(s, true, false);
  }
}

TEST_CASE("CUDA matmul DGELU backward matches the CPU backend and is bitwise deterministic") {
  if (testing::skip_without_device()) return;
  for (Shape s : kShapes) {
    check_backward_dgelu<float>(s, true);
    check_backward_dgelu<bf16>(s, true);
  }
  check_backward_dgelu<float>(kShapes[0], false);
  check_backward_dgelu<bf16>(kShapes[1], false);
  fmt::print("matmul epilogue fallbacks so far: {}\n", matmul_epilogue_fallbacks());
}

TEST_CASE("CUDA matmul: every heuristic candidate the benchmark times computes the same GEMM") {
  if (testing::skip_without_device()) return;
  const Shape s{64, 64, 128};
  const LayerData<bf16> layer(s.N, s.C, s.OC, 50);
  const size_t n_out = size_t(s.N) * s.OC;
  std::vector<float> want(n_out), scale(n_out);
  cpu::matmul_forward(want.data(), layer.inp.data(), layer.weight.data(), layer.bias.data(), s.N, s.C, s.OC);
  cpu::matmul_forward(scale.data(), abs_of(layer.inp).data(), abs_of(layer.weight).data(),
                      abs_of(layer.bias).data(), s.N, s.C, s.OC);
  DeviceArray<bf16> d_inp(testing::to_bf16(layer.inp)), d_weight(testing::to_bf16(layer.weight)),
      d_bias(testing::to_bf16(layer.bias)), d_out(n_out), d_reference(n_out);
  REQUIRE(matmul_forward(d_reference.get(), d_inp.get(), d_weight.get(), d_bias.get(), s.N, s.C, s.OC, nullptr)
              .is_ok());
  int candidates = 0;
  for (int algo = 0; algo < kMatmulMaxAlgos; ++algo) {
    INFO("candidate " << algo);
    const Status status = matmul_forward_with_algo(algo, d_out.get(), nullptr, d_inp.get(), d_weight.get(),
                                                   d_bias.get(), s.N, s.C, s.OC, nullptr);
    if (status.code() == StatusCode::out_of_range) break;
    REQUIRE_MESSAGE(status.is_ok(), status.to_string());
    ++candidates;
    const auto got = d_out.to_host();
    CHECK(max_scaled_error(testing::from_bf16(got), want, scale) < tolerance<bf16>());
    if (algo == 0) CHECK(same_bits(got, d_reference.to_host()));  // candidate 0 is what matmul_forward runs
  }
  CHECK(candidates >= 1);
  CHECK(matmul_forward_with_algo(kMatmulMaxAlgos, d_out.get(), nullptr, d_inp.get(), d_weight.get(), d_bias.get(),
                                 s.N, s.C, s.OC, nullptr)
            .code() == StatusCode::out_of_range);
  fmt::print("bf16 forward {}x{}->{}: {} heuristic candidates\n", s.N, s.C, s.OC, candidates);
}

// --- Device-free ------------------------------------------------------------------------

template <typename T>
void check_shape_errors() {
  INFO(type_name<T>());
  T* p = nullptr;
  float* f = nullptr;
  for (auto [N, C, OC] : {Shape{4, 0, 8}, Shape{4, 8, 0}, Shape{-1, 8, 8}, Shape{4, 8, 8}}) {
    INFO("N=" << N << " C=" << C << " OC=" << OC);  // the last shape is valid, its pointers null
    CHECK(matmul_forward(p, p, p, p, N, C, OC, nullptr).code() == StatusCode::invalid_argument);
    CHECK(matmul_gelu_forward(p, p, p, p, p, N, C, OC, nullptr).code() == StatusCode::invalid_argument);
    CHECK(matmul_backward(p, f, f, p, p, p, N, C, OC, nullptr).code() == StatusCode::invalid_argument);
    CHECK(matmul_backward_dgelu(p, f, f, p, p, p, p, N, C, OC, nullptr).code() == StatusCode::invalid_argument);
  }
  // N == 0 is an empty batch: nothing to do, nothing dereferenced.
  CHECK(matmul_forward(p, p, p, p, 0, 8, 8, nullptr).is_ok());
  CHECK(matmul_gelu_forward(p, p, p, p, p, 0, 8, 8, nullptr).is_ok());
  CHECK(matmul_backward(p, f, f, p, p, p, 0, 8, 8, nullptr).is_ok());
  CHECK(matmul_backward_dgelu(p, f, f, p, p, p, p, 0, 8, 8, nullptr).is_ok());
}

TEST_CASE("CUDA matmul refuses bad shapes and null pointers with a status, before touching the device") {
  check_shape_errors<float>();
  check_shape_errors<bf16>();
  bf16* p = nullptr;
  float* f = nullptr;
  CHECK(matmul_forward_with_algo(0, p, p, p, p, p, 4, 8, 8, nullptr).code() == StatusCode::invalid_argument);
  CHECK(matmul_backward_input_with_algo(0, p, p, p, p, 4, 8, 8, nullptr).code() == StatusCode::invalid_argument);
  CHECK(matmul_backward_weight_with_algo(0, f, p, p, 4, 8, 0, nullptr).code() == StatusCode::invalid_argument);
  CHECK(matmul_forward_with_algo(-1, p, p, p, p, p, 0, 8, 8, nullptr).code() == StatusCode::out_of_range);
  CHECK(matmul_backward_weight_with_algo(kMatmulMaxAlgos, f, p, p, 0, 8, 8, nullptr).code() ==
        StatusCode::out_of_range);
}

// D = op(A) op(B), reading memory exactly as gemm_geometry describes it to cuBLASLt
// (column-major, leading dimensions, transposes), in double.
std::vector<float> column_major_gemm(const GemmGeometry& g, const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> d(size_t(g.d.ld * g.d.cols), 0.0f);
  for (int64_t j = 0; j < g.n; ++j) {
    for (int64_t i = 0; i < g.m; ++i) {
      double sum = 0;
      for (int64_t p = 0; p < g.k; ++p) {
        const float a_ip = g.transpose_a ? a[size_t(p + i * g.a.ld)] : a[size_t(i + p * g.a.ld)];
        const float b_pj = g.transpose_b ? b[size_t(j + p * g.b.ld)] : b[size_t(p + j * g.b.ld)];
        sum += double(a_ip) * b_pj;
      }
      d[size_t(i + j * g.d.ld)] = float(sum);
    }
  }
  return d;
}

void check_stored_shapes(const GemmGeometry& g) {
  // op(A) is m x k, op(B) is k x n, D is m x n; every leading dimension covers its rows.
  CHECK(g.a.rows == (g.transpose_a ? g.k : g.m));
  CHECK(g.a.cols == (g.transpose_a ? g.m : g.k));
  CHECK(g.b.rows == (g.transpose_b ? g.n : g.k));
  CHECK(g.b.cols == (g.transpose_b ? g.k : g.n));
  CHECK(g.d.rows == g.m);
  CHECK(g.d.cols == g.n);
  CHECK(g.a.ld >= g.a.rows);
  CHECK(g.b.ld >= g.b.rows);
  CHECK(g.d.ld >= g.d.rows);
}

TEST_CASE("gemm_geometry: the column-major problems compute the row-major CPU GEMMs") {
  for (Shape s : {Shape{37, 100, 33}, Shape{5, 8, 3}, Shape{1, 1, 1}, Shape{2, 1, 7}}) {
    INFO("N=" << s.N << " C=" << s.C << " OC=" << s.OC);
    const auto inp = random_vector(size_t(s.N) * s.C, 60);
    const auto weight = random_vector(size_t(s.OC) * s.C, 61);
    const auto dout = random_vector(size_t(s.N) * s.OC, 62);

    const GemmGeometry forward = gemm_geometry(GemmRole::forward, s.N, s.C, s.OC);
    check_stored_shapes(forward);
    std::vector<float> out(size_t(s.N) * s.OC);
    cpu::matmul_forward(out.data(), inp.data(), weight.data(), nullptr, s.N, s.C, s.OC);
    CHECK(max_scaled_error(column_major_gemm(forward, weight, inp), out,
                           column_major_gemm(forward, abs_of(weight), abs_of(inp))) < 1e-5);

    std::vector<float> dinp(size_t(s.N) * s.C, 0.0f), dweight(size_t(s.OC) * s.C, 0.0f);
    cpu::matmul_backward(dinp.data(), dweight.data(), nullptr, dout.data(), inp.data(), weight.data(), s.N, s.C,
                         s.OC);
    const GemmGeometry input = gemm_geometry(GemmRole::backward_input, s.N, s.C, s.OC);
    check_stored_shapes(input);
    CHECK(max_scaled_error(column_major_gemm(input, weight, dout), dinp,
                           column_major_gemm(input, abs_of(weight), abs_of(dout))) < 1e-5);
    const GemmGeometry weight_grad = gemm_geometry(GemmRole::backward_weight, s.N, s.C, s.OC);
    check_stored_shapes(weight_grad);
    CHECK(max_scaled_error(column_major_gemm(weight_grad, inp, dout), dweight,
                           column_major_gemm(weight_grad, abs_of(inp), abs_of(dout))) < 1e-5);
  }
}

TEST_CASE("The fallback GELU math matches the CPU backend's GELU and its derivative") {
  std::vector<float> x;
  for (int i = -800; i <= 800; ++i) x.push_back(0.01f * float(i));
  std::vector<float> want(x.size()), want_grad(x.size(), 0.0f), ones(x.size(), 1.0f), got(x.size()),
      got_grad(x.size());
  cpu::gelu_forward(want.data(), x.data(), int64_t(x.size()));
  cpu::gelu_backward(want_grad.data(), x.data(), ones.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    got[i] = matmul_internal::gelu(x[i]);
    got_grad[i] = matmul_internal::gelu_grad(x[i]);
  }
  // Eigen's vectorized tanh against libm's tanhf: a few ulp of tanh apart, which is an
  // absolute error where GELU's tails round 1 + tanh to a few ulp: floor 1 (absolute
  // below 1, relative above).
  CHECK(testing::max_relative_error(got, want, /*floor=*/1.0) < 1e-5);
  CHECK(testing::max_relative_error(got_grad, want_grad, /*floor=*/1.0) < 1e-5);
}

TEST_CASE("The dbias column-sum partition covers every row and fits CUDA's grid") {
  using matmul_internal::column_sum_chunks;
  using matmul_internal::column_sum_rows_per_chunk;
  CHECK(column_sum_chunks(0) == 0);
  CHECK(column_sum_chunks(1) == 1);
  CHECK(column_sum_chunks(256) == 1);
  CHECK(column_sum_chunks(257) == 2);
  CHECK(column_sum_chunks(8192) == 32);
  for (int N : {1, 255, 256, 257, 8192, 65535 * 256, 65535 * 256 + 1, 100000000, INT_MAX}) {
    INFO("N=" << N);
    const int64_t rows = column_sum_rows_per_chunk(N), chunks = column_sum_chunks(N);
    CHECK(rows >= matmul_internal::kColumnSumRowsPerChunk);
    CHECK(chunks <= matmul_internal::kMaxGridY);
    CHECK(chunks * rows >= N);        // every row in some chunk
    CHECK((chunks - 1) * rows < N);   // and no empty chunk
  }
}

}  // namespace
}  // namespace swarm::cuda
