// CUDA flash attention against the CPU backend on random inputs, float and bf16:
// forward output, the lse statistic against a direct log-sum-exp, the backward
// (which adds into dqkv), bitwise determinism of the backward, and the scalar
// load path for pointers that are not 16-byte aligned.
//
// Tolerances, the same as the CPU emulation of this tiling
// (tests/kernels/common/flash_tile_test.cc, which measured them): max |got - want|
// / (rms(want) + |want|); float forward 1e-4, backward 1e-3; bf16 (the CPU gets
// the bf16-rounded qkv and dout) forward 3e-2, backward 8e-2, dominated by
// D = rowsum(dO * O) taken from the rounded O. lse: 1e-4 with floor 1e-3.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include <doctest/doctest.h>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/kernels/common/attention_reference.h"

namespace swarm::cuda {
namespace {

using testing::DeviceArray;
using testing::max_relative_error;
using testing::random_vector;
using testing::skip_without_device;
using testing::as_float;
using testing::as_type;
using Shape = kernels::testing::AttentionShape;
using kernels::testing::direct_lse;
using kernels::testing::rms;

// One forward and backward on the device; `offset` elements of slack before each
// input and output move them off 16-byte alignment (0: as cudaMalloc gives them).
template <typename Element>
struct DeviceRun {
  std::vector<float> out, lse, dqkv, dqkv_again, dqkv_twice;

  DeviceRun(const std::vector<Element>& qkv, const std::vector<Element>& dout, const Shape& s, int offset) {
    const size_t qkv_n = qkv.size(), out_n = dout.size();
    auto padded = [offset](const std::vector<Element>& v) {
      std::vector<Element> p(offset, Element{});
      p.insert(p.end(), v.begin(), v.end());
      return p;
    };
    auto unpadded = [offset](const DeviceArray<Element>& d) {
      std::vector<Element> h = d.to_host();
      return as_float(std::vector<Element>(h.begin() + offset, h.end()));
    };
    DeviceArray<Element> d_qkv(padded(qkv)), d_dout(padded(dout));
    DeviceArray<Element> d_out(offset + out_n), d_dqkv(offset + qkv_n), d_dqkv_again(offset + qkv_n);
    DeviceArray<float> d_scratch(static_cast<size_t>(attention_scratch_floats(s.B, s.T, s.NH)), NAN);
    Element* out_ptr = d_out.get() + offset;
    const Element* qkv_ptr = d_qkv.get() + offset;
    const Element* dout_ptr = d_dout.get() + offset;

    REQUIRE(attention_forward(out_ptr, d_scratch.get(), qkv_ptr, s.B, s.T, s.C, s.NH, nullptr).is_ok());
    out = unpadded(d_out);
    lse = d_scratch.to_host();
    lse.resize(size_t(s.B) * s.NH * s.T);

    REQUIRE(attention_backward(d_dqkv.get() + offset, d_scratch.get(), dout_ptr, qkv_ptr, out_ptr, s.B, s.T, s.C,
                               s.NH, nullptr)
                .is_ok());
    dqkv = unpadded(d_dqkv);
    // The same backward from the same start: it must give the same bits.
    REQUIRE(attention_backward(d_dqkv_again.get() + offset, d_scratch.get(), dout_ptr, qkv_ptr, out_ptr, s.B, s.T,
                               s.C, s.NH, nullptr)
                .is_ok());
    dqkv_again = unpadded(d_dqkv_again);
    // And once more into the first result: backward adds.
    REQUIRE(attention_backward(d_dqkv.get() + offset, d_scratch.get(), dout_ptr, qkv_ptr, out_ptr, s.B, s.T, s.C,
                               s.NH, nullptr)
                .is_ok());
    dqkv_twice = unpadded(d_dqkv);
    SWARM_CUDA_CHECK(cudaGetLastError());
  }
};

const Shape kShapes[] = {{2, 64, 128, 2}, {1, 100, 96, 3}, {1, 257, 256, 2}, {2, 1, 64, 1}, {1, 70, 64, 2}};

template <typename Element>
void check_against_cpu(double forward_tolerance, double backward_tolerance) {
  for (const Shape& s : kShapes) {
    INFO("B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH);
    const size_t qkv_n = size_t(s.B) * s.T * 3 * s.C, out_n = size_t(s.B) * s.T * s.C;
    const std::vector<Element> qkv = as_type<Element>(random_vector(qkv_n, 1));
    const std::vector<Element> dout = as_type<Element>(random_vector(out_n, 2));
    const std::vector<float> qkv_f = as_float(qkv), dout_f = as_float(dout);  // what the kernel reads

    std::vector<float> want_out(out_n), att(size_t(s.B) * s.NH * s.T * s.T), want_dqkv(qkv_n, 0.0f);
    cpu::attention_forward(want_out.data(), att.data(), qkv_f.data(), s.B, s.T, s.C, s.NH);
    cpu::attention_backward(want_dqkv.data(), dout_f.data(), qkv_f.data(), att.data(), s.B, s.T, s.C, s.NH);

    const DeviceRun<Element> run(qkv, dout, s, /*offset=*/0);
    const double out_error = max_relative_error(run.out, want_out, rms(want_out));
    const double lse_error = max_relative_error(run.lse, direct_lse(qkv_f, s), 1e-3);
    const double dqkv_error = max_relative_error(run.dqkv, want_dqkv, rms(want_dqkv));
    MESSAGE("errors: out " << out_error << " lse " << lse_error << " dqkv " << dqkv_error);
    CHECK(out_error < forward_tolerance);
    CHECK(lse_error < 1e-4);
    CHECK(dqkv_error < backward_tolerance);
    CHECK(run.dqkv_again == run.dqkv);

    std::vector<float> doubled(run.dqkv);
    for (float& x : doubled) x *= 2.0f;
    if constexpr (std::is_same_v<Element, float>) {
      CHECK(run.dqkv_twice == doubled);  // g + g with the same g: exact in float
    } else {
      CHECK(max_relative_error(run.dqkv_twice, doubled, rms(doubled)) < 1e-2);  // one more bf16 rounding
    }

    // Pointers off 16-byte alignment take the scalar loads: the same math, the same bits.
    const DeviceRun<Element> shifted(qkv, dout, s, /*offset=*/1);
    CHECK(shifted.out == run.out);
    CHECK(shifted.lse == run.lse);
    CHECK(shifted.dqkv == run.dqkv);
  }
}

TEST_CASE("CUDA attention, float, matches the CPU backend and is deterministic") {
  if (skip_without_device()) return;
  check_against_cpu<float>(1e-4, 1e-3);
}

TEST_CASE("CUDA attention, bf16 on tensor cores, matches the CPU backend on bf16 inputs and is deterministic") {
  if (skip_without_device()) return;
  check_against_cpu<bf16>(3e-2, 8e-2);
}

TEST_CASE("CUDA attention refuses bad shapes with a status, before touching the device") {
  // Non-null stand-ins: the checks must not dereference them, and no kernel may start.
  float f = 0.0f;
  bf16 h{};
  float* scratch = &f;
  CHECK(attention_forward(&f, scratch, &f, 0, 8, 64, 1, nullptr).code() == StatusCode::invalid_argument);
  CHECK(attention_forward(&f, scratch, &f, 1, 0, 64, 1, nullptr).code() == StatusCode::invalid_argument);
  CHECK(attention_forward(&f, scratch, &f, 1, 8, -64, 1, nullptr).code() == StatusCode::invalid_argument);
  CHECK(attention_forward(&f, scratch, &f, 1, 8, 64, 0, nullptr).code() == StatusCode::invalid_argument);
  CHECK(attention_forward(&f, scratch, &f, 1, 8, 100, 3, nullptr).code() == StatusCode::invalid_argument);
  CHECK(attention_forward(&h, scratch, &h, 1, 8, 64, 3, nullptr).code() == StatusCode::invalid_argument);
  CHECK(attention_forward(nullptr, scratch, &f, 1, 8, 64, 1, nullptr).code() == StatusCode::invalid_argument);
  CHECK(attention_forward(&f, nullptr, &f, 1, 8, 64, 1, nullptr).code() == StatusCode::invalid_argument);
  CHECK(attention_backward(&f, scratch, &f, &f, nullptr, 1, 8, 64, 1, nullptr).code() ==
        StatusCode::invalid_argument);
  CHECK(attention_backward(&h, scratch, &h, nullptr, &h, 1, 8, 64, 1, nullptr).code() ==
        StatusCode::invalid_argument);
  CHECK(attention_backward(&f, scratch, &f, &f, &f, 2, 8, 64, 4, nullptr).code() == StatusCode::unimplemented);
  // Head sizes other than 32, 64 and 128 are not compiled.
  CHECK(attention_forward(&f, scratch, &f, 1, 8, 80, 1, nullptr).code() == StatusCode::unimplemented);
  CHECK(attention_forward(&h, scratch, &h, 1, 8, 512, 2, nullptr).code() == StatusCode::unimplemented);
  CHECK(attention_backward(&h, scratch, &h, &h, &h, 1, 8, 48, 1, nullptr).code() == StatusCode::unimplemented);
  CHECK(attention_scratch_floats(2, 100, 3) == 2 * 2 * 3 * 100);
}

}  // namespace
}  // namespace swarm::cuda
