// CUDA AdamW and LAMB against swarm::optim::AdamW / Lamb on the CPU: three steps on a small model
// packed flat (params of 1, 1000, 4099 and 300000 elements, so some start misaligned), with and
// without bf16 compute copies, clipping active on two of the three steps.
//
// Tolerance: bitwise. Both sides run the optim_math.h expressions in the same order without FMA
// contraction, IEEE division and sqrt, and the same double reductions in the same order, so the
// weights, moments and norms must match bit for bit (which implies the brief's 1e-6 relative,
// also checked). A refused step (non-finite gradient norm) must leave everything untouched.
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
#include "kernels/cuda/optimizer.h"
#include "swarm/core/tensor.h"
#include "swarm/optim/optimizer.h"
#include "tests/cuda/cuda_test_util.h"

namespace swarm::cuda {
namespace {

using testing::DeviceArray;

const std::vector<int64_t> kSizes = {1, 1000, 4099, 300000};
const std::vector<bool> kDecay = {false, true, false, true};
const std::vector<float> kGradScale = {1.0f, 1e-5f, 0.01f};  // norms ~550, ~0.006, ~5.5: clip, none, clip

enum class Kind { adamw, lamb };

std::vector<int64_t> offsets() {
  std::vector<int64_t> at(kSizes.size() + 1, 0);
  for (size_t k = 0; k < kSizes.size(); ++k) at[k + 1] = at[k] + kSizes[k];
  return at;
}
const int64_t kTotal = offsets().back();

optim::OptimizerConfig config() { return optim::OptimizerConfig{}; }  // clip 1, wd 0.01, max ratio 10
float learning_rate(Kind kind) { return kind == Kind::adamw ? 1e-3f : 1e-2f; }

std::vector<uint32_t> bits_of(const std::vector<float>& x) {
  std::vector<uint32_t> out(x.size());
  std::memcpy(out.data(), x.data(), x.size() * sizeof(float));
  return out;
}

int64_t bit_mismatches(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return -1;
  const auto x = bits_of(a), y = bits_of(b);
  int64_t count = 0;
  for (size_t i = 0; i < x.size(); ++i) count += x[i] != y[i];
  return count;
}

// The device side: flat buffers, a DeviceParamList over them, and the norm result.
struct DeviceModel {
  DeviceArray<float> w, g, m, v;
  DeviceArray<bf16> copy;
  DeviceArray<GradNormResult> norm;
  DeviceParamList list;
  bool with_copies;

  DeviceModel(const std::vector<float>& w0, bool with_copies)
      : w(w0), g(size_t(kTotal), 0.0f), m(size_t(kTotal), 0.0f), v(size_t(kTotal), 0.0f), copy(size_t(kTotal)),
        norm(size_t(1)), with_copies(with_copies) {
    const auto at = offsets();
    std::vector<DeviceParam> params;
    for (size_t k = 0; k < kSizes.size(); ++k) {
      params.push_back({w.get() + at[k], g.get() + at[k], m.get() + at[k], v.get() + at[k],
                        with_copies ? copy.get() + at[k] : nullptr, kSizes[k], kDecay[k]});
    }
    auto created = DeviceParamList::create(params);
    REQUIRE_MESSAGE(created.is_ok(), created.status().to_string());
    list = std::move(created).value();
  }

  void upload_grads(const std::vector<float>& grads) {
    REQUIRE(grads.size() == size_t(kTotal));
    SWARM_CUDA_CHECK(cudaMemcpy(g.get(), grads.data(), grads.size() * sizeof(float), cudaMemcpyHostToDevice));
  }

  // The device training step: no host synchronisation between its launches.
  void step(Kind kind, int64_t step_number) {
    const optim::OptimizerConfig c = config();
    const auto coefficients = optim::adam_coefficients(c.beta1, c.beta2, c.eps, step_number);
    Status status = global_grad_norm(list, c.clip_norm, norm.get(), nullptr);
    REQUIRE_MESSAGE(status.is_ok(), status.to_string());
    status = kind == Kind::adamw
                 ? adamw_step(list, norm.get(), coefficients, learning_rate(kind), c.weight_decay, nullptr)
                 : lamb_step(list, norm.get(), coefficients, learning_rate(kind), c.weight_decay, c.max_trust_ratio,
                             nullptr);
    REQUIRE_MESSAGE(status.is_ok(), status.to_string());
  }

  GradNormResult norm_result() const { return norm.to_host()[0]; }
};

// The CPU side: the same flat layout, viewed as named ParamRefs.
struct CpuModel {
  std::vector<float> w, g;
  std::vector<optim::ParamRef> params;
  optim::AdamW adamw{config()};
  optim::Lamb lamb{config()};

  explicit CpuModel(const std::vector<float>& w0) : w(w0), g(w0.size(), 0.0f) {
    const auto at = offsets();
    for (size_t k = 0; k < kSizes.size(); ++k) {
      params.push_back({fmt::format("p{}", k), TensorView(w.data() + at[k], DType::f32, Shape{kSizes[k]}),
                        TensorView(g.data() + at[k], DType::f32, Shape{kSizes[k]}), kDecay[k]});
    }
  }

  int64_t steps_taken(Kind kind) const { return kind == Kind::adamw ? adamw.steps_taken() : lamb.steps_taken(); }
  Status step(Kind kind) {
    return kind == Kind::adamw ? adamw.step(params, learning_rate(kind)) : lamb.step(params, learning_rate(kind));
  }

  // The flat m or v, from the exported state ("adam.m/p0", ...).
  std::vector<float> moment(Kind kind, std::string_view prefix) const {
    const auto state = kind == Kind::adamw ? adamw.export_state() : lamb.export_state();
    const auto at = offsets();
    std::vector<float> flat(size_t(kTotal), 0.0f);
    for (size_t k = 0; k < kSizes.size(); ++k) {
      const std::string name = fmt::format("{}p{}", prefix, k);
      bool found = false;
      for (const auto& [entry, tensor] : state) {
        if (entry != name) continue;
        REQUIRE(tensor.numel() == kSizes[k]);
        std::memcpy(flat.data() + at[k], tensor.data<float>(), size_t(kSizes[k]) * sizeof(float));
        found = true;
      }
      REQUIRE_MESSAGE(found, name);
    }
    return flat;
  }
};

void check_matches_cpu(const DeviceModel& device, const CpuModel& cpu, Kind kind) {
  const std::vector<float> w = device.w.to_host();
  CHECK(bit_mismatches(w, cpu.w) == 0);
  CHECK(testing::max_relative_error(w, cpu.w, 1e-6) < 1e-6);
  CHECK(bit_mismatches(device.m.to_host(), cpu.moment(kind, optim::kFirstMomentPrefix)) == 0);
  CHECK(bit_mismatches(device.v.to_host(), cpu.moment(kind, optim::kSecondMomentPrefix)) == 0);
  const std::vector<bf16> copy = device.copy.to_host();
  int64_t copy_mismatches = 0;
  for (size_t i = 0; i < copy.size(); ++i) {
    const uint16_t want = device.with_copies ? bf16::from_float(w[i]).bits : 0;  // untouched when unused
    copy_mismatches += copy[i].bits != want;
  }
  CHECK(copy_mismatches == 0);
}

std::vector<float> step_grads(int step) {
  return testing::random_vector(size_t(kTotal), 100 + uint32_t(step), kGradScale[size_t(step) % kGradScale.size()]);
}

TEST_CASE("CUDA AdamW and LAMB match the CPU optimizers bit for bit over three steps, with and without bf16 copies") {
  if (testing::skip_without_device()) return;
  const std::vector<float> w0 = testing::random_vector(size_t(kTotal), 1);
  for (Kind kind : {Kind::adamw, Kind::lamb}) {
    std::vector<float> final_weights[2];
    for (bool with_copies : {false, true}) {
      INFO((kind == Kind::adamw ? "AdamW" : "LAMB") << (with_copies ? ", bf16 copies" : ", f32 only"));
      DeviceModel device(w0, with_copies);
      CpuModel cpu(w0);
      for (int step = 0; step < 3; ++step) {
        INFO("step " << step + 1);
        const std::vector<float> grads = step_grads(step);
        cpu.g = grads;
        device.upload_grads(grads);
        const float cpu_norm = optim::global_grad_norm(cpu.params);
        const int64_t step_number = cpu.steps_taken(kind) + 1;
        const Status status = cpu.step(kind);
        REQUIRE_MESSAGE(status.is_ok(), status.to_string());
        device.step(kind, step_number);

        const GradNormResult result = device.norm_result();
        CHECK(bit_mismatches({result.norm}, {cpu_norm}) == 0);
        CHECK(result.clip_coefficient == optim::clip_coefficient(cpu_norm, config().clip_norm));
        CHECK(result.refused == 0u);
        check_matches_cpu(device, cpu, kind);
      }
      final_weights[with_copies ? 1 : 0] = device.w.to_host();
    }
    // The bf16 copies change nothing in the f32 update; both runs are also the same run twice.
    CHECK(bit_mismatches(final_weights[0], final_weights[1]) == 0);
  }
}

TEST_CASE("CUDA optimizer steps with a non-finite gradient norm change nothing and report it") {
  if (testing::skip_without_device()) return;
  const std::vector<float> w0 = testing::random_vector(size_t(kTotal), 7);
  DeviceModel device(w0, /*with_copies=*/true);
  CpuModel cpu(w0);
  const auto at = offsets();

  const auto good_step = [&] {
    const std::vector<float> grads = step_grads(int(cpu.adamw.steps_taken()));
    cpu.g = grads;
    device.upload_grads(grads);
    const int64_t step_number = cpu.adamw.steps_taken() + 1;
    REQUIRE(cpu.step(Kind::adamw).is_ok());
    device.step(Kind::adamw, step_number);
    check_matches_cpu(device, cpu, Kind::adamw);
  };
  good_step();  // non-zero moments and a refreshed copy, so "unchanged" means something

  struct Bad {
    const char* what;
    size_t param;
    float value;
  };
  const float kHuge = 3e38f;  // finite, but the norm of 4099 of them is past float's range
  const std::vector<Bad> bad_cases = {{"NaN", 2, std::nanf("")},
                                      {"+inf", 1, std::numeric_limits<float>::infinity()},
                                      {"-inf", 3, -std::numeric_limits<float>::infinity()},
                                      {"norm overflow", 2, kHuge}};
  uint32_t refused = 0;
  for (const Bad& bad : bad_cases) {
    INFO(bad.what);
    std::vector<float> grads = step_grads(5);
    if (bad.value == kHuge) {
      for (int64_t i = at[bad.param]; i < at[bad.param + 1]; ++i) grads[size_t(i)] = kHuge;
    } else {
      grads[size_t(at[bad.param] + kSizes[bad.param] / 2)] = bad.value;
    }
    cpu.g = grads;
    device.upload_grads(grads);
    CHECK_FALSE(std::isfinite(optim::global_grad_norm(cpu.params)));
    CHECK(cpu.step(Kind::adamw).code() == StatusCode::invalid_argument);  // the CPU refuses too

    const auto w = device.w.to_host(), m = device.m.to_host(), v = device.v.to_host();
    const auto copy = device.copy.to_host();
    const int64_t step_number = cpu.adamw.steps_taken() + 1;
    device.step(Kind::adamw, step_number);
    ++refused;
    CHECK(device.norm_result().refused == 1u);
    CHECK(device.norm_result().refused_steps == refused);
    device.step(Kind::lamb, step_number);  // refused as well
    ++refused;
    const GradNormResult result = device.norm_result();
    CHECK_FALSE(std::isfinite(result.norm));
    CHECK(result.refused == 1u);
    CHECK(result.refused_steps == refused);
    CHECK(bit_mismatches(device.w.to_host(), w) == 0);
    CHECK(bit_mismatches(device.m.to_host(), m) == 0);
    CHECK(bit_mismatches(device.v.to_host(), v) == 0);
    CHECK(device.copy.to_host() == copy);
  }
  // A refused step is not a step: the next good one uses step number 2 on both sides.
  CHECK(cpu.adamw.steps_taken() == 1);
  good_step();
  CHECK(device.norm_result().refused == 0u);
  CHECK(device.norm_result().refused_steps == refused);
}

TEST_CASE("CUDA optimizer steps refuse bad arguments with a status, before touching the device") {
  // An empty list and a fake result pointer: the checks come first, and an empty list launches nothing.
  const DeviceParamList empty;
  auto* fake = reinterpret_cast<const GradNormResult*>(uintptr_t{256});
  const optim::OptimizerConfig c;
  const auto good = optim::adam_coefficients(c.beta1, c.beta2, c.eps, 1);
  CHECK(adamw_step(empty, fake, good, 1e-3f, 0.01f, nullptr).is_ok());
  CHECK(lamb_step(empty, fake, good, 1e-3f, 0.01f, 10.0f, nullptr).is_ok());

  CHECK(adamw_step(empty, nullptr, good, 1e-3f, 0.01f, nullptr).code() == StatusCode::invalid_argument);
  CHECK(lamb_step(empty, nullptr, good, 1e-3f, 0.01f, 10.0f, nullptr).code() == StatusCode::invalid_argument);
  for (float lr : {-1e-3f, std::nanf(""), std::numeric_limits<float>::infinity()}) {
    CHECK(adamw_step(empty, fake, good, lr, 0.01f, nullptr).code() == StatusCode::invalid_argument);
    CHECK(lamb_step(empty, fake, good, lr, 0.01f, 10.0f, nullptr).code() == StatusCode::invalid_argument);
  }
  for (float wd : {-0.01f, std::nanf("")}) {
    CHECK(adamw_step(empty, fake, good, 1e-3f, wd, nullptr).code() == StatusCode::invalid_argument);
  }
  CHECK(lamb_step(empty, fake, good, 1e-3f, 0.01f, std::numeric_limits<float>::infinity(), nullptr).code() ==
        StatusCode::invalid_argument);
  CHECK(lamb_step(empty, fake, good, 1e-3f, 0.01f, 0.0f, nullptr).is_ok());  // 0: no clamp, as on the CPU

  auto bad = good;
  bad.beta1 = 1.0f;
  CHECK(adamw_step(empty, fake, bad, 1e-3f, 0.01f, nullptr).code() == StatusCode::invalid_argument);
  bad = good;
  bad.beta2 = -0.1f;
  CHECK(lamb_step(empty, fake, bad, 1e-3f, 0.01f, 10.0f, nullptr).code() == StatusCode::invalid_argument);
  bad = good;
  bad.eps = 0.0f;
  CHECK(adamw_step(empty, fake, bad, 1e-3f, 0.01f, nullptr).code() == StatusCode::invalid_argument);
  // Step 0 has zero bias corrections: m_hat would divide by zero.
  const auto step_zero = optim::adam_coefficients(c.beta1, c.beta2, c.eps, 0);
  CHECK(adamw_step(empty, fake, step_zero, 1e-3f, 0.01f, nullptr).code() == StatusCode::invalid_argument);
  CHECK(lamb_step(empty, fake, step_zero, 1e-3f, 0.01f, 10.0f, nullptr).code() == StatusCode::invalid_argument);
}

}  // namespace
}  // namespace swarm::cuda
