// CUDA maxout against the CPU backend, float and bf16, forward and backward, on
// random rows with planted ties and NaNs. Maxout only selects and adds, so the
// comparison is exact: forward copies the winning input, backward adds one
// value once (for bf16, the CPU's float sum of the same bf16 inputs, rounded
// once to nearest even, is the device's result bit for bit).
#include <cuda_runtime_api.h>

#include <cmath>
#include <vector>

#include <doctest/doctest.h>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/maxout.h"
#include "tests/cuda/cuda_test_util.h"

namespace swarm::cuda {
namespace {

using testing::as_float;
using testing::as_type;
using testing::DeviceArray;
using testing::random_vector;
using testing::same_bits;

// What a kernel on T sees of float data: bf16 rounds, float is exact.
template <typename T>
std::vector<float> as_seen(const std::vector<float>& v) {
  return as_float<T>(as_type<T>(v));
}

// Random rows, with some slices copied onto others (ties) and a few NaNs.
std::vector<float> inputs_with_ties(int N, int C, int k) {
  auto x = random_vector(size_t(N) * C, 21);
  const int W = C / k;
  for (int n = 0; n < N; n += 3) {
    for (int j = 0; j < W; ++j) x[size_t(n) * C + (k - 1) * W + j] = x[size_t(n) * C + j];
  }
  if (N > 7) x[size_t(7) * C + 1] = NAN;
  return x;
}

template <typename T>
void check_against_cpu(int N, int C, int k) {
  INFO("N=" << N << " C=" << C << " k=" << k << (std::is_same_v<T, bf16> ? " bf16" : " float"));
  const int W = C / k;
  const auto x = as_seen<T>(inputs_with_ties(N, C, k));
  const auto dout = as_seen<T>(random_vector(size_t(N) * W, 22));
  const auto dinp0 = as_seen<T>(random_vector(size_t(N) * C, 23));  // backward adds into it

  std::vector<float> want_out(size_t(N) * W), want_dinp = dinp0;
  cpu::maxout_forward(want_out.data(), x.data(), N, C, k);
  cpu::maxout_backward(want_dinp.data(), dout.data(), x.data(), N, C, k);

  DeviceArray<T> d_x(as_type<T>(x)), d_out(size_t(N) * W), d_dout(as_type<T>(dout)), d_dinp(as_type<T>(dinp0));
  REQUIRE(maxout_forward(d_out.get(), d_x.get(), N, C, k, nullptr).is_ok());
  REQUIRE(maxout_backward(d_dinp.get(), d_dout.get(), d_x.get(), N, C, k, nullptr).is_ok());
  CHECK(same_bits(d_out.to_host(), as_type<T>(want_out)));
  CHECK(same_bits(d_dinp.to_host(), as_type<T>(want_dinp)));
}

TEST_CASE("CUDA maxout matches the CPU op bit for bit, ties and NaNs included") {
  if (testing::skip_without_device()) return;
  for (int k : {2, 4}) {
    check_against_cpu<float>(64, 128, k);
    check_against_cpu<float>(9, 12, k);
    check_against_cpu<bf16>(64, 128, k);
    check_against_cpu<bf16>(1000, 768, k);
  }
}

TEST_CASE("CUDA maxout refuses bad shapes and null pointers with a status") {
  if (testing::skip_without_device()) return;
  DeviceArray<float> a(16), b(16);
  CHECK(maxout_forward(a.get(), b.get(), 2, 6, 4, nullptr).code() == StatusCode::invalid_argument);  // 6 % 4
  CHECK(maxout_forward(a.get(), b.get(), -1, 8, 2, nullptr).code() == StatusCode::invalid_argument);
  CHECK(maxout_backward(a.get(), nullptr, b.get(), 2, 8, 2, nullptr).code() == StatusCode::invalid_argument);
  CHECK(maxout_forward(static_cast<float*>(nullptr), nullptr, 0, 8, 2, nullptr).is_ok());  // N == 0: nothing
}

}  // namespace
}  // namespace swarm::cuda
