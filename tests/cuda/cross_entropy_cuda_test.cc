// CUDA fused cross-entropy against the CPU backend on random logits, float and bf16,
// V from 1 to GPT-2's 50257 (odd: rows start at every alignment), with dlogits out of
// place, in place (dlogits == logits), absent, and misaligned against logits.
//
// Tolerances, as max_i |got - want| / (floor + |want|):
//   losses 1e-5 (floor 1e-3): the sum of exps in another order, expf vs the CPU's exp;
//   float dlogits 1e-5 against a double-precision reference, with floor 1e-6 *
//     dloss_scale so tiny probabilities count; 1e-4 against the CPU backend, whose
//     one-after-another float sum of 50257 exps is itself off by ~sqrt(V) * 2^-24;
//   bf16 dlogits 1e-2 with the same floor: the output is rounded to bf16 (2^-9).
// Every variant is checked for bitwise determinism against a second run.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <doctest/doctest.h>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/cross_entropy.h"
#include "tests/cuda/cuda_test_util.h"

namespace swarm::cuda {
namespace {

using testing::as_float;
using testing::as_type;
using testing::DeviceArray;
using testing::same_bits;
using testing::max_relative_error;
using testing::random_vector;



// The contract in double precision, rounded to float at the end: a target outside
// [0, V) gives a NaN loss and a zero row.
void double_reference(std::vector<float>& losses, std::vector<float>& dlogits, const std::vector<float>& logits,
                      const std::vector<int32_t>& targets, int N, int V, float scale) {
  losses.assign(N, NAN);
  dlogits.assign(size_t(N) * V, 0.0f);
  for (int i = 0; i < N; ++i) {
    const float* row = logits.data() + size_t(i) * V;
    const int target = targets[i];
    if (target < 0 || target >= V) continue;
    double max = row[0], sum = 0;
    for (int v = 1; v < V; ++v) max = std::max<double>(max, row[v]);
    for (int v = 0; v < V; ++v) sum += std::exp(row[v] - max);
    losses[i] = static_cast<float>(std::log(sum) + max - row[target]);
    for (int v = 0; v < V; ++v) {
      dlogits[size_t(i) * V + v] = static_cast<float>((std::exp(row[v] - max) / sum - (v == target)) * scale);
    }
  }
}

std::vector<int32_t> random_targets(int N, int V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> target(0, V - 1);
  std::vector<int32_t> targets(N);
  for (int32_t& t : targets) t = target(rng);
  return targets;
}

// Losses and dlogits of one device run; dlogits_offset places dlogits that many
// elements into its allocation (1 misaligns it against logits).
template <typename T>
struct DeviceRun {
  std::vector<float> losses;
  std::vector<T> dlogits;
};

template <typename T>
DeviceRun<T> run_device(const std::vector<T>& logits, const std::vector<int32_t>& targets, int N, int V, float scale,
                        int dlogits_offset) {
  DeviceArray<T> d_logits(logits);
  DeviceArray<int32_t> d_targets(targets);
  DeviceArray<float> d_losses(static_cast<size_t>(N), 7.0f);
  std::vector<T> garbage = as_type<T>(std::vector<float>(logits.size() + dlogits_offset, 3.0f));
  DeviceArray<T> d_dlogits(garbage);  // overwritten, not added to
  T* dlogits = d_dlogits.get() + dlogits_offset;
  REQUIRE(cross_entropy_forward_backward(d_losses.get(), dlogits, d_logits.get(), d_targets.get(), N, V, scale,
                                         nullptr)
              .is_ok());
  auto all = d_dlogits.to_host();
  return {d_losses.to_host(), std::vector<T>(all.begin() + dlogits_offset, all.end())};
}

template <typename T>
void check_against_cpu(int N, int V) {
  constexpr bool kBf16 = std::is_same_v<T, bf16>;
  INFO("N=" << N << " V=" << V << (kBf16 ? " bf16" : " float"));
  const auto logits = as_type<T>(random_vector(size_t(N) * V, 31, 2.0f));
  const auto targets = random_targets(N, V, 32);
  const float scale = 1.0f / N;
  std::vector<float> losses(N), dlogits(size_t(N) * V);
  cpu::cross_entropy_forward_backward(losses.data(), dlogits.data(), as_float(logits).data(), targets.data(), N, V,
                                      scale);
  std::vector<float> exact_losses, exact_dlogits;
  double_reference(exact_losses, exact_dlogits, as_float(logits), targets, N, V, scale);
  const double floor = 1e-6 * scale;
  const double dlogits_tolerance = kBf16 ? 1e-2 : 1e-4;

  const auto first = run_device(logits, targets, N, V, scale, 0);
  CHECK(max_relative_error(first.losses, losses) < 1e-5);
  CHECK(max_relative_error(as_float(first.dlogits), dlogits, floor) < dlogits_tolerance);
  CHECK(max_relative_error(first.losses, exact_losses) < 1e-5);
  CHECK(max_relative_error(as_float(first.dlogits), exact_dlogits, floor) < (kBf16 ? 1e-2 : 1e-5));

  const auto again = run_device(logits, targets, N, V, scale, 0);
  CHECK(same_bits(first.losses, again.losses));
  CHECK(same_bits(first.dlogits, again.dlogits));

  // dlogits one element off from logits: the scalar dlogits pass, same values.
  const auto shifted = run_device(logits, targets, N, V, scale, 1);
  CHECK(same_bits(first.losses, shifted.losses));
  CHECK(max_relative_error(as_float(shifted.dlogits), dlogits, floor) < dlogits_tolerance);

  {  // In place: dlogits == logits gives the out-of-place bits.
    DeviceArray<T> d_logits(logits);
    DeviceArray<int32_t> d_targets(targets);
    DeviceArray<float> d_losses(static_cast<size_t>(N));
    REQUIRE(cross_entropy_forward_backward(d_losses.get(), d_logits.get(), d_logits.get(), d_targets.get(), N, V,
                                           scale, nullptr)
                .is_ok());
    CHECK(same_bits(d_losses.to_host(), first.losses));
    CHECK(same_bits(d_logits.to_host(), first.dlogits));
  }
  {  // Without dlogits: the same losses.
    DeviceArray<T> d_logits(logits);
    DeviceArray<int32_t> d_targets(targets);
    DeviceArray<float> d_losses(static_cast<size_t>(N));
    REQUIRE(cross_entropy_forward_backward(d_losses.get(), static_cast<T*>(nullptr), d_logits.get(), d_targets.get(),
                                           N, V, scale, nullptr)
                .is_ok());
    CHECK(same_bits(d_losses.to_host(), first.losses));
  }
  {  // logits one element into their allocation: every row starts at another alignment.
    std::vector<T> padded(1, T{});
    padded.insert(padded.end(), logits.begin(), logits.end());
    DeviceArray<T> d_logits(padded);
    DeviceArray<int32_t> d_targets(targets);
    DeviceArray<float> d_losses(static_cast<size_t>(N));
    DeviceArray<T> d_dlogits(logits.size());
    REQUIRE(cross_entropy_forward_backward(d_losses.get(), d_dlogits.get(), d_logits.get() + 1, d_targets.get(), N, V,
                                           scale, nullptr)
                .is_ok());
    CHECK(max_relative_error(d_losses.to_host(), losses) < 1e-5);
    CHECK(max_relative_error(as_float(d_dlogits.to_host()), dlogits, floor) < dlogits_tolerance);
  }
}

TEST_CASE("CUDA cross-entropy matches the CPU backend, float and bf16, and is deterministic") {
  if (testing::skip_without_device()) return;
  for (auto [N, V] : {std::pair{7, 50257}, std::pair{33, 7}, std::pair{4, 1}, std::pair{5, 1000}, std::pair{3, 4099},
                      std::pair{2, 8}}) {
    check_against_cpu<float>(N, V);
    check_against_cpu<bf16>(N, V);
  }
}

TEST_CASE("CUDA cross-entropy: an out-of-range target gives a NaN loss and a zero dlogits row") {
  if (testing::skip_without_device()) return;
  const int N = 4, V = 1001;
  const auto logits = random_vector(size_t(N) * V, 41);
  const std::vector<int32_t> targets = {5, -1, V, 1000};
  std::vector<float> losses, dlogits;  // the CPU backend cannot take bad targets
  double_reference(losses, dlogits, logits, targets, N, V, 0.5f);
  const auto got = run_device(logits, targets, N, V, 0.5f, 0);
  CHECK(std::isnan(got.losses[1]));
  CHECK(std::isnan(got.losses[2]));
  CHECK(max_relative_error({got.losses[0], got.losses[3]}, {losses[0], losses[3]}) < 1e-5);
  CHECK(max_relative_error(got.dlogits, dlogits, 0.5e-6) < 1e-5);
  bool zero_rows = true;
  for (int i : {1, 2}) {
    for (int v = 0; v < V; ++v) zero_rows = zero_rows && got.dlogits[size_t(i) * V + v] == 0.0f;
  }
  CHECK(zero_rows);
}

TEST_CASE("CUDA cross-entropy refuses bad shapes with a status, before touching the device") {
  // No device needed: the shape checks come first.
  float* f = nullptr;
  bf16* h = nullptr;
  const int32_t* targets = nullptr;
  const auto invalid = StatusCode::invalid_argument;
  CHECK(cross_entropy_forward_backward(f, f, f, targets, -1, 10, 1.0f, nullptr).code() == invalid);
  CHECK(cross_entropy_forward_backward(f, h, h, targets, 4, 0, 1.0f, nullptr).code() == invalid);
  CHECK(cross_entropy_forward_backward(f, f, f, targets, 4, 10, 1.0f, nullptr).code() == invalid);  // null pointers
  CHECK(cross_entropy_forward_backward(f, h, h, targets, 4, 10, 1.0f, nullptr).code() == invalid);
  CHECK(cross_entropy_forward_backward(f, f, f, targets, 0, 10, 1.0f, nullptr).is_ok());  // empty
}

}  // namespace
}  // namespace swarm::cuda
