// cuda_test_util: what every CUDA-versus-CPU test needs: a skip line when there is
// no device, device arrays that free themselves, random inputs, bf16 round trips
// and a relative error measure with a stated floor.
//
//   if (swarm::cuda::testing::skip_without_device()) return;
//   auto x = random_vector(n, /*seed=*/1);
//   DeviceArray<bf16> d_x(to_bf16(x));
//   ... launch ...
//   CHECK(max_relative_error(from_bf16(d_x.to_host()), want) < 2e-2);
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <random>
#include <vector>

#include <fmt/core.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_info.h"
#include "swarm/core/dtype.h"

namespace swarm::cuda::testing {

// Prints "skipped: no CUDA device (why)" and returns true when there is none.
inline bool skip_without_device() {
  DeviceCount devices = count_devices();
  if (devices.count > 0) return false;
  fmt::print("skipped: no CUDA device ({})\n", devices.reason);
  return true;
}

// A device copy of a host vector, freed on scope exit.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& host) : n_(host.size()) {
    SWARM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr_), std::max<size_t>(n_, 1) * sizeof(T)));
    if (n_ > 0) SWARM_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  explicit DeviceArray(size_t n, T value = T{}) : DeviceArray(std::vector<T>(n, value)) {}
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { cudaFree(ptr_); }

  T* get() const { return ptr_; }
  size_t size() const { return n_; }
  std::vector<T> to_host() const {
    SWARM_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<T> out(n_);
    if (n_ > 0) SWARM_CUDA_CHECK(cudaMemcpy(out.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

inline std::vector<float> random_vector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

inline std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16::from_float(v[i]);
  return out;
}

inline std::vector<float> from_bf16(const std::vector<bf16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = v[i].to_float();
  return out;
}

// The values a bf16 kernel actually sees: each input rounded through bf16.
inline std::vector<float> round_through_bf16(const std::vector<float>& v) { return from_bf16(to_bf16(v)); }

// Float data as the element type T (float or bf16) a kernel takes, and back;
// tests templated on T use these in place of to_bf16/from_bf16.
template <typename T>
std::vector<T> as_type(const std::vector<float>& v) {
  if constexpr (std::is_same_v<T, bf16>) {
    return to_bf16(v);
  } else {
    return v;
  }
}

template <typename T>
std::vector<float> as_float(const std::vector<T>& v) {
  if constexpr (std::is_same_v<T, bf16>) {
    return from_bf16(v);
  } else {
    return v;
  }
}

// Bitwise equality, for determinism checks (== on floats would equate 0 and -0).
template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// max_i |got - want| / (floor + |want|): relative where values are large,
// absolute (scaled by 1/floor) near zero.
inline double max_relative_error(const std::vector<float>& got, const std::vector<float>& want,
                                 double floor = 1e-3) {
  if (got.size() != want.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(double(got[i]) - want[i]) / (floor + std::abs(double(want[i])));
    if (!(err <= worst)) worst = err;  // NaN propagates as the worst
  }
  return worst;
}

}  // namespace swarm::cuda::testing
