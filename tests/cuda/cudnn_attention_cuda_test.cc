// cuDNN fused attention (bf16) against the CPU backend on the same bf16-rounded
// inputs: out, the log-sum-exp statistics, and the gradients backward adds into a
// non-zero dqkv. Tolerance: |got - want| <= 1e-2 + 3e-2 * |want| everywhere (3e-2
// relative with a 1e-2 absolute floor). The floor is absolute because cuDNN's
// engines round the probabilities (and dS) to bf16 before the second GEMMs, which
// leaves errors of ~1e-3 whatever the size of the result, and the results are
// rounded to bf16 at the end (2^-9 relative). Plus bitwise determinism of forward,
// and of backward when cuDNN's chosen engine is deterministic; and the device-free
// argument checks.
#include "kernels/cuda/cudnn_attention.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "kernels/cpu/ops.h"
#include "tests/cuda/cuda_test_util.h"

namespace swarm::cuda {
namespace {

using testing::DeviceArray;
using testing::same_bits;
using testing::from_bf16;
using testing::random_vector;
using testing::round_through_bf16;
using testing::to_bf16;

// The largest |got - want| / (atol + rtol * |want|): at most 1 passes. NaN fails.
double worst_allclose_ratio(const std::vector<float>& got, const std::vector<float>& want, double rtol = 3e-2,
                            double atol = 1e-2) {
  if (got.size() != want.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double ratio = std::abs(double(got[i]) - want[i]) / (atol + rtol * std::abs(double(want[i])));
    if (!(ratio <= worst)) worst = ratio;
  }
  return worst;
}

// lse[(b*NH + h)*T + t] = log sum_{j <= t} exp(q_t . k_j / sqrt(hd)), in double.
std::vector<float> reference_lse(const std::vector<float>& qkv, int B, int T, int C, int NH) {
  const int hd = C / NH;
  const double scale = 1.0 / std::sqrt(double(hd));
  std::vector<float> lse(size_t(B) * NH * T);
  std::vector<double> scores(T);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int t = 0; t < T; ++t) {
        const float* q = qkv.data() + (size_t(b) * T + t) * 3 * C + h * hd;
        double max_score = -INFINITY;
        for (int j = 0; j <= t; ++j) {
          const float* k = qkv.data() + (size_t(b) * T + j) * 3 * C + C + h * hd;
          double dot = 0;
          for (int d = 0; d < hd; ++d) dot += double(q[d]) * k[d];
          scores[j] = dot * scale;
          max_score = std::max(max_score, scores[j]);
        }
        double sum = 0;
        for (int j = 0; j <= t; ++j) sum += std::exp(scores[j] - max_score);
        lse[(size_t(b) * NH + h) * T + t] = float(max_score + std::log(sum));
      }
    }
  }
  return lse;
}

struct Case {
  int B, T, C, NH;
};
constexpr Case kCases[] = {{2, 64, 128, 2}, {1, 128, 256, 2}, {4, 256, 768, 12}};


TEST_CASE("cuDNN attention (bf16) matches the CPU backend, forward and backward") {
  if (testing::skip_without_device()) return;
  for (const Case& c : kCases) {
    const auto [B, T, C, NH] = c;
    INFO("B=" << B << " T=" << T << " C=" << C << " NH=" << NH);
    const size_t n_qkv = size_t(B) * T * 3 * C, n_out = size_t(B) * T * C;
    const auto qkv = round_through_bf16(random_vector(n_qkv, 1));
    const auto dout = round_through_bf16(random_vector(n_out, 2));
    const auto dqkv_start = round_through_bf16(random_vector(n_qkv, 3, 0.5f));  // backward adds onto this

    std::vector<float> out(n_out), att(size_t(B) * NH * T * T), dqkv = dqkv_start;
    cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
    const auto lse = reference_lse(qkv, B, T, C, NH);

    DeviceArray<bf16> d_qkv(to_bf16(qkv)), d_out(n_out), d_dout(to_bf16(dout)), d_dqkv(to_bf16(dqkv_start));
    DeviceArray<float> scratch(size_t(cudnn_attention_scratch_floats(B, T, NH)));
    Status status = cudnn_attention_forward(d_out.get(), scratch.get(), d_qkv.get(), B, T, C, NH, nullptr);
    REQUIRE_MESSAGE(status.is_ok(), status.to_string());
    const double out_ratio = worst_allclose_ratio(from_bf16(d_out.to_host()), out);
    const double lse_ratio = worst_allclose_ratio(scratch.to_host(), lse);
    MESSAGE("forward: worst error / tolerance: out " << out_ratio << ", lse " << lse_ratio);
    CHECK(out_ratio <= 1.0);
    CHECK(lse_ratio <= 1.0);

    status = cudnn_attention_backward(d_dqkv.get(), scratch.get(), d_dout.get(), d_qkv.get(), d_out.get(), B, T, C,
                                      NH, nullptr);
    REQUIRE_MESSAGE(status.is_ok(), status.to_string());
    const double dqkv_ratio = worst_allclose_ratio(from_bf16(d_dqkv.to_host()), dqkv);
    MESSAGE("backward: worst error / tolerance: dqkv " << dqkv_ratio);
    CHECK(dqkv_ratio <= 1.0);
  }
}

TEST_CASE("cuDNN attention gives the same bits on every run") {
  if (testing::skip_without_device()) return;
  const int B = 4, T = 256, C = 768, NH = 12;
  const size_t n_qkv = size_t(B) * T * 3 * C, n_out = size_t(B) * T * C;
  const auto qkv = to_bf16(random_vector(n_qkv, 21));
  const auto dout = to_bf16(random_vector(n_out, 22));
  const auto dqkv_start = to_bf16(random_vector(n_qkv, 23, 0.5f));
  DeviceArray<bf16> d_qkv(qkv), d_dout(dout);

  std::vector<bf16> first_out, first_dqkv;
  std::vector<float> first_lse;
  for (int run = 0; run < 2; ++run) {
    DeviceArray<bf16> d_out(n_out), d_dqkv(dqkv_start);
    DeviceArray<float> scratch(size_t(cudnn_attention_scratch_floats(B, T, NH)));
    Status status = cudnn_attention_forward(d_out.get(), scratch.get(), d_qkv.get(), B, T, C, NH, nullptr);
    REQUIRE_MESSAGE(status.is_ok(), status.to_string());
    status = cudnn_attention_backward(d_dqkv.get(), scratch.get(), d_dout.get(), d_qkv.get(), d_out.get(), B, T, C,
                                      NH, nullptr);
    REQUIRE_MESSAGE(status.is_ok(), status.to_string());
    if (run == 0) {
      first_out = d_out.to_host();
      first_lse = scratch.to_host();
      first_dqkv = d_dqkv.to_host();
      continue;
    }
    CHECK(same_bits(d_out.to_host(), first_out));
    CHECK(same_bits(scratch.to_host(), first_lse));
    if (cudnn_attention_backward_is_deterministic(B, T, C, NH)) {
      CHECK(same_bits(d_dqkv.to_host(), first_dqkv));
    } else {
      MESSAGE("cuDNN picked a backward engine it does not call deterministic; bits: "
              << (same_bits(d_dqkv.to_host(), first_dqkv) ? "same" : "differ"));
    }
  }
}

TEST_CASE("cuDNN attention checks its arguments before touching the device") {
  // Never dereferenced: every call below returns before any device work.
  alignas(16) static float f[64];
  alignas(16) static bf16 h[64];
  const cudaStream_t stream = nullptr;

  CHECK(cudnn_attention_scratch_floats(2, 64, 2) == 2 * 64 * 2);

  // float: cuDNN's fused attention is 16-bit only.
  CHECK(cudnn_attention_forward(f, f, f, 2, 64, 128, 2, stream).code() == StatusCode::unimplemented);
  CHECK(cudnn_attention_backward(f, f, f, f, f, 2, 64, 128, 2, stream).code() == StatusCode::unimplemented);

  // Bad shapes and null pointers, both element types.
  for (auto [B, T, C, NH] : {Case{0, 64, 128, 2}, Case{2, 0, 128, 2}, Case{2, 64, 0, 2}, Case{2, 64, 128, 0},
                             Case{2, 64, 130, 4}, Case{-1, 64, 128, 2}}) {
    INFO("B=" << B << " T=" << T << " C=" << C << " NH=" << NH);
    CHECK(cudnn_attention_forward(h, f, h, B, T, C, NH, stream).code() == StatusCode::invalid_argument);
    CHECK(cudnn_attention_backward(h, f, h, h, h, B, T, C, NH, stream).code() == StatusCode::invalid_argument);
    CHECK(cudnn_attention_forward(f, f, f, B, T, C, NH, stream).code() == StatusCode::invalid_argument);
    CHECK(cudnn_attention_backward(f, f, f, f, f, B, T, C, NH, stream).code() == StatusCode::invalid_argument);
  }
  CHECK(cudnn_attention_forward(nullptr, f, h, 2, 64, 128, 2, stream).code() == StatusCode::invalid_argument);
  CHECK(cudnn_attention_forward(h, nullptr, h, 2, 64, 128, 2, stream).code() == StatusCode::invalid_argument);
  CHECK(cudnn_attention_backward(h, f, nullptr, h, h, 2, 64, 128, 2, stream).code() ==
        StatusCode::invalid_argument);
  CHECK(cudnn_attention_backward(h, f, h, h, nullptr, 2, 64, 128, 2, stream).code() ==
        StatusCode::invalid_argument);

  // Head dims cuDNN rejects: not a multiple of 8 (20), above 256 (512).
  for (auto [C, NH] : {std::pair{40, 2}, std::pair{1024, 2}}) {
    INFO("C=" << C << " NH=" << NH);
    const Status forward = cudnn_attention_forward(h, f, h, 2, 64, C, NH, stream);
    CHECK(forward.code() == StatusCode::unimplemented);
    CHECK(forward.message().find("head dim") != std::string::npos);
    CHECK(cudnn_attention_backward(h, f, h, h, h, 2, 64, C, NH, stream).code() == StatusCode::unimplemented);
  }

  // Buffers cuDNN cannot take: not 16-byte aligned.
  CHECK(cudnn_attention_forward(h + 1, f, h, 2, 64, 128, 2, stream).code() == StatusCode::unimplemented);
  CHECK(cudnn_attention_backward(h, f, h, h + 1, h, 2, 64, 128, 2, stream).code() == StatusCode::unimplemented);

  // Nothing built for this shape, so nothing to vouch for.
  CHECK_FALSE(cudnn_attention_backward_is_deterministic(3, 5, 8, 1));
}

}  // namespace
}  // namespace swarm::cuda
