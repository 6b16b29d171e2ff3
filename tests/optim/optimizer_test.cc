#include "swarm/optim/optimizer.h"

#include <omp.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "swarm/core/dtype.h"
#include "swarm/optim/lr_schedule.h"

namespace swarm::optim {
namespace {

using State = std::vector<std::pair<std::string, Tensor>>;

Tensor make(const std::vector<float>& values, Shape shape) {
  Tensor t = Tensor::zeros(shape, DType::f32).value();
  REQUIRE(static_cast<int64_t>(values.size()) == t.numel());
  std::copy(values.begin(), values.end(), t.data<float>());
  return t;
}
Tensor make(const std::vector<float>& values) {
  return make(values, Shape{static_cast<int64_t>(values.size())});
}

// Deterministic values in [-1, 1), so tests do not depend on a library's RNG.
std::vector<float> uniform(int64_t n, uint32_t seed) {
  std::vector<float> out(static_cast<size_t>(n));
  uint32_t state = seed * 2654435761u + 1u;
  for (float& x : out) {
    state = state * 1664525u + 1013904223u;
    x = static_cast<float>(state >> 8) / static_cast<float>(1u << 23) - 1.0f;
  }
  return out;
}

double norm(const std::vector<float>& x) {
  double sum = 0.0;
  for (float v : x) sum += static_cast<double>(v) * v;
  return std::sqrt(sum);
}

std::vector<float> values_of(const TensorView& t) {
  auto span = t.span<float>();
  return {span.begin(), span.end()};
}

const Tensor* find(const State& state, std::string_view name) {
  for (const auto& [entry, tensor] : state) {
    if (entry == name) return &tensor;
  }
  return nullptr;
}

bool same_state(const State& a, const State& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].first != b[i].first || !bitwise_equal(a[i].second, b[i].second)) return false;
  }
  return true;
}

OptimizerConfig no_clip() {
  OptimizerConfig config;
  config.clip_norm = 0.0f;
  return config;
}

TEST_CASE("AdamW matches two hand-computed steps on f(w) = (w - 3)^2 / 2") {
  // beta1 0.9, beta2 0.95, eps 1e-6, wd 0.01, lr 0.1, no clipping, w0 = 1, grad = w - 3.
  Tensor w = make({1.0f});
  Tensor g = make({0.0f});
  AdamW adam(no_clip());
  std::vector<ParamRef> params{{"w", w, g, true}};

  // Step 1: g = -2, m = -0.2, v = 0.2, m_hat = -2, v_hat = 4, u = -2 / (2 + 1e-6) = -0.9999995,
  // w1 = 1 - 0.1 * (-0.9999995 + 0.01 * 1) = 1.09899995.
  g.data<float>()[0] = w.data<float>()[0] - 3.0f;
  REQUIRE(adam.step(params, 0.1f).is_ok());
  CHECK(std::abs(w.data<float>()[0] - 1.09899995) <= 1e-6);

  // Step 2: g = -1.90100005, m = 0.9 * -0.2 + 0.1 * g = -0.37010000,
  // v = 0.95 * 0.2 + 0.05 * g^2 = 0.37069006, m_hat = m / 0.19 = -1.94789476,
  // v_hat = v / 0.0975 = 3.80194933, u = m_hat / (1.94985880 + 1e-6) = -0.99899222,
  // w2 = 1.09899995 - 0.1 * (-0.99899222 + 0.01 * 1.09899995) = 1.19780017.
  g.data<float>()[0] = w.data<float>()[0] - 3.0f;
  REQUIRE(adam.step(params, 0.1f).is_ok());
  CHECK(std::abs(w.data<float>()[0] - 1.19780017) <= 1e-6);
  CHECK(adam.steps_taken() == 2);

  State state = adam.export_state();
  REQUIRE(find(state, "adam.m/w") != nullptr);
  REQUIRE(find(state, "adam.v/w") != nullptr);
  CHECK(std::abs(find(state, "adam.m/w")->data<float>()[0] - -0.37010000) <= 1e-6);
  CHECK(std::abs(find(state, "adam.v/w")->data<float>()[0] - 0.37069006) <= 1e-6);
  REQUIRE(find(state, "optimizer.step") != nullptr);
  CHECK(find(state, "optimizer.step")->dtype() == DType::i64);
  CHECK(find(state, "optimizer.step")->data<int64_t>()[0] == 2);
}

// y = X w* + c*; loss = mean((X w + c - y)^2); w has weight decay, the bias c does not.
struct LeastSquares {
  static constexpr int64_t kRows = 32;
  static constexpr int64_t kCols = 4;
  std::vector<float> x = uniform(kRows * kCols, 7);
  std::vector<float> y;
  Tensor w = make(std::vector<float>(kCols, 0.0f));
  Tensor c = make({0.0f});
  Tensor dw = make(std::vector<float>(kCols, 0.0f));
  Tensor dc = make({0.0f});

  LeastSquares() {
    const float w_star[kCols] = {0.5f, -1.0f, 2.0f, 0.25f};
    for (int64_t r = 0; r < kRows; ++r) {
      float sum = 0.3f;
      for (int64_t k = 0; k < kCols; ++k) sum += x[r * kCols + k] * w_star[k];
      y.push_back(sum);
    }
  }

  std::vector<ParamRef> params() { return {{"w", w, dw, true}, {"c", c, dc, false}}; }

  // Returns the loss and leaves its gradient in dw, dc.
  double loss_and_grad() {
    const float* wv = w.data<float>();
    std::fill_n(dw.data<float>(), kCols, 0.0f);
    dc.data<float>()[0] = 0.0f;
    double loss = 0.0;
    for (int64_t r = 0; r < kRows; ++r) {
      float pred = c.data<float>()[0];
      for (int64_t k = 0; k < kCols; ++k) pred += x[r * kCols + k] * wv[k];
      const float residual = pred - y[static_cast<size_t>(r)];
      loss += static_cast<double>(residual) * residual / kRows;
      for (int64_t k = 0; k < kCols; ++k) dw.data<float>()[k] += 2.0f * residual * x[r * kCols + k] / kRows;
      dc.data<float>()[0] += 2.0f * residual / kRows;
    }
    return loss;
  }
};

TEST_CASE_TEMPLATE("the optimizer solves a small least-squares problem", Optimizer, AdamW, Lamb) {
  LeastSquares problem;
  Optimizer optimizer{OptimizerConfig{}};
  const LrSchedule schedule{.peak_lr = 0.05f, .warmup_steps = 20, .total_steps = 500,
                            .final_lr_fraction = 0.01f};
  REQUIRE(schedule.validate().is_ok());
  const double initial = problem.loss_and_grad();
  double loss = initial;
  for (int step = 1; step <= 500; ++step) {
    REQUIRE(optimizer.step(problem.params(), schedule.lr_at(step)).is_ok());
    loss = problem.loss_and_grad();
  }
  MESSAGE("loss ", initial, " -> ", loss);
  CHECK(loss < initial / 100.0);
  CHECK(optimizer.steps_taken() == 500);
}

TEST_CASE_TEMPLATE("weight decay shrinks only params that ask for it", Optimizer, AdamW, Lamb) {
  OptimizerConfig config;
  config.weight_decay = 0.5f;
  Optimizer optimizer{config};
  Tensor decayed = make({1.0f, -2.0f, 4.0f});
  Tensor kept = make({1.0f, -2.0f, 4.0f});
  Tensor zero_grad = make({0.0f, 0.0f, 0.0f});
  Tensor zero_grad2 = make({0.0f, 0.0f, 0.0f});
  std::vector<ParamRef> params{{"decayed", decayed, zero_grad, true}, {"kept", kept, zero_grad2, false}};
  REQUIRE(optimizer.step(params, 0.1f).is_ok());

  CHECK(values_of(kept) == std::vector<float>{1.0f, -2.0f, 4.0f});
  // With zero moments the whole update is the decay term. AdamW: w * (1 - lr * wd).
  // LAMB: u = wd * w has trust ratio 1 / wd, so w * (1 - lr).
  const float factor = std::is_same_v<Optimizer, AdamW> ? 1.0f - 0.1f * 0.5f : 1.0f - 0.1f;
  const std::vector<float> after = values_of(decayed);
  CHECK(after[0] == doctest::Approx(1.0f * factor).scale(0));
  CHECK(after[1] == doctest::Approx(-2.0f * factor).scale(0));
  CHECK(after[2] == doctest::Approx(4.0f * factor).scale(0));
}

TEST_CASE("global_grad_norm is the L2 norm over every gradient") {
  Tensor w1 = make({0.0f, 0.0f});
  Tensor w2 = make({0.0f});
  Tensor g1 = make({3.0f, 4.0f});
  Tensor g2 = make({12.0f});
  std::vector<ParamRef> params{{"a", w1, g1, true}, {"b", w2, g2, true}};
  CHECK(global_grad_norm(params) == 13.0f);
  CHECK(global_grad_norm({}) == 0.0f);

  Tensor half = Tensor::zeros(Shape{2}, DType::bf16).value();
  std::vector<ParamRef> wrong{{"a", w1, half, true}};
  CHECK(std::isnan(global_grad_norm(wrong)));
}

TEST_CASE("clipping scales the gradient that enters the moments, and only above clip_norm") {
  // Adam's direction is scale-invariant, so the clip shows in the first moment: m = 0.1 * g * c.
  const std::vector<float> g1_values{3000.0f, -4000.0f};
  const std::vector<float> g2_values{12000.0f};
  Tensor w1 = make({1.0f, 1.0f});
  Tensor w2 = make({1.0f});
  Tensor g1 = make(g1_values);
  Tensor g2 = make(g2_values);
  std::vector<ParamRef> params{{"a", w1, g1, true}, {"b", w2, g2, false}};
  const float norm = global_grad_norm(params);
  CHECK(norm == 13000.0f);

  AdamW clipped{OptimizerConfig{}};  // clip_norm 1
  REQUIRE(clipped.step(params, 1e-3f).is_ok());
  const State state = clipped.export_state();
  const double coefficient = 1.0 / (13000.0 + 1e-6);
  const float* m1 = find(state, "adam.m/a")->data<float>();
  const float* v1 = find(state, "adam.v/a")->data<float>();
  const float* m2 = find(state, "adam.m/b")->data<float>();
  CHECK(m1[0] == doctest::Approx(0.1 * 3000.0 * coefficient).epsilon(1e-6).scale(0));
  CHECK(m1[1] == doctest::Approx(0.1 * -4000.0 * coefficient).epsilon(1e-6).scale(0));
  CHECK(m2[0] == doctest::Approx(0.1 * 12000.0 * coefficient).epsilon(1e-6).scale(0));
  CHECK(v1[1] == doctest::Approx(0.05 * std::pow(4000.0 * coefficient, 2)).epsilon(1e-5).scale(0));
  // The clipped moments have norm clip_norm * (1 - beta1).
  CHECK(std::sqrt(m1[0] * m1[0] + m1[1] * m1[1] + m2[0] * m2[0]) == doctest::Approx(0.1).epsilon(1e-6).scale(0));
  // The caller's gradients are not rewritten.
  CHECK(values_of(g1) == g1_values);
  CHECK(values_of(g2) == g2_values);

  // Disabled clipping, or a norm under the limit: the gradient goes in unscaled.
  AdamW unclipped{no_clip()};
  REQUIRE(unclipped.step(params, 1e-3f).is_ok());
  CHECK(find(unclipped.export_state(), "adam.m/a")->data<float>()[1] == (1.0f - 0.9f) * -4000.0f);
  Tensor small = make({0.3f, -0.4f});
  Tensor w3 = make({1.0f, 1.0f});
  std::vector<ParamRef> below{{"a", w3, small, true}};
  AdamW under{OptimizerConfig{}};
  REQUIRE(under.step(below, 1e-3f).is_ok());
  CHECK(find(under.export_state(), "adam.m/a")->data<float>()[1] == (1.0f - 0.9f) * -0.4f);
}

TEST_CASE("LAMB moves each tensor by lr * ||w|| whatever the gradient scale") {
  OptimizerConfig config = no_clip();
  config.weight_decay = 0.0f;
  const std::vector<float> w_values = uniform(64, 1);
  const std::vector<float> g_values = uniform(64, 2);
  const float lr = 0.01f;

  std::vector<std::vector<float>> deltas;
  for (float scale : {1.0f, 100.0f}) {
    Tensor w = make(w_values);
    std::vector<float> scaled = g_values;
    for (float& x : scaled) x *= scale;
    Tensor g = make(scaled);
    Lamb lamb(config);
    std::vector<ParamRef> params{{"w", w, g, true}};
    REQUIRE(lamb.step(params, lr).is_ok());
    std::vector<float> delta = values_of(w);
    for (size_t i = 0; i < delta.size(); ++i) delta[i] -= w_values[i];
    // ||u|| is about sqrt(64) = 8 and ||w|| about 4.6: the ratio applies, unclamped.
    CHECK(norm(delta) == doctest::Approx(lr * norm(w_values)).epsilon(1e-4).scale(0));
    deltas.push_back(delta);
  }
  for (size_t i = 0; i < deltas[0].size(); ++i) {
    CHECK(deltas[0][i] == doctest::Approx(deltas[1][i]).epsilon(1e-4).scale(0));
  }
}

TEST_CASE_TEMPLATE("exported state lets a second optimizer continue bit-identically", Optimizer, AdamW, Lamb) {
  const int64_t n = 100;
  Tensor wa = make(uniform(n, 3));
  Tensor ba = make(uniform(4, 4));
  Tensor gw = make(std::vector<float>(n, 0.0f));
  Tensor gb = make(std::vector<float>(4, 0.0f));
  auto set_grads = [&](int step) {
    auto w_grad = uniform(n, 100 + step);
    auto b_grad = uniform(4, 200 + step);
    std::copy(w_grad.begin(), w_grad.end(), gw.data<float>());
    std::copy(b_grad.begin(), b_grad.end(), gb.data<float>());
  };
  Optimizer first{OptimizerConfig{}};
  std::vector<ParamRef> params_a{{"h.0.weight", wa, gw, true}, {"h.0.bias", ba, gb, false}};
  for (int step = 0; step < 3; ++step) {
    set_grads(step);
    REQUIRE(first.step(params_a, 1e-2f).is_ok());
  }

  const State saved = first.export_state();
  CHECK(saved.size() == 5);
  CHECK(find(saved, "optimizer.step")->data<int64_t>()[0] == 3);
  Optimizer second{OptimizerConfig{}};
  REQUIRE(second.import_state(saved).is_ok());
  CHECK(second.steps_taken() == 3);
  CHECK(same_state(second.export_state(), saved));

  Tensor wb = wa.clone();
  Tensor bb = ba.clone();
  std::vector<ParamRef> params_b{{"h.0.weight", wb, gw, true}, {"h.0.bias", bb, gb, false}};
  for (int step = 3; step < 6; ++step) {
    set_grads(step);
    REQUIRE(first.step(params_a, 1e-2f).is_ok());
    REQUIRE(second.step(params_b, 1e-2f).is_ok());
  }
  CHECK(bitwise_equal(wa, wb));
  CHECK(bitwise_equal(ba, bb));
  CHECK(same_state(first.export_state(), second.export_state()));

  // The export is a copy: scribbling on it does not reach the optimizer.
  State scratch = first.export_state();
  find(scratch, "adam.m/h.0.weight")->data<float>()[0] = 123.0f;
  const State fresh = first.export_state();
  CHECK(find(fresh, "adam.m/h.0.weight")->data<float>()[0] != 123.0f);
}

TEST_CASE("import_state rejects malformed state and keeps the old one") {
  Tensor w = make({1.0f, 2.0f});
  Tensor g = make({0.5f, -0.5f});
  AdamW adam{OptimizerConfig{}};
  std::vector<ParamRef> params{{"w", w, g, true}};
  REQUIRE(adam.step(params, 1e-3f).is_ok());
  const State good = adam.export_state();

  auto with = [&](std::string_view name, Tensor replacement) {
    State state;
    for (const auto& [entry, tensor] : good) state.emplace_back(entry, entry == name ? replacement : tensor.clone());
    return state;
  };
  auto without = [&](std::string_view name) {
    State state;
    for (const auto& [entry, tensor] : good) {
      if (entry != name) state.emplace_back(entry, tensor);
    }
    return state;
  };
  Tensor step_i32 = Tensor::zeros(Shape{1}, DType::i32).value();
  Tensor negative_step = Tensor::zeros(Shape{1}, DType::i64).value();
  negative_step.data<int64_t>()[0] = -1;
  State unknown = good;
  unknown.emplace_back("adam.z/w", make({0.0f, 0.0f}));
  State duplicated = good;
  duplicated.emplace_back("adam.m/w", make({0.0f, 0.0f}));
  State nameless = good;
  nameless.emplace_back("adam.m/", make({0.0f}));

  const std::vector<State> bad{
      without("optimizer.step"),
      without("adam.v/w"),
      with("optimizer.step", step_i32),
      with("optimizer.step", negative_step),
      with("adam.m/w", make({0.0f, 0.0f, 0.0f})),                        // m and v shapes differ
      with("adam.v/w", make({-1.0f, 0.0f})),                             // negative second moment
      with("adam.m/w", make({std::numeric_limits<float>::quiet_NaN(), 0.0f})),
      with("adam.m/w", Tensor::zeros(Shape{2}, DType::bf16).value()),
      with("adam.m/w", Tensor()),
      unknown,
      duplicated,
      nameless,
  };
  for (const State& state : bad) {
    CHECK(adam.import_state(state).code() == StatusCode::invalid_argument);
    CHECK(adam.steps_taken() == 1);
    CHECK(same_state(adam.export_state(), good));
  }
  CHECK(adam.import_state(good).is_ok());
}

TEST_CASE_TEMPLATE("bad params are invalid_argument and change nothing", Optimizer, AdamW, Lamb) {
  Optimizer optimizer{OptimizerConfig{}};
  Tensor w = make({1.0f, 2.0f, 3.0f});
  Tensor g = make({0.1f, 0.2f, 0.3f});
  const std::vector<float> before = values_of(w);
  auto rejected = [&](std::vector<ParamRef> params, float lr = 1e-3f) {
    const Status status = optimizer.step(params, lr);
    return status.code() == StatusCode::invalid_argument;
  };

  Tensor g4 = make({0.1f, 0.2f, 0.3f, 0.4f});
  CHECK(rejected({{"w", w, g4, true}}));                                          // shapes differ
  Tensor g2d = make({0.1f, 0.2f, 0.3f}, Shape{3, 1});
  CHECK(rejected({{"w", w, g2d, true}}));                                         // same numel, other shape
  Tensor g_bf16 = Tensor::zeros(Shape{3}, DType::bf16).value();
  CHECK(rejected({{"w", w, g_bf16, true}}));                                      // dtype
  CHECK(rejected({{"w", w, g, true}, {"w", w, g, true}}));                        // duplicate name
  CHECK(rejected({{"", w, g, true}}));                                            // no name
  CHECK(rejected({{"w", w, g, true}}, -1e-3f));                                   // negative lr
  CHECK(rejected({{"w", w, g, true}}, std::numeric_limits<float>::quiet_NaN()));  // NaN lr
  CHECK(values_of(w) == before);
  CHECK(optimizer.steps_taken() == 0);
  CHECK(optimizer.export_state().size() == 1);  // just the step: no moments were created

  OptimizerConfig bad_config;
  bad_config.beta1 = 1.0f;
  Optimizer misconfigured{bad_config};
  std::vector<ParamRef> good{{"w", w, g, true}};
  CHECK(misconfigured.step(good, 1e-3f).code() == StatusCode::invalid_argument);

  // Once the state exists, a param with the same name must keep its shape.
  REQUIRE(optimizer.step(good, 1e-3f).is_ok());
  const std::vector<float> after_step = values_of(w);
  const State state = optimizer.export_state();
  Tensor w4 = make({1.0f, 2.0f, 3.0f, 4.0f});
  Tensor other = make({9.0f});
  Tensor other_grad = make({1.0f});
  CHECK(rejected({{"other", other, other_grad, true}, {"w", w4, g4, true}}));
  CHECK(values_of(other) == std::vector<float>{9.0f});  // an earlier, valid param is untouched too
  CHECK(values_of(w4) == std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f});
  CHECK(values_of(w) == after_step);
  CHECK(same_state(optimizer.export_state(), state));
}

TEST_CASE_TEMPLATE("a non-finite gradient is an error and leaves weights and state alone", Optimizer,
                   AdamW, Lamb) {
  Optimizer optimizer{OptimizerConfig{}};
  Tensor w = make({1.0f, 2.0f});
  Tensor g = make({0.1f, 0.2f});
  Tensor w2 = make({5.0f});
  Tensor g2 = make({0.3f});
  std::vector<ParamRef> params{{"w", w, g, true}, {"w2", w2, g2, false}};
  REQUIRE(optimizer.step(params, 1e-2f).is_ok());
  const std::vector<float> w_before = values_of(w);
  const std::vector<float> w2_before = values_of(w2);
  const State state_before = optimizer.export_state();

  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    g2.data<float>()[0] = bad;  // in the second param, after the first one could have been updated
    const Status status = optimizer.step(params, 1e-2f);
    CHECK_FALSE(status.is_ok());
    CHECK(status.message().find("w2") != std::string::npos);
    CHECK(values_of(w) == w_before);
    CHECK(values_of(w2) == w2_before);
    CHECK(optimizer.steps_taken() == 1);
    CHECK(same_state(optimizer.export_state(), state_before));
  }
}

TEST_CASE_TEMPLATE("large tensors update the same on any number of threads", Optimizer, AdamW, Lamb) {
  // Above the parallel threshold and several norm chunks long.
  const int64_t n = 300'000;
  const std::vector<float> w_values = uniform(n, 11);
  const std::vector<float> g_values = uniform(n, 12);
  const int saved_threads = omp_get_max_threads();
  std::vector<Tensor> results;
  std::vector<State> states;
  std::vector<float> norms;
  for (int threads : {1, 3}) {
    omp_set_num_threads(threads);
    Tensor w = make(w_values);
    Tensor g = make(g_values);
    Optimizer optimizer{OptimizerConfig{}};
    std::vector<ParamRef> params{{"w", w, g, true}};
    norms.push_back(global_grad_norm(params));
    REQUIRE(optimizer.step(params, 1e-2f).is_ok());
    REQUIRE(optimizer.step(params, 1e-2f).is_ok());
    results.push_back(w);
    states.push_back(optimizer.export_state());
  }
  omp_set_num_threads(saved_threads);
  CHECK(std::bit_cast<uint32_t>(norms[0]) == std::bit_cast<uint32_t>(norms[1]));
  CHECK(norms[0] == doctest::Approx(norm(g_values)));
  CHECK(bitwise_equal(results[0], results[1]));
  CHECK(same_state(states[0], states[1]));
  CHECK_FALSE(bitwise_equal(results[0], make(w_values)));  // something did move
}

}  // namespace
}  // namespace swarm::optim
