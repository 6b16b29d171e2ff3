// CUDA embeddings against the CPU backend on random tokens with many repeats, float
// and bf16 activations, C on and off the vector width, T not a power of two, V up to
// GPT-2's 50257. Backward sums in the CPU's own order (position order per token, b
// order per position), so the gradients are expected to equal the CPU's; the
// tolerance is still stated: 1e-6 relative. Forward: float exact (one add), bf16
// 1e-2 relative (the bf16 output rounding). Backward is checked for bitwise
// determinism, and out-of-range tokens for the documented zero row / skipped row.
#include <cuda_runtime_api.h>

#include <random>
#include <vector>

#include <doctest/doctest.h>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/embedding.h"
#include "tests/cuda/cuda_test_util.h"

namespace swarm::cuda {
namespace {

using testing::as_float;
using testing::as_type;
using testing::DeviceArray;
using testing::max_relative_error;
using testing::random_vector;

struct Shape {
  int B, T, C, V;
  int distinct;  // tokens are drawn from [0, distinct) (at most V): small means long runs
};

std::vector<int32_t> random_tokens(const Shape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> token(0, std::min(s.distinct, s.V) - 1);
  std::uniform_int_distribution<int32_t> rare(0, s.V - 1);
  std::vector<int32_t> tokens(size_t(s.B) * s.T);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = i % 5 == 4 ? rare(rng) : token(rng);
  return tokens;
}


template <typename T>
void check_against_cpu(const Shape& s) {
  constexpr bool kBf16 = std::is_same_v<T, bf16>;
  INFO("B=" << s.B << " T=" << s.T << " C=" << s.C << " V=" << s.V << (kBf16 ? " bf16" : " float"));
  const size_t rows = size_t(s.B) * s.T;
  const int position_rows = s.T + 3;  // wpe may hold more positions than T
  const auto tokens = random_tokens(s, 1);
  const auto wte = as_float(as_type<T>(random_vector(size_t(s.V) * s.C, 2)));
  const auto wpe = as_float(as_type<T>(random_vector(size_t(position_rows) * s.C, 3)));
  const auto dout = as_float(as_type<T>(random_vector(rows * s.C, 4)));
  const auto dwte_start = random_vector(size_t(s.V) * s.C, 5);
  const auto dwpe_start = random_vector(size_t(position_rows) * s.C, 6);

  std::vector<float> out(rows * s.C), dwte = dwte_start, dwpe = dwpe_start;
  cpu::embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), s.B, s.T, s.C);
  cpu::embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), s.B, s.T, s.C);

  DeviceArray<int32_t> d_tokens(tokens);
  DeviceArray<T> d_wte(as_type<T>(wte)), d_wpe(as_type<T>(wpe)), d_dout(as_type<T>(dout));
  DeviceArray<T> d_out(rows * s.C);
  REQUIRE(embedding_forward(d_out.get(), d_tokens.get(), d_wte.get(), d_wpe.get(), s.B, s.T, s.C, s.V, nullptr)
              .is_ok());
  CHECK(max_relative_error(as_float(d_out.to_host()), out) < (kBf16 ? 1e-2 : 1e-7));

  // Backward twice from the same start: the CPU's values, and the same bits both times.
  std::vector<std::vector<float>> dwte_runs, dwpe_runs;
  for (int run = 0; run < 2; ++run) {
    DeviceArray<float> d_dwte(dwte_start), d_dwpe(dwpe_start);
    REQUIRE(embedding_backward(d_dwte.get(), d_dwpe.get(), d_dout.get(), d_tokens.get(), s.B, s.T, s.C, s.V, nullptr)
                .is_ok());
    dwte_runs.push_back(d_dwte.to_host());
    dwpe_runs.push_back(d_dwpe.to_host());
  }
  CHECK(max_relative_error(dwte_runs[0], dwte) < 1e-6);
  CHECK(max_relative_error(dwpe_runs[0], dwpe) < 1e-6);
  CHECK(dwte_runs[0] == dwte_runs[1]);
  CHECK(dwpe_runs[0] == dwpe_runs[1]);
}

TEST_CASE("CUDA embedding forward and backward match the CPU backend and the backward is deterministic") {
  if (testing::skip_without_device()) return;
  const Shape shapes[] = {
      {4, 37, 768, 1000, 40},     // the vector path, repeats
      {2, 63, 64, 50257, 50257},  // GPT-2's vocabulary
      {3, 500, 600, 7, 7},        // runs far longer than a warp; C spans three column slices, the last partial
      {1, 5, 13, 3, 3},           // C off the vector width: the scalar path
      {2, 1, 8, 1, 1},            // one token, T = 1
  };
  for (const Shape& s : shapes) {
    check_against_cpu<float>(s);
    check_against_cpu<bf16>(s);
  }
}

TEST_CASE("CUDA embedding: an out-of-range token gives a zero row forward and is skipped backward") {
  if (testing::skip_without_device()) return;
  const int B = 2, T = 5, C = 16, V = 11;
  std::vector<int32_t> tokens = {3, -1, 7, 11, 3, 0, 10, 1 << 30, 3, -(1 << 30)};
  const auto wte = random_vector(size_t(V) * C, 1);
  const auto wpe = random_vector(size_t(T) * C, 2);
  auto dout = random_vector(size_t(B) * T * C, 3);
  const auto dwte_start = random_vector(size_t(V) * C, 4);
  const auto dwpe_start = random_vector(size_t(T) * C, 5);

  // The CPU reference cannot take bad tokens: give those rows token 0 and a zero
  // dout, which adds nothing anywhere (the documented skip).
  std::vector<int32_t> clean = tokens;
  std::vector<float> clean_dout = dout;
  std::vector<bool> bad(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    bad[i] = tokens[i] < 0 || tokens[i] >= V;
    if (!bad[i]) continue;
    clean[i] = 0;
    for (int c = 0; c < C; ++c) clean_dout[i * C + c] = 0.0f;
  }
  std::vector<float> out(size_t(B) * T * C), dwte = dwte_start, dwpe = dwpe_start;
  cpu::embedding_forward(out.data(), clean.data(), wte.data(), wpe.data(), B, T, C);
  cpu::embedding_backward(dwte.data(), dwpe.data(), clean_dout.data(), clean.data(), B, T, C);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (!bad[i]) continue;
    for (int c = 0; c < C; ++c) out[i * C + c] = 0.0f;
  }

  DeviceArray<int32_t> d_tokens(tokens);
  DeviceArray<float> d_wte(wte), d_wpe(wpe), d_dout(dout), d_out(out.size(), 7.0f);
  DeviceArray<float> d_dwte(dwte_start), d_dwpe(dwpe_start);
  REQUIRE(embedding_forward(d_out.get(), d_tokens.get(), d_wte.get(), d_wpe.get(), B, T, C, V, nullptr).is_ok());
  REQUIRE(embedding_backward(d_dwte.get(), d_dwpe.get(), d_dout.get(), d_tokens.get(), B, T, C, V, nullptr).is_ok());
  CHECK(d_out.to_host() == out);
  CHECK(max_relative_error(d_dwte.to_host(), dwte) < 1e-6);
  CHECK(max_relative_error(d_dwpe.to_host(), dwpe) < 1e-6);
}

TEST_CASE("CUDA embedding refuses bad shapes with a status, before touching the device") {
  // No device needed: the shape checks come first.
  float* f = nullptr;
  bf16* h = nullptr;
  const int32_t* tokens = nullptr;
  const auto invalid = StatusCode::invalid_argument;
  CHECK(embedding_forward(f, tokens, f, f, -1, 4, 8, 10, nullptr).code() == invalid);
  CHECK(embedding_forward(h, tokens, h, h, 2, -4, 8, 10, nullptr).code() == invalid);
  CHECK(embedding_forward(f, tokens, f, f, 2, 4, 0, 10, nullptr).code() == invalid);
  CHECK(embedding_forward(f, tokens, f, f, 2, 4, 8, 0, nullptr).code() == invalid);
  CHECK(embedding_forward(f, tokens, f, f, 2, 4, 8, 10, nullptr).code() == invalid);  // null pointers
  CHECK(embedding_forward(f, tokens, f, f, 1 << 16, 1 << 16, 8, 10, nullptr).code() == invalid);  // B*T overflows
  CHECK(embedding_backward(f, f, f, tokens, 2, 4, 8, 10, nullptr).code() == invalid);
  CHECK(embedding_backward(f, f, h, tokens, 2, 4, -8, 10, nullptr).code() == invalid);
  CHECK(embedding_backward(f, f, h, tokens, 2, 4, 8, -10, nullptr).code() == invalid);
  // Empty is fine.
  CHECK(embedding_forward(f, tokens, f, f, 0, 4, 8, 10, nullptr).is_ok());
  CHECK(embedding_backward(f, f, h, tokens, 3, 0, 8, 10, nullptr).is_ok());
}

}  // namespace
}  // namespace swarm::cuda
