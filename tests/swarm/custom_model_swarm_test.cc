// Bring your own model: a 2-stage MLP regression (models/mlp), written only
// against the Stage concept, trained by the same Peer and Trainer templates
// that serve GPT, over the in-process transport and over real ZeroMQ sockets.
#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <random>

#include <doctest/doctest.h>

#include "models/mlp/mlp_stage.h"
#include "swarm/compression/codecs.h"
#include "swarm/peer/peer.h"
#include "swarm/registry/in_process_registry.h"
#include "swarm/trainer/trainer.h"
#include "swarm/wiring/stochastic_wiring.h"
#include "transports/inproc/inproc_transport.h"
#include "transports/netem/netem_transport.h"
#include "transports/zmq/zmq_transport.h"

namespace swarm {
namespace {

using mlp::MlpStage;

// y = sin(x0) + 0.5 * x1 * x2 - x3, a smooth target a small MLP can fit.
void regression_batch(std::mt19937& rng, int batch, Tensor* x, Tensor* y) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  *x = *Tensor::empty(Shape{batch, 4}, DType::f32);
  *y = *Tensor::empty(Shape{batch, 1}, DType::f32);
  for (int b = 0; b < batch; ++b) {
    float* row = x->data<float>() + b * 4;
    for (int i = 0; i < 4; ++i) row[i] = uniform(rng);
    y->data<float>()[b] = std::sin(row[0]) + 0.5f * row[1] * row[2] - row[3];
  }
}

template <Transport T>
void train_mlp_swarm(const std::string& first_address, const std::string& second_address) {
  InProcessRegistry registry;
  PeerConfig first_config;
  first_config.stage_index = 0;
  first_config.peer_id = "mlp-0";
  first_config.bind_address = first_address;
  first_config.learning_rate = 1e-2f;
  first_config.step_every_samples = 32;
  first_config.optimizer.weight_decay = 0;
  PeerConfig second_config = first_config;
  second_config.stage_index = 1;
  second_config.peer_id = "mlp-1";
  second_config.bind_address = second_address;

  Peer<MlpStage, T, InProcessRegistry, compression::StandardCodecs> first(first_config, *MlpStage::create({.in = 4, .out = 32, .gelu = true}, 1),
                                             &registry);
  Peer<MlpStage, T, InProcessRegistry, compression::StandardCodecs> second(second_config, *MlpStage::create({.in = 32, .out = 1, .loss = true}, 2),
                                              &registry);
  REQUIRE(first.start().is_ok());
  REQUIRE(second.start().is_ok());

  TrainerConfig trainer_config;
  trainer_config.num_stages = 2;
  std::vector<StochasticWiringRouter> routers(2);
  Trainer<StochasticWiringRouter, T, InProcessRegistry, compression::StandardCodecs> trainer(trainer_config, std::move(routers), &registry);

  std::mt19937 rng(3);
  Tensor x, y;
  double first_losses = 0, last_losses = 0;
  constexpr int kMicrobatches = 400;
  for (int i = 0; i < kMicrobatches; ++i) {
    regression_batch(rng, 32, &x, &y);
    MicrobatchOutcome outcome = trainer.run_microbatch(x, y);
    REQUIRE_MESSAGE(outcome.completed, outcome.abandon_reason);
    if (i < 20) first_losses += outcome.loss;
    if (i >= kMicrobatches - 20) last_losses += outcome.loss;
  }
  MESSAGE("MLP loss: first 20 microbatches " << first_losses / 20 << ", last 20 " << last_losses / 20);
  CHECK(last_losses < first_losses * 0.25);
  Ledger ledger = trainer.ledger();
  CHECK(ledger.started == kMicrobatches);
  CHECK(ledger.completed == kMicrobatches);
  CHECK(ledger.abandoned == 0);
  CHECK(first.stats().backward == kMicrobatches);
  CHECK(second.stats().optimizer_steps == kMicrobatches * 32 / 32);
  first.stop();
  second.stop();
}

TEST_CASE("a user-defined MLP stage trains through Peer and Trainer over the in-process transport") {
  train_mlp_swarm<InprocTransport>("inproc://mlp-stage-0", "inproc://mlp-stage-1");
}

TEST_CASE("the same MLP swarm trains over ZeroMQ on loopback") {
  train_mlp_swarm<ZmqTransport>("tcp://127.0.0.1:*", "tcp://127.0.0.1:*");
}

// Two MLP peers, stage 0 (4 -> hidden, GELU) and the loss stage (second_in -> 1),
// started over transport T; second_in other than hidden breaks the chain.
template <Transport T>
struct TwoPeers {
  using MlpPeer = Peer<MlpStage, T, InProcessRegistry, compression::StandardCodecs>;
  InProcessRegistry registry;
  std::unique_ptr<MlpPeer> first, second;

  TwoPeers(const std::string& name, int hidden, int second_in) {
    PeerConfig config;
    config.peer_id = name + "-0";
    config.bind_address = "inproc://" + config.peer_id;
    first = std::make_unique<MlpPeer>(config, *MlpStage::create({.in = 4, .out = hidden, .gelu = true}, 1), &registry);
    config.stage_index = 1;
    config.peer_id = name + "-1";
    config.bind_address = "inproc://" + config.peer_id;
    second = std::make_unique<MlpPeer>(config, *MlpStage::create({.in = second_in, .out = 1, .loss = true}, 2),
                                       &registry);
    REQUIRE(first->start().is_ok());
    REQUIRE(second->start().is_ok());
  }
  ~TwoPeers() {
    first->stop();
    second->stop();
  }
};

// A trainer over the emulator by type swap takes its link from its config: the
// same run, with and without a 20 ms link, side by side.
TEST_CASE("a trainer swapped onto NetemTransport runs over the link its config names") {
  using Slow = NetemTransport<InprocTransport>;
  TwoPeers<Slow> peers("link", 32, 32);
  auto seconds_per_microbatch = [&](std::optional<EmulatedLink> link) {
    TrainerConfig trainer_config;
    trainer_config.num_stages = 2;
    trainer_config.client.link = link;
    Trainer<StochasticWiringRouter, Slow, InProcessRegistry, compression::StandardCodecs> trainer(
        trainer_config, std::vector<StochasticWiringRouter>(2), &peers.registry);
    std::mt19937 rng(4);
    Tensor x, y;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 5; ++i) {
      regression_batch(rng, 8, &x, &y);
      MicrobatchOutcome outcome = trainer.run_microbatch(x, y);
      REQUIRE_MESSAGE(outcome.completed, outcome.abandon_reason);
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / 5;
  };
  const double perfect = seconds_per_microbatch(std::nullopt);
  const double slow = seconds_per_microbatch(*netem::parse_link("0,20ms"));
  MESSAGE("seconds per microbatch: " << perfect << " on a perfect link, " << slow << " on 20 ms links");
  // Three calls (forward at stage 0; forward and backward at the loss stage; backward
  // at stage 0), each crossing the link both ways: at least 120 ms.
  CHECK(slow >= 0.12);
  CHECK(slow > 5 * perfect);
}

TEST_CASE("a trainer refuses stages whose shapes do not chain, naming both, before any microbatch") {
  TwoPeers<InprocTransport> peers("chain", 32, 16);  // the first returns 32 features; the second takes 16
  TrainerConfig trainer_config;
  trainer_config.num_stages = 2;
  Trainer<StochasticWiringRouter, InprocTransport, InProcessRegistry, compression::StandardCodecs> trainer(
      trainer_config, std::vector<StochasticWiringRouter>(2), &peers.registry);
  const Status checked = trainer.check_stages();
  CHECK(checked.code() == StatusCode::failed_precondition);
  CHECK_MESSAGE(checked.message().find("stage 0 returns f32 [-1, 32] but stage 1 takes f32 [-1, 16]") !=
                    std::string::npos,
                checked.message());
  CHECK(peers.first->stats().forward == 0);
}

}  // namespace
}  // namespace swarm
