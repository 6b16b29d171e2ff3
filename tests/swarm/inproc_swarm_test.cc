// GPT stages served by Peers and driven by a Trainer in one process: a trainer
// whose codecs differ from the stages' is refused before training; the
// stochastic wiring sends a 2x faster peer 2/3 of the work, a peer that dies
// mid-run costs retries but no microbatch, and the model learns.
#include <cmath>
#include <random>

#include <doctest/doctest.h>

#include "kernels/cpu/cpu_backend.h"
#include "models/gpt/gpt_stage.h"
#include "tests/swarm/tiny_gpt.h"
#include "swarm/compression/codecs.h"
#include "swarm/peer/peer.h"
#include "swarm/registry/in_process_registry.h"
#include "swarm/trainer/trainer.h"
#include "swarm/wiring/baseline_routers.h"
#include "swarm/wiring/stochastic_wiring.h"
#include "transports/inproc/inproc_transport.h"

namespace swarm {
namespace {

using Stage = gpt::GptStage<CpuBackend>;
using GptPeer = Peer<Stage, InprocTransport, InProcessRegistry, compression::StandardCodecs>;

gpt::GptConfig tiny_config() { return testing::tiny_gpt_config(); }

std::unique_ptr<GptPeer> make_peer(InProcessRegistry* registry, int stage, const std::string& id, double slowdown,
                                   double emulated_seconds_per_sample) {
  auto layouts = *gpt::partition_layers(tiny_config(), 2);
  PeerConfig config;
  config.stage_index = stage;
  config.peer_id = id;
  config.bind_address = "inproc://" + id;
  config.slowdown = slowdown;
  config.emulated_seconds_per_sample = emulated_seconds_per_sample;
  config.learning_rate = 3e-3f;
  config.step_every_samples = 8;
  config.announce_period_seconds = 0.05;
  auto peer = std::make_unique<GptPeer>(config, *Stage::create(tiny_config(), layouts[stage], 7), registry);
  REQUIRE(peer->start().is_ok());
  return peer;
}

// A repeating token pattern the model can learn quickly.
void pattern_batch(std::mt19937& rng, int batch, Tensor* tokens, Tensor* targets) {
  const int T = tiny_config().max_seq_len;
  *tokens = *Tensor::empty(Shape{batch, T}, DType::i32);
  *targets = *Tensor::empty(Shape{batch, T}, DType::i32);
  for (int b = 0; b < batch; ++b) {
    const int offset = static_cast<int>(rng() % 8);
    for (int t = 0; t < T; ++t) {
      tokens->data<int32_t>()[b * T + t] = (offset + t) % 8;
      targets->data<int32_t>()[b * T + t] = (offset + t + 1) % 8;
    }
  }
}

template <typename Router>
std::map<std::string, ServedCounts> run_two_speed(int microbatches) {
  InProcessRegistry registry;
  auto fast = make_peer(&registry, 0, "fast-" + std::to_string(sizeof(Router)), 1.0, 0.004);
  auto slow = make_peer(&registry, 0, "slow-" + std::to_string(sizeof(Router)), 2.0, 0.004);
  auto last = make_peer(&registry, 1, "last-" + std::to_string(sizeof(Router)), 1.0, 0.0);
  TrainerConfig config;
  std::vector<Router> routers(2);
  Trainer<Router, InprocTransport, InProcessRegistry, compression::StandardCodecs> trainer(config, std::move(routers), &registry);
  std::mt19937 rng(5);
  Tensor tokens, targets;
  for (int i = 0; i < microbatches; ++i) {
    pattern_batch(rng, 2, &tokens, &targets);
    auto outcome = trainer.run_microbatch(tokens, targets);
    REQUIRE_MESSAGE(outcome.completed, outcome.abandon_reason);
  }
  CHECK(trainer.ledger().abandoned == 0);
  auto served = trainer.served();
  std::map<std::string, ServedCounts> by_role;
  for (auto& [peer, counts] : served) by_role[peer.substr(0, peer.find('-'))] = counts;
  return by_role;
}

TEST_CASE("a trainer asks each stage for its spec, and a codec mismatch is one clear error before training") {
  InProcessRegistry registry;
  auto first = make_peer(&registry, 0, "info-0", 1.0, 0.0);
  auto last = make_peer(&registry, 1, "info-1", 1.0, 0.0);
  using RrTrainer = Trainer<RoundRobinRouter, InprocTransport, InProcessRegistry, compression::StandardCodecs>;
  TrainerConfig config;  // 8bit, as the peers
  RrTrainer matching(config, std::vector<RoundRobinRouter>(2), &registry);
  auto spec = matching.stage_spec(0);
  REQUIRE_MESSAGE(spec.is_ok(), spec.status().to_string());
  CHECK(spec->io.input.dtype == DType::i32);  // tokens
  CHECK(spec->io.output == TensorSpec{DType::f32, {-1, -1, tiny_config().d_model}});
  CHECK_FALSE(spec->io.targets.has_value());
  CHECK(matching.check_stages().is_ok());

  config.codec = CodecId::fp16;
  RrTrainer mismatched(config, std::vector<RoundRobinRouter>(2), &registry);
  Status checked = mismatched.check_stages();
  CHECK(checked.code() == StatusCode::failed_precondition);
  CHECK(checked.message().find("8bit") != std::string::npos);
  CHECK(checked.message().find("fp16") != std::string::npos);
  // Without the check, each microbatch is refused by the peer (never computed) and abandoned.
  std::mt19937 rng(1);
  Tensor tokens, targets;
  pattern_batch(rng, 2, &tokens, &targets);
  MicrobatchOutcome outcome = mismatched.run_microbatch(tokens, targets);
  CHECK_FALSE(outcome.completed);
  CHECK(outcome.abandon_reason.find("codec") != std::string::npos);
  CHECK(first->stats().forward == 0);
}

TEST_CASE("a trainer whose gradient codec differs from the stages' is refused before training, naming both") {
  InProcessRegistry registry;
  auto first = make_peer(&registry, 0, "grad-0", 1.0, 0.0);
  auto last = make_peer(&registry, 1, "grad-1", 1.0, 0.0);
  using RrTrainer = Trainer<RoundRobinRouter, InprocTransport, InProcessRegistry, compression::StandardCodecs>;
  TrainerConfig config;  // 8bit activations, as the peers
  config.gradient_codec = CodecId::blockwise8;  // the peers' default: their codec
  RrTrainer same(config, std::vector<RoundRobinRouter>(2), &registry);
  CHECK(same.check_stages().is_ok());

  config.gradient_codec = CodecId::blockwise4;
  RrTrainer mismatched(config, std::vector<RoundRobinRouter>(2), &registry);
  Status checked = mismatched.check_stages();
  CHECK(checked.code() == StatusCode::failed_precondition);
  INFO(checked.message());
  CHECK(checked.message().find("gradients in codec 8bit") != std::string::npos);
  CHECK(checked.message().find("4bit") != std::string::npos);
  CHECK(checked.message().find("--gradient-codec") != std::string::npos);
  // Without the check, the forward passes (its activations match) and the backward
  // is refused by the last stage, which will not reply in a codec it does not send.
  std::mt19937 rng(2);
  Tensor tokens, targets;
  pattern_batch(rng, 2, &tokens, &targets);
  MicrobatchOutcome outcome = mismatched.run_microbatch(tokens, targets);
  CHECK_FALSE(outcome.completed);
  CHECK(outcome.abandon_reason.find("stage 1 backward") != std::string::npos);
  CHECK(outcome.abandon_reason.find("input gradient in codec 8bit") != std::string::npos);
  CHECK(first->stats().forward == 1);
  CHECK(last->stats().backward == 0);
}

TEST_CASE("stochastic wiring gives a 2x faster peer 2/3 of the stage's microbatches") {
  auto served = run_two_speed<StochasticWiringRouter>(240);
  const double fast = served["fast"].forward + served["fast"].backward;
  const double slow = served["slow"].forward + served["slow"].backward;
  const double share = fast / (fast + slow);
  MESSAGE("fast peer share: " << share << " (" << fast << " of " << fast + slow << " tasks); fast fwd " << served["fast"].forward << " bwd " << served["fast"].backward << " fail " << served["fast"].failures << ", slow fwd " << served["slow"].forward << " bwd " << served["slow"].backward << " fail " << served["slow"].failures);
  CHECK(std::abs(share - 2.0 / 3.0) <= 0.05);  // 2/3 +- 0.05 absolute, 7.5% of 2/3
  // Round robin in the same setting splits evenly: the test can tell the difference.
  auto even = run_two_speed<RoundRobinRouter>(60);
  const double rr_fast = even["fast"].forward + even["fast"].backward;
  const double rr_slow = even["slow"].forward + even["slow"].backward;
  CHECK(rr_fast / (rr_fast + rr_slow) == doctest::Approx(0.5).epsilon(0.05).scale(0));
}

TEST_CASE("a peer that dies mid-run costs retries, never a microbatch, and the model learns") {
  InProcessRegistry registry;
  auto a = make_peer(&registry, 0, "stage0-a", 1.0, 0.0);
  auto b = make_peer(&registry, 0, "stage0-b", 1.0, 0.0);
  auto c = make_peer(&registry, 1, "stage1-c", 1.0, 0.0);
  TrainerConfig config;
  config.forward_timeout_seconds = 2;
  config.backward_timeout_seconds = 2;
  std::vector<StochasticWiringRouter> routers(2);
  Trainer<StochasticWiringRouter, InprocTransport, InProcessRegistry, compression::StandardCodecs> trainer(config, std::move(routers), &registry);
  std::mt19937 rng(9);
  Tensor tokens, targets;
  double early = 0, late = 0;
  for (int i = 0; i < 240; ++i) {
    if (i == 80) a->stop();  // gone without warning to the trainer
    pattern_batch(rng, 4, &tokens, &targets);
    auto outcome = trainer.run_microbatch(tokens, targets);
    REQUIRE_MESSAGE(outcome.completed, outcome.abandon_reason);
    if (i < 20) early += outcome.loss;
    if (i >= 220) late += outcome.loss;
  }
  Ledger ledger = trainer.ledger();
  CHECK(ledger.started == 240);
  CHECK(ledger.completed == 240);
  CHECK(ledger.abandoned == 0);
  MESSAGE("retries after the peer died: " << ledger.retries << "; loss " << early / 20 << " -> " << late / 20);
  CHECK(late < early * 0.5);
  // After the death, only b served stage 0.
  auto served = trainer.served();
  CHECK(served["stage0-b"].backward > served["stage0-a"].backward);
  CHECK(b->stats().backward + a->stats().backward == 240);
}

}  // namespace
}  // namespace swarm
