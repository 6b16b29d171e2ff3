// CUDA element-wise kernels against the CPU backend on random inputs, float and bf16,
// on sizes that are and are not multiples of the 16-byte vector width, through both
// the vector path (aligned pointers) and the scalar one (pointers one element off).
//
// Tolerances, as max_i |got - want| / (floor + |want|):
//   float GELU forward 1e-5 with floor 1: tanhf on the device and Eigen's tanh differ
//     by an ulp or two of 1, which 0.5 x carries into an absolute error;
//   float GELU backward 5e-5 with floor 1: the derivative multiplies a tanh ulp by up
//     to ~20 (near x = -4) and then by dout;
//   float residual / accumulate: exact (one rounding, the same as the CPU's);
//   bf16 everything 1e-2 with floor 1e-3: the output is rounded to bf16 (2^-9 relative).
// convert is checked bit for bit against swarm::bf16::from_float, NaNs included.
#include <cuda_runtime_api.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <doctest/doctest.h>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/elementwise.h"
#include "tests/cuda/cuda_test_util.h"

namespace swarm::cuda {
namespace {

using testing::as_float;
using testing::as_type;
using testing::DeviceArray;
using testing::max_relative_error;
using testing::random_vector;

// What a kernel on T sees of float data: bf16 rounds, float is exact.
template <typename T>
std::vector<float> as_seen(const std::vector<float>& v) {
  return as_float<T>(as_type<T>(v));
}

// A device copy of float data as T, starting `offset` elements into its allocation
// (offset 1 misaligns it for the 16-byte path).
template <typename T>
class Buffer {
 public:
  Buffer(const std::vector<float>& values, int offset) : offset_(offset), array_(padded(values, offset)) {}
  T* get() const { return array_.get() + offset_; }
  std::vector<T> raw() const {
    auto all = array_.to_host();
    return std::vector<T>(all.begin() + offset_, all.end());
  }
  std::vector<float> floats() const { return as_float<T>(raw()); }

 private:
  static std::vector<T> padded(const std::vector<float>& values, int offset) {
    std::vector<float> all(offset, 0.0f);
    all.insert(all.end(), values.begin(), values.end());
    return as_type<T>(all);
  }
  int offset_;
  DeviceArray<T> array_;
};

template <typename T>
constexpr bool kIsBf16 = std::is_same_v<T, bf16>;

template <typename T>
void check_against_cpu(int64_t n, int offset) {
  INFO("n=" << n << " offset=" << offset << " type=" << (kIsBf16<T> ? "bf16" : "float"));
  const auto x = as_seen<T>(random_vector(n, 11, 3.0f));
  const auto y = as_seen<T>(random_vector(n, 12));
  const auto d = as_seen<T>(random_vector(n, 13));
  const double bf16_tolerance = 1e-2;

  {  // gelu_forward
    std::vector<float> want(n);
    cpu::gelu_forward(want.data(), x.data(), n);
    Buffer<T> in(x, offset), out(std::vector<float>(n, 7.0f), offset);
    REQUIRE(gelu_forward(out.get(), in.get(), n, nullptr).is_ok());
    if constexpr (kIsBf16<T>) {
      CHECK(max_relative_error(out.floats(), want) < bf16_tolerance);
    } else {
      CHECK(max_relative_error(out.floats(), want, 1.0) < 1e-5);
    }
  }
  {  // gelu_backward adds into dinp
    std::vector<float> want = y;
    cpu::gelu_backward(want.data(), x.data(), d.data(), n);
    Buffer<T> in(x, offset), dout(d, offset), dinp(y, offset);
    REQUIRE(gelu_backward(dinp.get(), in.get(), dout.get(), n, nullptr).is_ok());
    if constexpr (kIsBf16<T>) {
      CHECK(max_relative_error(dinp.floats(), want) < bf16_tolerance);
    } else {
      CHECK(max_relative_error(dinp.floats(), want, 1.0) < 5e-5);
    }
  }
  {  // residual_forward, out of place and in place (out == a)
    std::vector<float> want(n);
    cpu::residual_forward(want.data(), x.data(), y.data(), n);
    Buffer<T> a(x, offset), b(y, offset), out(std::vector<float>(n, 7.0f), offset);
    REQUIRE(residual_forward(out.get(), a.get(), b.get(), n, nullptr).is_ok());
    REQUIRE(residual_forward(a.get(), a.get(), b.get(), n, nullptr).is_ok());
    const double tolerance = kIsBf16<T> ? bf16_tolerance : 1e-7;
    CHECK(max_relative_error(out.floats(), want) < tolerance);
    CHECK(max_relative_error(a.floats(), want) < tolerance);
  }
  {  // accumulate
    std::vector<float> want = y;
    cpu::accumulate(want.data(), x.data(), n);
    Buffer<T> src(x, offset), dst(y, offset);
    REQUIRE(accumulate(dst.get(), src.get(), n, nullptr).is_ok());
    CHECK(max_relative_error(dst.floats(), want) < (kIsBf16<T> ? bf16_tolerance : 1e-7));
  }
  {  // fill_zero: +0 bits everywhere
    Buffer<T> dst(x, offset);
    REQUIRE(fill_zero(dst.get(), n, nullptr).is_ok());
    const auto got = dst.raw();
    std::vector<T> zeros(n);
    CHECK(std::memcmp(got.data(), zeros.data(), n * sizeof(T)) == 0);
  }
}

TEST_CASE("CUDA element-wise kernels match the CPU backend, float and bf16, aligned and not") {
  if (testing::skip_without_device()) return;
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{4099}, int64_t{(1 << 20) + 5}}) {
    for (int offset : {0, 1}) {
      check_against_cpu<float>(n, offset);
      check_against_cpu<bf16>(n, offset);
    }
  }
}

// Special values and rounding ties, then random ones; odd count so both paths run.
std::vector<float> conversion_inputs() {
  std::vector<uint32_t> bits = {
      0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,  // zeros, infinities
      0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff812345u,  // quiet, negative and signaling NaNs
      0x7fffffffu, 0x7f7fffffu, 0xff7fffffu,              // a NaN with all payload bits, the largest finites
      0x00000001u, 0x807fffffu, 0x00008000u, 0x00018000u,  // subnormals, ties in subnormals
      0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu,  // ties to even (down, up), just above and below
  };
  std::vector<float> values;
  for (uint32_t b : bits) values.push_back(std::bit_cast<float>(b));
  const auto random = random_vector(10001, 21, 100.0f);
  values.insert(values.end(), random.begin(), random.end());
  return values;
}

TEST_CASE("CUDA convert rounds to bf16 with the same bits as bf16::from_float and widens exactly") {
  if (testing::skip_without_device()) return;
  const auto values = conversion_inputs();
  const int64_t n = static_cast<int64_t>(values.size());
  for (int offset : {0, 1}) {
    INFO("offset=" << offset);
    Buffer<float> src(values, offset);
    DeviceArray<bf16> narrow_storage(static_cast<size_t>(n + offset));
    bf16* narrow = narrow_storage.get() + offset;
    REQUIRE(convert(narrow, src.get(), n, nullptr).is_ok());
    const auto got_all = narrow_storage.to_host();
    int mismatches = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (got_all[offset + i].bits != bf16::from_float(values[i]).bits) ++mismatches;
    }
    CHECK(mismatches == 0);

    Buffer<float> wide(std::vector<float>(n, 7.0f), offset);
    REQUIRE(convert(wide.get(), narrow, n, nullptr).is_ok());
    const auto widened = wide.raw();
    mismatches = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (std::bit_cast<uint32_t>(widened[i]) != std::bit_cast<uint32_t>(got_all[offset + i].to_float())) {
        ++mismatches;
      }
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("CUDA element-wise kernels refuse bad sizes and null pointers before touching the device") {
  // No device needed: the argument checks come first.
  float* f = nullptr;
  bf16* h = nullptr;
  const auto invalid = StatusCode::invalid_argument;
  CHECK(gelu_forward(f, f, -1, nullptr).code() == invalid);
  CHECK(gelu_forward(h, h, 4, nullptr).code() == invalid);
  CHECK(gelu_backward(f, f, f, 4, nullptr).code() == invalid);
  CHECK(gelu_backward(h, h, h, -3, nullptr).code() == invalid);
  CHECK(residual_forward(f, f, f, 4, nullptr).code() == invalid);
  CHECK(residual_forward(h, h, h, -1, nullptr).code() == invalid);
  CHECK(accumulate(f, f, 4, nullptr).code() == invalid);
  CHECK(accumulate(h, h, -1, nullptr).code() == invalid);
  CHECK(fill_zero(f, 4, nullptr).code() == invalid);
  CHECK(fill_zero(h, -1, nullptr).code() == invalid);
  CHECK(convert(h, f, 4, nullptr).code() == invalid);
  CHECK(convert(f, h, -1, nullptr).code() == invalid);
  // Empty is fine, even with null pointers.
  CHECK(gelu_forward(f, f, 0, nullptr).is_ok());
  CHECK(gelu_backward(h, h, h, 0, nullptr).is_ok());
  CHECK(residual_forward(f, f, f, 0, nullptr).is_ok());
  CHECK(accumulate(h, h, 0, nullptr).is_ok());
  CHECK(fill_zero(f, 0, nullptr).is_ok());
  CHECK(convert(h, f, 0, nullptr).is_ok());
  CHECK(convert(f, h, 0, nullptr).is_ok());
}

}  // namespace
}  // namespace swarm::cuda
