// Every CPU op's backward against central finite differences of its forward.
// Tolerances are relative to the largest gradient entry; fp32 forward passes
// with h = 1e-2 leave about 1e-3 of noise, so 1e-2 is the bound for all ops.
#include <algorithm>
#include <cmath>
#include <vector>

#include <doctest/doctest.h>

#include "kernels/cpu/ops.h"
#include "tests/kernels/cpu/gradient_check.h"

namespace swarm::cpu {
namespace {

using testing::check_gradient;
using testing::random_vector;
using testing::weighted_sum;

constexpr float kStep = 1e-2f;
constexpr double kTolerance = 1e-2;

TEST_CASE("matmul backward matches finite differences") {
  const int N = 6, C = 5, OC = 4;
  auto x = random_vector(N * C, 1), w = random_vector(OC * C, 2), b = random_vector(OC, 3);
  auto r = random_vector(N * OC, 4);
  std::vector<float> out(N * OC);
  auto objective = [&] {
    matmul_forward(out.data(), x.data(), w.data(), b.data(), N, C, OC);
    return weighted_sum(out, r);
  };
  std::vector<float> dx(N * C, 0.0f), dw(OC * C, 0.0f), db(OC, 0.0f);
  matmul_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), N, C, OC);
  check_gradient("matmul dinp", x, dx, objective, kStep, kTolerance);
  check_gradient("matmul dweight", w, dw, objective, kStep, kTolerance);
  check_gradient("matmul dbias", b, db, objective, kStep, kTolerance);

  // The forward is inp @ weight^T + bias, element by element.
  matmul_forward(out.data(), x.data(), w.data(), b.data(), N, C, OC);
  double expected = b[2];
  for (int c = 0; c < C; ++c) expected += static_cast<double>(x[3 * C + c]) * w[2 * C + c];
  CHECK(out[3 * OC + 2] == doctest::Approx(expected).epsilon(1e-5).scale(0));
}

TEST_CASE("matmul backward accumulates into existing gradients") {
  const int N = 3, C = 2, OC = 2;
  auto x = random_vector(N * C, 5), w = random_vector(OC * C, 6), r = random_vector(N * OC, 7);
  std::vector<float> once(OC * C, 0.0f), twice(OC * C, 0.0f), dbias(OC, 0.0f);
  matmul_backward(nullptr, once.data(), nullptr, r.data(), x.data(), w.data(), N, C, OC);
  matmul_backward(nullptr, twice.data(), dbias.data(), r.data(), x.data(), w.data(), N, C, OC);
  matmul_backward(nullptr, twice.data(), dbias.data(), r.data(), x.data(), w.data(), N, C, OC);
  for (int i = 0; i < OC * C; ++i) CHECK(twice[i] == doctest::Approx(2 * once[i]));
}

TEST_CASE("layernorm backward matches finite differences, and the forward normalizes") {
  const int N = 4, C = 16;
  auto x = random_vector(N * C, 10, 2.0f), w = random_vector(C, 11), b = random_vector(C, 12);
  auto r = random_vector(N * C, 13);
  std::vector<float> out(N * C), mean(N), rstd(N);
  auto objective = [&] {
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    return weighted_sum(out, r);
  };
  objective();
  std::vector<float> dx(N * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
  layernorm_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), N, C);
  check_gradient("layernorm dinp", x, dx, objective, kStep, kTolerance);
  check_gradient("layernorm dweight", w, dw, objective, kStep, kTolerance);
  check_gradient("layernorm dbias", b, db, objective, kStep, kTolerance);

  std::vector<float> ones(C, 1.0f), zeros(C, 0.0f);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), ones.data(), zeros.data(), N, C);
  double sum = 0, sum_sq = 0;
  for (int c = 0; c < C; ++c) {
    sum += out[C + c];
    sum_sq += out[C + c] * out[C + c];
  }
  CHECK(sum / C == doctest::Approx(0.0).epsilon(1e-5));
  CHECK(sum_sq / C == doctest::Approx(1.0).epsilon(1e-3).scale(0));
}

TEST_CASE("gelu backward matches finite differences") {
  const int n = 64;
  auto x = random_vector(n, 20, 2.0f), r = random_vector(n, 21);
  std::vector<float> out(n);
  auto objective = [&] {
    gelu_forward(out.data(), x.data(), n);
    return weighted_sum(out, r);
  };
  std::vector<float> dx(n, 0.0f);
  gelu_backward(dx.data(), x.data(), r.data(), n);
  check_gradient("gelu dinp", x, dx, objective, 1e-3f, kTolerance);
  gelu_forward(out.data(), x.data(), n);
  // GELU(x) ~ x for large x, ~0 for very negative x.
  std::vector<float> extremes{8.0f, -8.0f}, extremes_out(2);
  gelu_forward(extremes_out.data(), extremes.data(), 2);
  CHECK(extremes_out[0] == doctest::Approx(8.0f));
  CHECK(std::fabs(extremes_out[1]) < 1e-6f);
}

TEST_CASE("causal attention backward matches finite differences") {
  const int B = 2, T = 5, C = 8, NH = 2;
  auto qkv = random_vector(B * T * 3 * C, 30), r = random_vector(B * T * C, 31);
  std::vector<float> out(B * T * C), att(B * NH * T * T);
  auto objective = [&] {
    attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    return weighted_sum(out, r);
  };
  objective();
  std::vector<float> dqkv(qkv.size(), 0.0f);
  attention_backward(dqkv.data(), r.data(), qkv.data(), att.data(), B, T, C, NH);
  check_gradient("attention dqkv", qkv, dqkv, objective, kStep, kTolerance);
}

TEST_CASE("attention is causal: the output at t ignores tokens after t") {
  const int B = 1, T = 6, C = 4, NH = 1;
  auto qkv = random_vector(B * T * 3 * C, 32);
  std::vector<float> out(T * C), att(T * T), changed_out(T * C);
  attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  for (int c = 0; c < 3 * C; ++c) qkv[5 * 3 * C + c] += 1.0f;  // change the last token only
  attention_forward(changed_out.data(), att.data(), qkv.data(), B, T, C, NH);
  for (int i = 0; i < 5 * C; ++i) CHECK(out[i] == changed_out[i]);
  bool last_changed = false;
  for (int c = 0; c < C; ++c) last_changed |= out[5 * C + c] != changed_out[5 * C + c];
  CHECK(last_changed);
  // Row 0 attends only to itself, so its output is v_0.
  for (int c = 0; c < C; ++c) CHECK(changed_out[c] == doctest::Approx(qkv[2 * C + c]));
}

TEST_CASE("softmax cross-entropy: loss, and dlogits against finite differences") {
  const int N = 3, V = 7;
  auto logits = random_vector(N * V, 40, 3.0f);
  std::vector<int32_t> targets{0, 6, 3};
  std::vector<float> losses(N), dlogits(N * V);
  auto objective = [&] {
    cross_entropy_forward_backward(losses.data(), nullptr, logits.data(), targets.data(), N, V, 1.0f);
    double total = 0;
    for (float l : losses) total += l;
    return total / N;
  };
  cross_entropy_forward_backward(losses.data(), dlogits.data(), logits.data(), targets.data(), N,
                                 V, 1.0f / N);
  double expected = 0;
  for (int v = 0; v < V; ++v) expected += std::exp(static_cast<double>(logits[V + v]));
  expected = std::log(expected) - logits[V + 6];
  CHECK(losses[1] == doctest::Approx(expected).epsilon(1e-5).scale(0));
  check_gradient("cross-entropy dlogits", logits, dlogits, objective, 1e-2f, kTolerance);
}

TEST_CASE("embedding backward matches finite differences, with repeated tokens") {
  const int B = 2, T = 3, C = 4, V = 5;
  std::vector<int32_t> tokens{1, 3, 1, 4, 1, 0};
  auto wte = random_vector(V * C, 50), wpe = random_vector(T * C, 51), r = random_vector(B * T * C, 52);
  std::vector<float> out(B * T * C);
  auto objective = [&] {
    embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    return weighted_sum(out, r);
  };
  std::vector<float> dwte(V * C, 0.0f), dwpe(T * C, 0.0f);
  embedding_backward(dwte.data(), dwpe.data(), r.data(), tokens.data(), B, T, C);
  check_gradient("embedding dwte", wte, dwte, objective, kStep, kTolerance);
  check_gradient("embedding dwpe", wpe, dwpe, objective, kStep, kTolerance);
  for (int c = 0; c < C; ++c) CHECK(dwte[2 * C + c] == 0.0f);  // token 2 never appears
}

TEST_CASE("residual and accumulate add element-wise") {
  std::vector<float> a{1, 2, 3}, b{10, 20, 30}, out(3);
  residual_forward(out.data(), a.data(), b.data(), 3);
  CHECK(out == std::vector<float>{11, 22, 33});
  accumulate(out.data(), a.data(), 3);
  CHECK(out == std::vector<float>{12, 24, 36});
}

TEST_CASE("maxout backward matches finite differences on inputs without near-ties") {
  for (int k : {2, 4}) {
    CAPTURE(k);
    const int N = 5, C = 12, W = C / k;
    // Distinct multiples of 0.1 in random order: every candidate is at least
    // 10 steps from every other, so no step of the difference moves an argmax.
    std::vector<float> x(N * C);
    for (int i = 0; i < N * C; ++i) x[i] = 0.1f * static_cast<float>((i * 37) % (N * C)) - 3.0f;
    auto r = random_vector(N * W, 70);
    std::vector<float> out(N * W);
    auto objective = [&] {
      maxout_forward(out.data(), x.data(), N, C, k);
      return weighted_sum(out, r);
    };
    std::vector<float> dx(N * C, 0.0f);
    maxout_backward(dx.data(), r.data(), x.data(), N, C, k);
    check_gradient("maxout dinp", x, dx, objective, kStep, kTolerance);
    // The forward is the max over the k contiguous slices.
    maxout_forward(out.data(), x.data(), N, C, k);
    for (int n = 0; n < N; ++n) {
      for (int j = 0; j < W; ++j) {
        float best = x[n * C + j];
        for (int g = 1; g < k; ++g) best = std::max(best, x[n * C + g * W + j]);
        CHECK(out[n * W + j] == best);
      }
    }
  }
}

TEST_CASE("maxout routes the gradient to the first maximum, a NaN counting as the maximum, and adds") {
  // k = 2 over C = 4: out[0] = max(x0, x2), out[1] = max(x1, x3).
  std::vector<float> x{1, 3, 3, 2}, out(2), dout{10, 20}, dx{1, 1, 1, 1};
  maxout_forward(out.data(), x.data(), 1, 4, 2);
  CHECK(out == std::vector<float>{3, 3});
  maxout_backward(dx.data(), dout.data(), x.data(), 1, 4, 2);
  CHECK(dx == std::vector<float>{1, 21, 11, 1});
  // Ties go to the lowest slice.
  std::vector<float> tied{2, 7, 7, 7}, one(1), d(4, 0.0f), g{5};
  maxout_forward(one.data(), tied.data(), 1, 4, 4);
  CHECK(one[0] == 7.0f);
  maxout_backward(d.data(), g.data(), tied.data(), 1, 4, 4);
  CHECK(d == std::vector<float>{0, 5, 0, 0});
  // A NaN wins, so it reaches the wire's checks instead of vanishing.
  std::vector<float> with_nan{1, NAN, 9, NAN}, d_nan(4, 0.0f);
  maxout_forward(one.data(), with_nan.data(), 1, 4, 4);
  CHECK(std::isnan(one[0]));
  maxout_backward(d_nan.data(), g.data(), with_nan.data(), 1, 4, 4);
  CHECK(d_nan == std::vector<float>{0, 5, 0, 0});
}

TEST_CASE("backward kernels give bit-identical results at 1 and 2 threads") {
  const int B = 2, T = 32, C = 64, NH = 4, N = B * T;
  auto qkv = random_vector(N * 3 * C, 60), dout = random_vector(N * C, 61);
  auto x = random_vector(N * C, 62), w = random_vector(C, 63), bias = random_vector(C, 64);
  auto run = [&](int threads) {
    set_num_threads(threads);
    std::vector<float> out(N * C), att(B * NH * T * T), dqkv(N * 3 * C, 0.0f);
    attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
    std::vector<float> ln(N * C), mean(N), rstd(N), dx(N * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
    layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), w.data(), bias.data(), N, C);
    layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(),
                       mean.data(), rstd.data(), N, C);
    std::vector<float> all = dqkv;
    all.insert(all.end(), dx.begin(), dx.end());
    all.insert(all.end(), dw.begin(), dw.end());
    all.insert(all.end(), db.begin(), db.end());
    return all;
  };
  auto one = run(1);
  auto two = run(2);
  set_num_threads(0);
  CHECK(one == two);
}

TEST_CASE("GEMMs give bit-identical results at 1 and 2 threads, large enough for BLAS to split them") {
  // 512 x 256 x 384 is ~100 MFLOP per GEMM: OpenBLAS runs it on every thread.
  const int N = 512, C = 256, OC = 384;
  auto x = random_vector(N * C, 70), w = random_vector(OC * C, 71), b = random_vector(OC, 72);
  auto dout = random_vector(N * OC, 73);
  auto run = [&](int threads) {
    set_num_threads(threads);
    std::vector<float> out(N * OC), dx(N * C, 0.5f), dw(OC * C, 0.25f), db(OC, 0.125f);
    matmul_forward(out.data(), x.data(), w.data(), b.data(), N, C, OC);
    matmul_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), N, C, OC);
    std::vector<float> all = out;
    for (const auto* part : {&dx, &dw, &db}) all.insert(all.end(), part->begin(), part->end());
    return all;
  };
  auto one = run(1);
  auto two = run(2);
  set_num_threads(0);
  CHECK(one == two);
}

}  // namespace
}  // namespace swarm::cpu
