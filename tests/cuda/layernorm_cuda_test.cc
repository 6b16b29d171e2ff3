// CUDA layernorm against the CPU backend on random inputs, forward and backward,
// float and bf16, the fused residual + layernorm, and bitwise determinism of the
// backward. Tolerances (relative, floor 1e-3 unless stated):
// - float: forward 1e-5 (float reductions in another order), backward 1e-4
//   (two levels of reductions; the column sums add N rows in another order).
//   Floor 1 for y, mean, dx, dweight and dbias: their differences are absolute, of
//   the order of an ulp of the O(1) terms they are built from (the device also
//   contracts (x - m) * s * w + b into an FMA), and outputs that cancel to near zero
//   (y = norm * w + b, dx = 0.5 + grad, dw = 0.25 + sum) would otherwise blow that
//   up by 1e3: a CPU emulation of the kernels gives ~2e-4 with floor 1e-3, ~1e-5
//   at most with floor 1;
// - bf16: the CPU gets the same bf16-rounded inputs; outputs are rounded to bf16
//   (2^-8 relative), so forward and dinp 1.6e-2; dweight and dbias are float
//   sums of bf16 products, 1e-3.
#include <cuda_runtime_api.h>

#include <vector>

#include <doctest/doctest.h>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/layernorm.h"
#include "tests/cuda/cuda_test_util.h"

namespace swarm::cuda {
namespace {

using testing::DeviceArray;
using testing::from_bf16;
using testing::max_relative_error;
using testing::random_vector;
using testing::round_through_bf16;
using testing::to_bf16;

struct Case {
  int N, C;
};
constexpr Case kCases[] = {{64, 768}, {37, 100}, {5, 1}, {600, 96}};  // 600 rows: three column-sum chunks

struct Reference {
  std::vector<float> x, w, b, dy, y, mean, rstd, dx, dw, db;
};

// Inputs (optionally bf16-rounded) and the CPU results. dx/dw/db start at
// nonzero values because backward adds into them.
Reference reference(int N, int C, bool bf16_inputs) {
  Reference r;
  auto maybe_round = [&](std::vector<float> v) { return bf16_inputs ? round_through_bf16(v) : v; };
  r.x = maybe_round(random_vector(size_t(N) * C, 1, 3.0f));
  r.w = maybe_round(random_vector(C, 2));
  r.b = maybe_round(random_vector(C, 3));
  r.dy = maybe_round(random_vector(size_t(N) * C, 4));
  r.y.resize(size_t(N) * C);
  r.mean.resize(N);
  r.rstd.resize(N);
  cpu::layernorm_forward(r.y.data(), r.mean.data(), r.rstd.data(), r.x.data(), r.w.data(), r.b.data(), N, C);
  r.dx.assign(size_t(N) * C, 0.5f);
  r.dw.assign(C, 0.25f);
  r.db.assign(C, -0.25f);
  cpu::layernorm_backward(r.dx.data(), r.dw.data(), r.db.data(), r.dy.data(), r.x.data(), r.w.data(), r.mean.data(),
                          r.rstd.data(), N, C);
  return r;
}

TEST_CASE("CUDA layernorm (float) matches the CPU backend, forward and backward, and is deterministic") {
  if (testing::skip_without_device()) return;
  for (auto [N, C] : kCases) {
    INFO("N=" << N << " C=" << C);
    const Reference r = reference(N, C, false);
    DeviceArray<float> x(r.x), w(r.w), b(r.b), dy(r.dy), y(r.y.size()), mean{size_t(N)}, rstd{size_t(N)};
    REQUIRE(layernorm_forward(y.get(), mean.get(), rstd.get(), x.get(), w.get(), b.get(), N, C, nullptr).is_ok());
    CHECK(max_relative_error(y.to_host(), r.y, 1.0) < 1e-5);
    CHECK(max_relative_error(mean.to_host(), r.mean, 1.0) < 1e-5);
    CHECK(max_relative_error(rstd.to_host(), r.rstd) < 1e-5);

    std::vector<std::vector<float>> first;
    for (int run = 0; run < 2; ++run) {
      DeviceArray<float> dx(size_t(N) * C, 0.5f), dw(size_t(C), 0.25f), db(size_t(C), -0.25f);
      REQUIRE(layernorm_backward(dx.get(), dw.get(), db.get(), dy.get(), x.get(), w.get(), mean.get(), rstd.get(), N,
                                 C, nullptr)
                  .is_ok());
      std::vector<std::vector<float>> got{dx.to_host(), dw.to_host(), db.to_host()};
      CHECK(max_relative_error(got[0], r.dx, 1.0) < 1e-4);
      CHECK(max_relative_error(got[1], r.dw, 1.0) < 1e-4);
      CHECK(max_relative_error(got[2], r.db, 1.0) < 1e-4);
      if (run == 0) first = got;
      else CHECK(got == first);  // bit-identical second run
    }
  }
}

TEST_CASE("CUDA layernorm (bf16) matches the CPU backend on the same rounded inputs") {
  if (testing::skip_without_device()) return;
  for (auto [N, C] : kCases) {
    INFO("N=" << N << " C=" << C);
    const Reference r = reference(N, C, true);
    DeviceArray<bf16> x(to_bf16(r.x)), w(to_bf16(r.w)), b(to_bf16(r.b)), dy(to_bf16(r.dy)), y(r.y.size());
    DeviceArray<float> mean{size_t(N)}, rstd{size_t(N)};
    REQUIRE(layernorm_forward(y.get(), mean.get(), rstd.get(), x.get(), w.get(), b.get(), N, C, nullptr).is_ok());
    CHECK(max_relative_error(from_bf16(y.to_host()), r.y, 1e-2) < 1.6e-2);
    CHECK(max_relative_error(mean.to_host(), r.mean) < 1e-4);
    CHECK(max_relative_error(rstd.to_host(), r.rstd) < 1e-4);

    DeviceArray<bf16> dx(to_bf16(std::vector<float>(size_t(N) * C, 0.5f)));
    DeviceArray<float> dw(size_t(C), 0.25f), db(size_t(C), -0.25f);
    REQUIRE(layernorm_backward(dx.get(), dw.get(), db.get(), dy.get(), x.get(), w.get(), mean.get(), rstd.get(), N, C,
                               nullptr)
                .is_ok());
    CHECK(max_relative_error(from_bf16(dx.to_host()), r.dx, 1e-2) < 1.6e-2);
    CHECK(max_relative_error(dw.to_host(), r.dw, 1e-2) < 1e-3);
    CHECK(max_relative_error(db.to_host(), r.db, 1e-2) < 1e-3);
  }
}

TEST_CASE("CUDA fused residual + layernorm equals the sum followed by layernorm") {
  if (testing::skip_without_device()) return;
  const int N = 50, C = 384;
  const auto a = random_vector(size_t(N) * C, 11), b = random_vector(size_t(N) * C, 12);
  const auto w = random_vector(C, 13), bias = random_vector(C, 14);
  std::vector<float> sum(size_t(N) * C), y(sum.size()), mean(N), rstd(N);
  cpu::residual_forward(sum.data(), a.data(), b.data(), int64_t(sum.size()));
  cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), sum.data(), w.data(), bias.data(), N, C);

  DeviceArray<float> da(a), db(b), dw(w), dbias(bias), residual(sum.size()), out(sum.size()), dmean{size_t(N)},
      drstd{size_t(N)};
  REQUIRE(residual_layernorm_forward(residual.get(), out.get(), dmean.get(), drstd.get(), da.get(), db.get(), dw.get(),
                                     dbias.get(), N, C, nullptr)
              .is_ok());
  CHECK(residual.to_host() == sum);  // one float add each: exact
  CHECK(max_relative_error(out.to_host(), y, 1.0) < 1e-5);
  CHECK(max_relative_error(drstd.to_host(), rstd) < 1e-5);

  // bf16: the residual is the rounded sum, and the norm is of that rounded sum.
  const auto ra = round_through_bf16(a), rb = round_through_bf16(b);
  std::vector<float> rsum(sum.size());
  for (size_t i = 0; i < rsum.size(); ++i) rsum[i] = bf16::from_float(ra[i] + rb[i]).to_float();
  const auto rw = round_through_bf16(w), rbias = round_through_bf16(bias);
  cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), rsum.data(), rw.data(), rbias.data(), N, C);
  DeviceArray<bf16> ha(to_bf16(a)), hb(to_bf16(b)), hw(to_bf16(w)), hbias(to_bf16(bias)), hres(sum.size()),
      hout(sum.size());
  REQUIRE(residual_layernorm_forward(hres.get(), hout.get(), dmean.get(), drstd.get(), ha.get(), hb.get(), hw.get(),
                                     hbias.get(), N, C, nullptr)
              .is_ok());
  CHECK(from_bf16(hres.to_host()) == rsum);
  CHECK(max_relative_error(from_bf16(hout.to_host()), y, 1e-2) < 1.6e-2);
}

TEST_CASE("CUDA layernorm refuses bad shapes with a status, before touching the device") {
  // No device needed: the shape check comes first.
  CHECK(layernorm_forward(static_cast<float*>(nullptr), nullptr, nullptr, nullptr, nullptr, nullptr, 4, 0, nullptr)
            .code() == StatusCode::invalid_argument);
  CHECK(layernorm_forward(static_cast<bf16*>(nullptr), nullptr, nullptr, nullptr, nullptr, nullptr, -1, 8, nullptr)
            .code() == StatusCode::invalid_argument);
  CHECK(layernorm_backward(static_cast<float*>(nullptr), nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                           nullptr, 4, 8, nullptr)
            .code() == StatusCode::invalid_argument);
  CHECK(residual_layernorm_forward(static_cast<bf16*>(nullptr), nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                   nullptr, 3, 8, nullptr)
            .code() == StatusCode::invalid_argument);
  CHECK(layernorm_forward(static_cast<float*>(nullptr), nullptr, nullptr, nullptr, nullptr, nullptr, 0, 8, nullptr)
            .is_ok());  // empty
}

}  // namespace
}  // namespace swarm::cuda
