// HostUpdater, the CPU model of ParameterUpdater: the same bits as the AdamW and
// LAMB it wraps, the averaged-gradient path checked for length before anything
// moves, refusals that change nothing, and state that moves between updaters.
#include "swarm/optim/host_updater.h"

#include <cmath>
#include <string>
#include <vector>

#include <doctest/doctest.h>

namespace swarm::optim {
namespace {

struct Params {
  std::vector<Tensor> values, grads;
  std::vector<StageParameterView> views() const {
    std::vector<StageParameterView> out;
    for (size_t i = 0; i < values.size(); ++i) {
      out.push_back({"p" + std::to_string(i), values[i], grads[i], /*apply_weight_decay=*/i != 1});
    }
    return out;
  }
  std::vector<float> flat_values() const {
    std::vector<float> out;
    for (const auto& v : values) out.insert(out.end(), v.data<float>(), v.data<float>() + v.numel());
    return out;
  }
};

// Three tensors of odd sizes, the second without weight decay, filled from `seed`.
Params make_params(uint32_t seed) {
  Params p;
  uint32_t state = seed * 2654435761u + 1u;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / static_cast<float>(1u << 23) - 1.0f;
  };
  for (int64_t n : {37, 5, 130}) {
    Tensor v = *Tensor::empty(Shape{n}, DType::f32), g = *Tensor::empty(Shape{n}, DType::f32);
    for (int64_t i = 0; i < n; ++i) {
      v.data<float>()[i] = next();
      g.data<float>()[i] = 0.1f * next();
    }
    p.values.push_back(std::move(v));
    p.grads.push_back(std::move(g));
  }
  return p;
}

std::vector<ParamRef> refs(const Params& p) {
  std::vector<ParamRef> out;
  for (const auto& view : p.views()) out.push_back({view.name, view.value, view.grad, view.apply_weight_decay});
  return out;
}

std::vector<float> flat_grads(const Params& p) {
  std::vector<float> out;
  for (const auto& g : p.grads) out.insert(out.end(), g.data<float>(), g.data<float>() + g.numel());
  return out;
}

TEST_CASE("step() is AdamW or LAMB bit for bit, over the accumulators") {
  for (Rule rule : {Rule::adamw, Rule::lamb}) {
    Params ours = make_params(1), reference = make_params(1);
    HostUpdater updater(OptimizerConfig{}, rule);
    AdamW adamw{OptimizerConfig{}};
    Lamb lamb{OptimizerConfig{}};
    for (int step = 1; step <= 3; ++step) {
      REQUIRE(updater.step(ours.views(), 0.01f).is_ok());
      auto r = refs(reference);
      REQUIRE((rule == Rule::adamw ? adamw.step(r, 0.01f) : lamb.step(r, 0.01f)).is_ok());
    }
    CHECK(updater.steps_taken() == 3);
    CHECK(ours.flat_values() == reference.flat_values());
    CHECK(ours.flat_values() != make_params(1).flat_values());
  }
}

TEST_CASE("step_with_gradients() takes one host gradient in parameter order, and refuses any other length") {
  Params by_views = make_params(2), by_span = make_params(2);
  HostUpdater a(OptimizerConfig{}, Rule::lamb), b(OptimizerConfig{}, Rule::lamb);
  const std::vector<float> gradient = flat_grads(by_views);
  REQUIRE(a.step(by_views.views(), 0.02f).is_ok());
  REQUIRE(b.step_with_gradients(by_span.views(), gradient, 0.02f).is_ok());
  CHECK(by_views.flat_values() == by_span.flat_values());

  const std::vector<float> before = by_span.flat_values();
  std::vector<float> shorter(gradient.begin(), gradient.end() - 1), longer = gradient;
  longer.push_back(0.0f);
  for (const auto* wrong : {&shorter, &longer}) {
    Status refused = b.step_with_gradients(by_span.views(), *wrong, 0.02f);
    CHECK(refused.code() == StatusCode::invalid_argument);
  }
  CHECK(by_span.flat_values() == before);
  CHECK(b.steps_taken() == 1);
}

TEST_CASE("a non-finite gradient is refused: no weight moves and the step does not count") {
  Params p = make_params(3);
  HostUpdater updater(OptimizerConfig{}, Rule::lamb);
  REQUIRE(updater.step(p.views(), 0.01f).is_ok());
  const std::vector<float> before = p.flat_values();
  auto state_before = *updater.export_state();
  std::vector<float> poisoned = flat_grads(p);
  poisoned[40] = std::nanf("");
  CHECK_FALSE(updater.step_with_gradients(p.views(), poisoned, 0.01f).is_ok());
  CHECK(p.flat_values() == before);
  CHECK(updater.steps_taken() == 1);
  auto state_after = *updater.export_state();
  REQUIRE(state_after.size() == state_before.size());
  for (size_t i = 0; i < state_after.size(); ++i) {
    CHECK(state_after[i].first == state_before[i].first);
    CHECK(bitwise_equal(state_after[i].second, state_before[i].second));
  }
}

TEST_CASE("exported state continues in another updater exactly as in the first") {
  Params first = make_params(4), second = make_params(4);
  HostUpdater a(OptimizerConfig{}, Rule::lamb), b(OptimizerConfig{}, Rule::lamb);
  REQUIRE(a.step(first.views(), 0.01f).is_ok());
  REQUIRE(b.step(second.views(), 0.01f).is_ok());
  HostUpdater resumed(OptimizerConfig{}, Rule::lamb);
  REQUIRE(resumed.import_state(*b.export_state()).is_ok());
  CHECK(resumed.steps_taken() == 1);
  REQUIRE(a.step(first.views(), 0.01f).is_ok());
  REQUIRE(resumed.step(second.views(), 0.01f).is_ok());
  CHECK(first.flat_values() == second.flat_values());
}

}  // namespace
}  // namespace swarm::optim
