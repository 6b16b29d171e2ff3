// CUDA global gradient norm against swarm::optim::global_grad_norm: bitwise (the device sums the
// same exact double squares in the CPU's order; the brief's 1e-6 relative is checked as well),
// bitwise deterministic across runs, and refusing non-finite norms. The host-device chunk math is
// checked here without a device, against the CPU optimizer itself.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <fmt/core.h>

#include <doctest/doctest.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/grad_norm.h"
#include "swarm/core/tensor.h"
#include "swarm/core/optim_math.h"
#include "swarm/optim/optimizer.h"
#include "tests/cuda/cuda_test_util.h"

namespace swarm::cuda {
namespace {

using testing::DeviceArray;

uint32_t bits_of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}
uint64_t bits_of(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

// Sizes around the chunk edges, packed flat so several params start misaligned.
const std::vector<int64_t> kSizes = {0, 1, 1000, 4099, kNormChunk, kNormChunk + 1, 2 * kNormChunk + 3, 300000};

std::vector<int64_t> offsets() {
  std::vector<int64_t> at(kSizes.size() + 1, 0);
  for (size_t k = 0; k < kSizes.size(); ++k) at[k + 1] = at[k] + kSizes[k];
  return at;
}
const int64_t kTotal = offsets().back();

std::vector<optim::ParamRef> cpu_params(std::vector<float>& grads) {
  const auto at = offsets();
  std::vector<optim::ParamRef> params;
  for (size_t k = 0; k < kSizes.size(); ++k) {
    TensorView view(grads.data() + at[k], DType::f32, Shape{kSizes[k]});
    params.push_back({fmt::format("p{}", k), view, view, true});
  }
  return params;
}

TEST_CASE("chunk_range and chunk_starts cut params into the CPU optimizer's chunks") {
  CHECK(norm_chunk_count(0) == 0);
  CHECK(norm_chunk_count(1) == 1);
  CHECK(norm_chunk_count(kNormChunk) == 1);
  CHECK(norm_chunk_count(kNormChunk + 1) == 2);
  CHECK(chunk_range(5, 0).begin == 0);
  CHECK(chunk_range(5, 0).end == 5);
  CHECK(chunk_range(2 * kNormChunk + 3, 1).begin == kNormChunk);
  CHECK(chunk_range(2 * kNormChunk + 3, 1).end == 2 * kNormChunk);
  CHECK(chunk_range(2 * kNormChunk + 3, 2).begin == 2 * kNormChunk);
  CHECK(chunk_range(2 * kNormChunk + 3, 2).end == 2 * kNormChunk + 3);
  std::vector<DeviceParam> params(4);
  params[0].numel = 3;
  params[1].numel = 0;
  params[2].numel = 2 * kNormChunk + 1;
  params[3].numel = kNormChunk;
  CHECK(chunk_starts(params) == std::vector<int64_t>{0, 1, 1, 4, 5});
}

TEST_CASE("sum_of_squares_vectorized adds exactly what the in-order sum adds, aligned or not") {
  const std::vector<float> x = testing::random_vector(1000, 3, 10.0f);
  for (int64_t begin : {0, 1, 2, 3, 4, 5}) {
    for (int64_t end : {begin, begin + 1, begin + 3, begin + 4, begin + 7, int64_t{1000}}) {
      INFO("begin " << begin << " end " << end);
      CHECK(bits_of(sum_of_squares_vectorized(x.data(), begin, end)) ==
            bits_of(sum_of_squares_in_order(x.data(), begin, end)));
    }
  }
}

TEST_CASE("the device's association of chunk sums reproduces optim::global_grad_norm bit for bit (host)") {
  for (float scale : {1.0f, 1e-20f, 1e15f}) {
    INFO("scale " << scale);
    std::vector<float> grads = testing::random_vector(size_t(kTotal), 5, scale);
    const auto at = offsets();
    // What the kernels do: chunks in order within a param, then params in order.
    double total = 0.0;
    for (size_t k = 0; k < kSizes.size(); ++k) {
      double param_sum = 0.0;
      for (int64_t c = 0; c < norm_chunk_count(kSizes[k]); ++c) {
        const ChunkRange r = chunk_range(kSizes[k], c);
        param_sum += sum_of_squares_vectorized(grads.data() + at[k], r.begin, r.end);
      }
      total += param_sum;
    }
    const float norm = static_cast<float>(std::sqrt(total));
    CHECK(bits_of(norm) == bits_of(optim::global_grad_norm(cpu_params(grads))));
  }
}

TEST_CASE("DeviceParamList and global_grad_norm refuse bad arguments with a status, before touching the device") {
  // Fake addresses: nothing is dereferenced, the checks come first.
  auto* base = reinterpret_cast<float*>(uintptr_t{1} << 20);
  const auto param = [&](int64_t at, int64_t n) {
    return DeviceParam{base + at, base + at + n, base + at + 2 * n, base + at + 3 * n, nullptr, n, true};
  };
  std::vector<DeviceParam> params = {param(0, 10)};
  params[0].numel = -1;
  CHECK(DeviceParamList::create(params).status().code() == StatusCode::invalid_argument);
  for (int field = 0; field < 4; ++field) {
    params = {param(0, 10)};
    if (field == 0) params[0].weight = nullptr;
    if (field == 1) params[0].grad = nullptr;
    if (field == 2) params[0].m = nullptr;
    if (field == 3) params[0].v = nullptr;
    CHECK(DeviceParamList::create(params).status().code() == StatusCode::invalid_argument);
  }
  // Overlaps: the same param twice; one's m inside another's weight; a bf16 copy over a grad.
  params = {param(0, 10), param(0, 10)};
  CHECK(DeviceParamList::create(params).status().code() == StatusCode::invalid_argument);
  params = {param(0, 10), param(100, 10)};
  params[1].m = base + 5;
  CHECK(DeviceParamList::create(params).status().code() == StatusCode::invalid_argument);
  params = {param(0, 10)};
  params[0].compute_copy = reinterpret_cast<bf16*>(base + 12);
  CHECK(DeviceParamList::create(params).status().code() == StatusCode::invalid_argument);

  // An empty list needs no device.
  auto empty = DeviceParamList::create({});
  REQUIRE(empty.is_ok());
  CHECK(empty->size() == 0);
  CHECK(empty->chunk_count() == 0);
  // Empty params (numel 0) may have null buffers; they are not checked further.
  const DeviceParamList list;
  CHECK(global_grad_norm(list, 1.0f, nullptr, nullptr).code() == StatusCode::invalid_argument);
  auto* fake = reinterpret_cast<GradNormResult*>(uintptr_t{256});
  CHECK(global_grad_norm(list, std::nanf(""), fake, nullptr).code() == StatusCode::invalid_argument);
  CHECK(global_grad_norm(list, std::numeric_limits<float>::infinity(), fake, nullptr).code() ==
        StatusCode::invalid_argument);
}

// Device buffers for kSizes; only the grads matter for the norm.
struct DeviceGrads {
  DeviceArray<float> g;
  DeviceArray<float> w, m, v;
  DeviceArray<GradNormResult> result;
  DeviceParamList list;

  explicit DeviceGrads(const std::vector<float>& grads)
      : g(grads), w(size_t(kTotal)), m(size_t(kTotal)), v(size_t(kTotal)), result(size_t(1)) {
    const auto at = offsets();
    std::vector<DeviceParam> params;
    for (size_t k = 0; k < kSizes.size(); ++k) {
      params.push_back({w.get() + at[k], g.get() + at[k], m.get() + at[k], v.get() + at[k], nullptr, kSizes[k], true});
    }
    auto created = DeviceParamList::create(params);
    REQUIRE_MESSAGE(created.is_ok(), created.status().to_string());
    list = std::move(created).value();
  }

  GradNormResult run(float clip_norm) {
    const Status status = global_grad_norm(list, clip_norm, result.get(), nullptr);
    REQUIRE_MESSAGE(status.is_ok(), status.to_string());
    return result.to_host()[0];
  }
};

TEST_CASE("CUDA global_grad_norm equals optim::global_grad_norm bit for bit, deterministically") {
  if (testing::skip_without_device()) return;
  for (float scale : {1.0f, 1e-3f, 1e-20f, 1e15f}) {
    INFO("scale " << scale);
    std::vector<float> grads = testing::random_vector(size_t(kTotal), 11, scale);
    const float want = optim::global_grad_norm(cpu_params(grads));
    DeviceGrads device(grads);
    for (float clip_norm : {1.0f, 0.0f, 1e30f}) {
      INFO("clip_norm " << clip_norm);
      const GradNormResult first = device.run(clip_norm);
      const GradNormResult second = device.run(clip_norm);
      CHECK(bits_of(first.norm) == bits_of(want));
      CHECK(std::abs(double(first.norm) - want) <= 1e-6 * std::abs(double(want)));
      CHECK(bits_of(first.clip_coefficient) == bits_of(optim::clip_coefficient(want, clip_norm)));
      CHECK(first.refused == 0u);
      CHECK(first.refused_steps == 0u);
      CHECK(bits_of(second.norm) == bits_of(first.norm));
      CHECK(bits_of(second.clip_coefficient) == bits_of(first.clip_coefficient));
    }
  }
  // No params at all: norm 0, nothing to clip.
  DeviceArray<GradNormResult> result(size_t(1));
  const DeviceParamList empty;
  REQUIRE(global_grad_norm(empty, 1.0f, result.get(), nullptr).is_ok());
  const GradNormResult r = result.to_host()[0];
  CHECK(r.norm == 0.0f);
  CHECK(r.clip_coefficient == 1.0f);
  CHECK(r.refused == 0u);
}

TEST_CASE("CUDA global_grad_norm refuses NaN, infinite and overflowing norms, and counts refusals") {
  if (testing::skip_without_device()) return;
  const auto at = offsets();
  std::vector<float> grads = testing::random_vector(size_t(kTotal), 13);
  DeviceGrads device(grads);
  uint32_t refused = 0;
  for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    3e38f}) {
    INFO("bad " << bad);
    std::vector<float> bad_grads = grads;
    if (bad == 3e38f) {
      for (int64_t i = at[7]; i < at[8]; ++i) bad_grads[size_t(i)] = bad;  // finite squares, norm past FLT_MAX
    } else {
      bad_grads[size_t(at[5] + 7)] = bad;
    }
    CHECK_FALSE(std::isfinite(optim::global_grad_norm(cpu_params(bad_grads))));
    SWARM_CUDA_CHECK(cudaMemcpy(device.g.get(), bad_grads.data(), bad_grads.size() * sizeof(float),
                                cudaMemcpyHostToDevice));
    const GradNormResult r = device.run(1.0f);
    ++refused;
    CHECK_FALSE(std::isfinite(r.norm));
    CHECK(r.refused == 1u);
    CHECK(r.refused_steps == refused);
  }
  SWARM_CUDA_CHECK(cudaMemcpy(device.g.get(), grads.data(), grads.size() * sizeof(float), cudaMemcpyHostToDevice));
  const GradNormResult r = device.run(1.0f);
  CHECK(bits_of(r.norm) == bits_of(optim::global_grad_norm(cpu_params(grads))));
  CHECK(r.refused == 0u);
  CHECK(r.refused_steps == refused);  // a running count: not reset by a good norm
}

}  // namespace
}  // namespace swarm::cuda
