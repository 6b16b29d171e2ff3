// A model of two stage types (a layers trunk and a classifier head) served by one
// Peer type through VariantStage, so that a peer can move from the trunk's stage
// to the head's, as rebalancing moves peers, and train there.
#include <chrono>
#include <cmath>
#include <random>

#include <doctest/doctest.h>

#include "kernels/cpu/cpu_backend.h"
#include "swarm/compression/codecs.h"
#include "swarm/layers/layers.h"
#include "swarm/peer/peer.h"
#include "swarm/registry/in_process_registry.h"
#include "swarm/stages/variant_stage.h"
#include "swarm/testing/stage_check.h"
#include "swarm/trainer/trainer.h"
#include "swarm/wiring/stochastic_wiring.h"
#include "transports/inproc/inproc_transport.h"

namespace swarm {
namespace {

namespace L = layers;
using Cpu = L::HostOps<CpuBackend>;
using Trunk = L::Sequential<L::Linear<Cpu>, L::Tanh<Cpu>>;
using Head = L::Sequential<L::Linear<Cpu>, L::SoftmaxCrossEntropy<Cpu>>;
using AnyStage = VariantStage<Trunk, Head>;
using AnyPeer = Peer<AnyStage, InprocTransport, InProcessRegistry, compression::StandardCodecs>;
using SwarmTrainer = Trainer<StochasticWiringRouter, InprocTransport, InProcessRegistry, compression::StandardCodecs>;

static_assert(Stage<AnyStage>);
static_assert(CachingStage<AnyStage>);
static_assert(!BackwardAfterForwardStage<AnyStage>);
// Only stages can be alternatives.
template <typename... T>
concept Holdable = requires { typename VariantStage<T...>; };
static_assert(!Holdable<Trunk, int>);

Result<AnyStage> make_stage(int index) {
  if (index == 0) return AnyStage(*Trunk::create(1, {2, 8}, {}));
  return AnyStage(*Head::create(2, {8, 3}, {}));
}

// Points labelled by the quadrant pair they fall in: class = (x > 0) + (y > 0).
void classes_batch(std::mt19937& rng, Tensor* x, Tensor* y) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  *x = *Tensor::empty(Shape{8, 2}, DType::f32);
  *y = *Tensor::empty(Shape{8}, DType::i32);
  for (int i = 0; i < 8; ++i) {
    const float a = uniform(rng), b = uniform(rng);
    x->data<float>()[2 * i] = a;
    x->data<float>()[2 * i + 1] = b;
    y->data<int32_t>()[i] = (a > 0) + (b > 0);
  }
}

std::unique_ptr<AnyPeer> start_peer(InProcessRegistry* registry, int stage, const std::string& id) {
  PeerConfig config;
  config.stage_index = stage;
  config.num_stages = 2;
  config.peer_id = id;
  config.bind_address = "inproc://" + id;
  config.learning_rate = 1e-2f;
  config.step_every_samples = 16;
  config.announce_period_seconds = 0.05;
  auto peer = std::make_unique<AnyPeer>(config, StageFactory<AnyStage>(make_stage), registry);
  REQUIRE(peer->start().is_ok());
  return peer;
}

TEST_CASE("a variant stage forwards every call to the stage it holds, and passes the checker as either") {
  AnyStage trunk = *make_stage(0), head = *make_stage(1);
  CHECK(trunk.get_if<Trunk>() != nullptr);
  CHECK(head.get_if<Trunk>() == nullptr);
  CHECK(trunk.io_spec().output == TensorSpec{DType::f32, {-1, 8}});
  CHECK(head.takes_targets());
  std::mt19937 rng(3);
  Tensor x, y;
  classes_batch(rng, &x, &y);
  Trunk direct = *Trunk::create(1, {2, 8}, {});
  CHECK(bitwise_equal(*trunk.forward(x, nullptr), *direct.forward(x, nullptr)));
  auto checked = testing::check_stage(trunk, x);
  CHECK_MESSAGE(checked.ok(), checked.to_string());
  const Tensor hidden = *trunk.forward(x, nullptr);
  checked = testing::check_stage(head, hidden, y);
  CHECK_MESSAGE(checked.ok(), checked.to_string());
}

TEST_CASE("a peer of a two-type model moves from the trunk's stage to the head's and serves there") {
  InProcessRegistry registry;
  auto mover = start_peer(&registry, 0, "variant-a");
  auto stays = start_peer(&registry, 0, "variant-b");
  auto head = start_peer(&registry, 1, "variant-c");
  TrainerConfig trainer_config;
  trainer_config.num_stages = 2;
  trainer_config.refresh_period_seconds = 0.05;
  SwarmTrainer trainer(trainer_config, std::vector<StochasticWiringRouter>(2), &registry);
  REQUIRE(trainer.check_stages().is_ok());
  std::mt19937 rng(4);
  Tensor x, y;
  auto train = [&](int microbatches) {
    for (int i = 0; i < microbatches; ++i) {
      classes_batch(rng, &x, &y);
      MicrobatchOutcome outcome = trainer.run_microbatch(x, y);
      REQUIRE_MESSAGE(outcome.completed, outcome.abandon_reason);
    }
  };
  train(20);
  REQUIRE(mover->move_to(1));
  CHECK(mover->stats().stage == 1);
  CHECK(mover->stats().moves == 1);
  // Until the trainer's view has the mover at the head's stage (a registry refresh), with a deadline.
  const auto served = [](const AnyPeer& p) { return p.stats().forward + p.stats().backward; };
  const int64_t served_before = served(*mover);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (served(*mover) == served_before && std::chrono::steady_clock::now() < deadline) train(10);
  CHECK(served(*mover) > served_before);
  CHECK(head->stats().samples > 0);
  CHECK(trainer.ledger().abandoned == 0);
  mover->stop();
  stays->stop();
  head->stop();
}

}  // namespace
}  // namespace swarm
