// The hash stage-mates vouch for covers a replica's whole state: parameters,
// optimizer state and global step. A donor that hands a joiner the vouched
// parameters with moments or a step counter of its own choosing hands over
// another hash, and a replica that loads a state hashes to what its download did.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "models/mlp/mlp_stage.h"
#include "swarm/optim/lr_schedule.h"
#include "swarm/optim/optimizer.h"
#include "swarm/peer/replica.h"
#include "swarm/peer/stage_state.h"

namespace swarm {
namespace {

using Stage = mlp::MlpStage;

Stage make_stage() { return *Stage::create({.in = 4, .out = 8, .gelu = true}, 7); }

// Steps a replica once with a gradient that depends on `salt`.
void step_once(Replica<Stage>& replica, float salt) {
  std::vector<float> averaged(static_cast<size_t>(replica.parameter_count()));
  for (size_t i = 0; i < averaged.size(); ++i) averaged[i] = 0.01f * static_cast<float>(i % 7) - salt;
  const optim::LrSchedule schedule{.peak_lr = 1e-2f};
  REQUIRE(replica.apply_global_step(averaged, schedule).is_ok());
}

NamedTensor& entry(Checkpoint& state, const std::string& name) {
  for (auto& t : state.tensors) {
    if (t.name.starts_with(name)) return t;
  }
  FAIL("no state entry " << name);
  return state.tensors.front();
}

TEST_CASE("a replica's hash is of its whole state, and replicas stepped alike agree") {
  const optim::OptimizerConfig optimizer;
  Replica<Stage> a(0, make_stage(), optimizer), b(0, make_stage(), optimizer);
  CHECK(a.params_hash() == b.params_hash());
  CHECK(a.params_hash() == state_hash(*a.checkpoint()));
  step_once(a, 0.5f);
  step_once(b, 0.5f);
  CHECK(a.step() == 1);
  CHECK(a.params_hash() == b.params_hash());
  CHECK(a.params_hash() == state_hash(*a.checkpoint()));

  Replica<Stage> other(0, make_stage(), optimizer);
  step_once(other, 0.25f);
  CHECK(other.params_hash() != a.params_hash());
}

TEST_CASE("the state hash changes with any moment, the optimizer's step counter, the global step or a parameter") {
  const optim::OptimizerConfig optimizer;
  Replica<Stage> replica(0, make_stage(), optimizer);
  step_once(replica, 0.5f);
  const Checkpoint honest = *replica.checkpoint();
  const uint64_t hash = state_hash(honest);

  const auto forged = [&](auto&& change) {
    Checkpoint copy = honest;
    for (auto& t : copy.tensors) t.tensor = *Tensor::copy_of(t.tensor.view(), Device::cpu);
    change(copy);
    return state_hash(copy);
  };
  const std::string first = std::string(kOptimizerPrefix) + std::string(optim::kFirstMomentPrefix);
  const std::string second = std::string(kOptimizerPrefix) + std::string(optim::kSecondMomentPrefix);
  const std::string counter = std::string(kOptimizerPrefix) + std::string(optim::kStepStateName);
  CHECK(forged([&](Checkpoint& c) { entry(c, first).tensor.data<float>()[0] *= 1e6f; }) != hash);
  CHECK(forged([&](Checkpoint& c) { float& v = entry(c, second).tensor.data<float>()[1];
    v = std::nextafter(v, 1.0f);
  }) != hash);
  CHECK(forged([&](Checkpoint& c) { entry(c, counter).tensor.data<int64_t>()[0] = 1'000'000'000; }) != hash);
  CHECK(forged([&](Checkpoint& c) { c.step += 1; }) != hash);
  CHECK(forged([&](Checkpoint& c) { entry(c, std::string(kParamPrefix)).tensor.data<float>()[0] += 1.0f; }) != hash);
  // The order the tensors travel in is not the state.
  CHECK(forged([](Checkpoint& c) { std::reverse(c.tensors.begin(), c.tensors.end()); }) == hash);
}

TEST_CASE("a replica that loads a state hashes to the state's hash") {
  const optim::OptimizerConfig optimizer;
  Replica<Stage> donor(0, make_stage(), optimizer);
  step_once(donor, 0.5f);
  step_once(donor, 0.125f);
  const Checkpoint state = *donor.checkpoint();
  Replica<Stage> joiner(0, make_stage(), optimizer);
  REQUIRE(joiner.load(state).is_ok());
  CHECK(joiner.step() == 2);
  CHECK(joiner.params_hash() == state_hash(state));
  CHECK(joiner.params_hash() == donor.params_hash());
}

}  // namespace
}  // namespace swarm
