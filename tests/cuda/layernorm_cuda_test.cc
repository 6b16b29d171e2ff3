// CUDA layernorm against the CPU backend on random inputs, forward and backward,
// and bitwise determinism of the backward. Tolerances: forward 1e-5 relative
// (float reductions in another order), backward 1e-4 (two levels of reductions).
#include <cuda_runtime_api.h>

#include <cmath>
#include <random>
#include <vector>

#include <fmt/core.h>

#include <doctest/doctest.h>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/layernorm.h"

namespace swarm::cuda {
namespace {

// A device copy of a host vector, freed on scope exit.
struct DeviceBuffer {
  float* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(const std::vector<float>& host) : n(host.size()) {
    SWARM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr), n * sizeof(float)));
    SWARM_CUDA_CHECK(cudaMemcpy(ptr, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  std::vector<float> to_host() const {
    std::vector<float> out(n);
    SWARM_CUDA_CHECK(cudaMemcpy(out.data(), ptr, n * sizeof(float), cudaMemcpyDeviceToHost));
    return out;
  }
};

std::vector<float> random_vector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

double max_relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::abs(double(got[i]) - want[i]) / (1e-3 + std::abs(double(want[i]))));
  }
  return worst;
}

TEST_CASE("CUDA layernorm matches the CPU backend, forward and backward, and is deterministic") {
  DeviceCount devices = count_devices();
  if (devices.count == 0) {
    fmt::print("skipped: no CUDA device ({})\n", devices.reason);
    CHECK_FALSE(devices.reason.empty());
    return;
  }
  for (auto [N, C] : {std::pair{64, 768}, std::pair{37, 100}, std::pair{5, 1}}) {
    INFO("N=" << N << " C=" << C);
    const auto x = random_vector(size_t(N) * C, 1, 3.0f);
    const auto w = random_vector(C, 2);
    const auto b = random_vector(C, 3);
    const auto dy = random_vector(size_t(N) * C, 4);
    std::vector<float> y(size_t(N) * C), mean(N), rstd(N);
    cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    std::vector<float> dx(size_t(N) * C, 0.5f), dw(C, 0.25f), db(C, -0.25f);  // backward adds into these
    DeviceBuffer d_dx(dx), d_dw(dw), d_db(db);
    cpu::layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(),
                            rstd.data(), N, C);

    DeviceBuffer d_x(x), d_w(w), d_b(b), d_dy(dy), d_y(y), d_mean(mean), d_rstd(rstd);
    REQUIRE(layernorm_forward(d_y.ptr, d_mean.ptr, d_rstd.ptr, d_x.ptr, d_w.ptr, d_b.ptr, N, C, nullptr).is_ok());
    REQUIRE(layernorm_backward(d_dx.ptr, d_dw.ptr, d_db.ptr, d_dy.ptr, d_x.ptr, d_w.ptr, d_mean.ptr, d_rstd.ptr, N,
                               C, nullptr)
                .is_ok());
    SWARM_CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(max_relative_error(d_y.to_host(), y) < 1e-5);
    CHECK(max_relative_error(d_mean.to_host(), mean) < 1e-5);
    CHECK(max_relative_error(d_rstd.to_host(), rstd) < 1e-5);
    CHECK(max_relative_error(d_dx.to_host(), dx) < 1e-4);
    CHECK(max_relative_error(d_dw.to_host(), dw) < 1e-4);
    CHECK(max_relative_error(d_db.to_host(), db) < 1e-4);

    // The same backward again, from the same start: bit-identical.
    DeviceBuffer again_dx(std::vector<float>(size_t(N) * C, 0.5f)), again_dw(std::vector<float>(C, 0.25f)),
        again_db(std::vector<float>(C, -0.25f));
    DeviceBuffer once_dx(std::vector<float>(size_t(N) * C, 0.5f)), once_dw(std::vector<float>(C, 0.25f)),
        once_db(std::vector<float>(C, -0.25f));
    for (auto* target : {&once_dx, &again_dx}) {
      auto* tw = target == &once_dx ? &once_dw : &again_dw;
      auto* tb = target == &once_dx ? &once_db : &again_db;
      REQUIRE(layernorm_backward(target->ptr, tw->ptr, tb->ptr, d_dy.ptr, d_x.ptr, d_w.ptr, d_mean.ptr, d_rstd.ptr,
                                 N, C, nullptr)
                  .is_ok());
    }
    SWARM_CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(once_dx.to_host() == again_dx.to_host());
    CHECK(once_dw.to_host() == again_dw.to_host());
  }
}

TEST_CASE("CUDA layernorm refuses bad shapes with a status, before touching the device") {
  // No device needed: the shape check comes first.
  CHECK(layernorm_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 4, 0, nullptr).code() ==
        StatusCode::invalid_argument);
  CHECK(layernorm_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, -1, 8, nullptr).code() ==
        StatusCode::invalid_argument);
  CHECK(layernorm_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 4, 8, nullptr)
            .code() == StatusCode::invalid_argument);
  CHECK(layernorm_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 8, nullptr).is_ok());  // empty
}

}  // namespace
}  // namespace swarm::cuda
