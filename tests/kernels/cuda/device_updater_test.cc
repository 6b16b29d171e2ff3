// DeviceUpdater (CUDA) against HostUpdater (CPU) on the same random params: four tensors of odd
// sizes (one spanning several norm chunks, two without weight decay), three steps each of AdamW
// through step() and of LAMB through step_with_gradients(), with clipping active on two of them.
//
// Tolerance: bitwise. Both run the optim_math.h expressions in the same order without FMA
// contraction and the same double reductions, so weights and exported moments must match bit for
// bit. Also: export/import round trips in both directions (a checkpoint moves between devices),
// refusal of a non-finite gradient with nothing changed, and the argument checks (these need no
// device: they fail before the device is touched, with the CPU's texts).
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/device_updater.h"
#include "swarm/api/updater.h"
#include "swarm/core/tensor.h"
#include "swarm/optim/host_updater.h"
#include "swarm/optim/optimizer.h"
#include "tests/cuda/cuda_test_util.h"

namespace swarm::cuda {
namespace {

using optim::HostUpdater;
using optim::Rule;

static_assert(ParameterUpdater<DeviceUpdater>);
static_assert(DeviceUpdater::device == Device::cuda);

struct ParamSpec {
  std::string name;
  Shape shape;
  bool decay;
};

// 20467 elements: two norm chunks; the offsets of the concatenated gradient are not multiples of 4.
const std::vector<ParamSpec> kSpecs = {
    {"h.0.attn.qkv.weight", Shape{97, 211}, true},
    {"h.0.attn.qkv.bias", Shape{1001}, false},
    {"h.0.ln_1.weight", Shape{3}, false},
    {"lm_head.weight", Shape{70001}, true},
};
const std::vector<float> kGradScale = {1.0f, 1e-5f, 0.01f};  // clipped, not clipped, clipped

optim::OptimizerConfig config() { return optim::OptimizerConfig{}; }  // clip 1, wd 0.01, max ratio 10
float learning_rate(Rule rule) { return rule == Rule::adamw ? 1e-3f : 1e-2f; }

int64_t total_numel() {
  int64_t n = 0;
  for (const auto& spec : kSpecs) n += spec.shape.numel();
  return n;
}

Tensor random_tensor(const Shape& shape, uint32_t seed, float scale) {
  Tensor t = Tensor::empty(shape, DType::f32).value();
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  for (float& x : t.span<float>()) x = normal(rng);
  return t;
}

Tensor on(Device device, const Tensor& t) {
  auto copy = Tensor::copy_of(t, device);
  REQUIRE_MESSAGE(copy.is_ok(), copy.status().to_string());
  return std::move(copy).value();
}

// Weights and gradient accumulators on one device, viewed as a stage's parameters.
struct Model {
  std::vector<Tensor> w, g;

  Model(Device device, uint32_t seed) {
    for (size_t k = 0; k < kSpecs.size(); ++k) {
      w.push_back(on(device, random_tensor(kSpecs[k].shape, seed + uint32_t(k), 0.5f)));
      g.push_back(on(device, Tensor::zeros(kSpecs[k].shape, DType::f32).value()));
    }
  }

  std::vector<StageParameterView> views() const {
    std::vector<StageParameterView> out;
    for (size_t k = 0; k < kSpecs.size(); ++k) out.push_back({kSpecs[k].name, w[k], g[k], kSpecs[k].decay});
    return out;
  }

  void set_grads(const std::vector<Tensor>& grads) {
    for (size_t k = 0; k < kSpecs.size(); ++k) REQUIRE(g[k].copy_from(grads[k]).is_ok());
  }

  std::vector<Tensor> weights_on_host() const {
    std::vector<Tensor> out;
    for (const Tensor& t : w) out.push_back(on(Device::cpu, t));
    return out;
  }
};

// The gradient of step `step` (0-based), per param and concatenated.
std::vector<Tensor> step_grads(int step) {
  std::vector<Tensor> grads;
  for (size_t k = 0; k < kSpecs.size(); ++k) {
    grads.push_back(random_tensor(kSpecs[k].shape, 1000u * uint32_t(step + 1) + uint32_t(k), kGradScale[step]));
  }
  return grads;
}

std::vector<float> concatenated(const std::vector<Tensor>& grads) {
  std::vector<float> flat;
  for (const Tensor& t : grads) flat.insert(flat.end(), t.span<float>().begin(), t.span<float>().end());
  return flat;
}

void check_same_weights(const Model& host, const Model& device) {
  const std::vector<Tensor> got = device.weights_on_host();
  for (size_t k = 0; k < kSpecs.size(); ++k) CHECK_MESSAGE(bitwise_equal(got[k], host.w[k]), kSpecs[k].name);
}

template <typename A, typename B>
void check_same_state(const A& a, const B& b) {
  const auto sa = a.export_state();
  const auto sb = b.export_state();
  REQUIRE_MESSAGE(sa.is_ok(), sa.status().to_string());
  REQUIRE_MESSAGE(sb.is_ok(), sb.status().to_string());
  REQUIRE(sa.value().size() == sb.value().size());
  for (size_t i = 0; i < sa.value().size(); ++i) {
    const auto& [name_a, tensor_a] = sa.value()[i];
    const auto& [name_b, tensor_b] = sb.value()[i];
    CHECK(name_a == name_b);
    CHECK(tensor_a.device() == Device::cpu);
    CHECK(tensor_b.device() == Device::cpu);
    CHECK_MESSAGE(bitwise_equal(tensor_a, tensor_b), name_a);  // dtype, shape and bytes
  }
  CHECK(a.steps_taken() == b.steps_taken());
}

bool have_device() {
  if (testing::skip_without_device()) return false;
  const Status installed = install_cuda_allocator();
  REQUIRE_MESSAGE(installed.is_ok(), installed.to_string());
  return true;
}

// Both updaters take step `step` of rule `rule`: through step() for AdamW, through
// step_with_gradients() for LAMB.
void take_step(Rule rule, int step, HostUpdater& host_updater, Model& host, DeviceUpdater& device_updater,
               Model& device) {
  const std::vector<Tensor> grads = step_grads(step);
  const float lr = learning_rate(rule);
  Status want, got;
  if (rule == Rule::adamw) {
    host.set_grads(grads);
    device.set_grads(grads);
    want = host_updater.step(host.views(), lr);
    got = device_updater.step(device.views(), lr);
  } else {
    const std::vector<float> flat = concatenated(grads);
    want = host_updater.step_with_gradients(host.views(), flat, lr);
    got = device_updater.step_with_gradients(device.views(), flat, lr);
  }
  REQUIRE_MESSAGE(want.is_ok(), want.to_string());
  REQUIRE_MESSAGE(got.is_ok(), got.to_string());
}

void check_three_steps(Rule rule) {
  HostUpdater host_updater(config(), rule);
  DeviceUpdater device_updater(config(), rule);
  Model host(Device::cpu, 7), device(Device::cuda, 7);
  for (int step = 0; step < 3; ++step) {
    CAPTURE(step);
    take_step(rule, step, host_updater, host, device_updater, device);
    CHECK(device_updater.steps_taken() == step + 1);
    check_same_weights(host, device);
    check_same_state(host_updater, device_updater);
  }
}

TEST_CASE("AdamW through step(): three steps bit-identical to HostUpdater, the same exported state") {
  if (!have_device()) return;
  check_three_steps(Rule::adamw);
}

TEST_CASE("LAMB through step_with_gradients(): three steps bit-identical to HostUpdater") {
  if (!have_device()) return;
  check_three_steps(Rule::lamb);
}

TEST_CASE("import_state: a checkpoint moves between the devices and training goes on bit for bit") {
  if (!have_device()) return;
  for (Rule rule : {Rule::adamw, Rule::lamb}) {
    const bool lamb = rule == Rule::lamb;
    CAPTURE(lamb);
    HostUpdater host_updater(config(), rule);
    DeviceUpdater device_updater(config(), rule);
    Model host(Device::cpu, 11), device(Device::cuda, 11);
    for (int step = 0; step < 2; ++step) take_step(rule, step, host_updater, host, device_updater, device);

    // Host -> device: a fresh device updater continues the host's run.
    DeviceUpdater resumed(config(), rule);
    const Status imported = resumed.import_state(host_updater.export_state().value());
    REQUIRE_MESSAGE(imported.is_ok(), imported.to_string());
    check_same_state(host_updater, resumed);
    take_step(rule, 2, host_updater, host, resumed, device);
    check_same_weights(host, device);
    check_same_state(host_updater, resumed);

    // Device -> host.
    HostUpdater back(config(), rule);
    REQUIRE(back.import_state(resumed.export_state().value()).is_ok());
    check_same_state(back, resumed);
  }
}

TEST_CASE("import_state: a bad state is refused with the CPU's text and changes nothing") {
  if (!have_device()) return;
  HostUpdater host_updater(config(), Rule::lamb);
  DeviceUpdater device_updater(config(), Rule::lamb);
  Model host(Device::cpu, 3), device(Device::cuda, 3);
  take_step(Rule::lamb, 0, host_updater, host, device_updater, device);
  const OptimizerState good = host_updater.export_state().value();

  OptimizerState lacks_v;  // every entry but the last moment's v
  for (const auto& entry : good) {
    if (entry.first != "adam.v/lm_head.weight") lacks_v.push_back(entry);
  }
  OptimizerState negative_v = good;
  for (auto& [name, tensor] : negative_v) {
    if (name == "adam.v/h.0.ln_1.weight") {
      tensor = tensor.clone();
      tensor.data<float>()[1] = -1.0f;
    }
  }
  for (const OptimizerState* bad : {&lacks_v, &negative_v}) {
    HostUpdater host_copy(config(), Rule::lamb);
    REQUIRE(host_copy.import_state(good).is_ok());
    const Status want = host_copy.import_state(*bad);
    const Status got = device_updater.import_state(*bad);
    CHECK(got.code() == StatusCode::invalid_argument);
    CHECK(got == want);
    check_same_state(host_updater, device_updater);  // unchanged
  }
}

TEST_CASE("a non-finite gradient is refused: weights, moments and step count unchanged") {
  if (!have_device()) return;
  for (Rule rule : {Rule::adamw, Rule::lamb}) {
    const bool lamb = rule == Rule::lamb;
    CAPTURE(lamb);
    HostUpdater host_updater(config(), rule);
    DeviceUpdater device_updater(config(), rule);
    Model host(Device::cpu, 5), device(Device::cuda, 5);

    // On the first step: no moment is created either.
    std::vector<Tensor> grads = step_grads(0);
    grads[3].data<float>()[12345] = std::numeric_limits<float>::quiet_NaN();
    device.set_grads(grads);
    Status got = device_updater.step(device.views(), learning_rate(rule));
    CHECK(got.code() == StatusCode::invalid_argument);
    CHECK(device_updater.steps_taken() == 0);
    CHECK(device_updater.export_state().value().size() == 1);  // only "optimizer.step"

    take_step(rule, 0, host_updater, host, device_updater, device);
    const std::vector<Tensor> before = device.weights_on_host();
    grads = step_grads(1);
    grads[1].data<float>()[7] = std::numeric_limits<float>::infinity();
    device.set_grads(grads);
    got = device_updater.step(device.views(), learning_rate(rule));
    CHECK(got.code() == StatusCode::invalid_argument);
    got = device_updater.step_with_gradients(device.views(), concatenated(grads), learning_rate(rule));
    CHECK(got.code() == StatusCode::invalid_argument);
    CHECK(device_updater.steps_taken() == 1);
    const std::vector<Tensor> after = device.weights_on_host();
    for (size_t k = 0; k < kSpecs.size(); ++k) CHECK(bitwise_equal(after[k], before[k]));
    check_same_state(host_updater, device_updater);

    // And the run goes on exactly as the host's.
    take_step(rule, 1, host_updater, host, device_updater, device);
    check_same_weights(host, device);
    check_same_state(host_updater, device_updater);
  }
}

// Device views that are never dereferenced: every call below fails before the device is touched.
std::vector<StageParameterView> fake_device_views() {
  std::vector<StageParameterView> out;
  static float sentinel[4];
  for (const auto& spec : kSpecs) {
    const TensorView t(sentinel, DType::f32, spec.shape, Device::cuda);
    out.push_back({spec.name, t, t, spec.decay});
  }
  return out;
}

TEST_CASE("argument checks, with the CPU's texts, before the device is touched (no GPU needed)") {
  HostUpdater host_updater(config(), Rule::lamb);
  DeviceUpdater device_updater(config(), Rule::lamb);
  Model host(Device::cpu, 1);
  const auto views = fake_device_views();
  const int64_t n = total_numel();

  for (int64_t length : {n - 1, n + 1, int64_t{0}}) {
    const std::vector<float> gradient(static_cast<size_t>(length), 0.0f);
    const Status want = host_updater.step_with_gradients(host.views(), gradient, 1e-2f);
    const Status got = device_updater.step_with_gradients(views, gradient, 1e-2f);
    CHECK(got.code() == StatusCode::invalid_argument);
    CHECK(got == want);
  }
  const std::vector<float> gradient(static_cast<size_t>(n), 0.0f);
  CHECK(device_updater.step_with_gradients(views, gradient, -1.0f) ==
        host_updater.step_with_gradients(host.views(), gradient, -1.0f));  // the lr
  CHECK(device_updater.step(host.views(), 1e-2f).code() == StatusCode::invalid_argument);  // cpu tensors
  auto twice = views;
  twice[2].name = twice[0].name;
  CHECK(device_updater.step(twice, 1e-2f).code() == StatusCode::invalid_argument);
  auto mismatched = views;
  mismatched[1].grad = TensorView(mismatched[1].grad.raw_data(), DType::f32, Shape{1000}, Device::cuda);
  CHECK(device_updater.step(mismatched, 1e-2f).code() == StatusCode::invalid_argument);

  optim::OptimizerConfig bad = config();
  bad.beta1 = 1.0f;
  DeviceUpdater bad_updater(bad, Rule::adamw);
  HostUpdater bad_host(bad, Rule::adamw);
  CHECK(bad_updater.step(views, 1e-3f) == bad_host.step(host.views(), 1e-3f));

  CHECK(device_updater.steps_taken() == 0);
  check_same_state(host_updater, device_updater);  // only "optimizer.step" = 0
}

TEST_CASE("import_state of a state without moments, and its checks, need no device") {
  HostUpdater host_updater(config(), Rule::adamw);
  DeviceUpdater device_updater(config(), Rule::adamw);
  Tensor step = Tensor::zeros(Shape{1}, DType::i64).value();
  step.data<int64_t>()[0] = 41;
  REQUIRE(host_updater.import_state({{"optimizer.step", step}}).is_ok());
  REQUIRE(device_updater.import_state({{"optimizer.step", step}}).is_ok());
  check_same_state(host_updater, device_updater);
  CHECK(device_updater.steps_taken() == 41);

  const Tensor m = Tensor::zeros(Shape{3}, DType::f32).value();
  const std::vector<OptimizerState> bad = {
      {},                                                    // no step
      {{"optimizer.step", step}, {"optimizer.step", step}},  // twice
      {{"optimizer.step", step}, {"adam.x/p", m}},           // unknown entry
      {{"optimizer.step", step}, {"adam.m/", m}},            // no parameter
      {{"optimizer.step", step}, {"adam.m/p", m}},           // lacks v
      {{"optimizer.step", m}},                               // not an i64
  };
  for (const OptimizerState& state : bad) {
    const Status want = host_updater.import_state(state);
    const Status got = device_updater.import_state(state);
    CHECK(got.code() == StatusCode::invalid_argument);
    CHECK(got == want);
  }
  check_same_state(host_updater, device_updater);
}

}  // namespace
}  // namespace swarm::cuda
