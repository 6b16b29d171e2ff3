// TrainingLoop over a data source that is not tokens: a regression of f32 points
// served by MLP stages (models/mlp) keeps several microbatches in flight through
// the loop's own workers, counts samples as its units, and a source that fails
// ends the run with its error and every started microbatch accounted for.
#include <chrono>
#include <cmath>
#include <future>
#include <random>

#include <doctest/doctest.h>

#include "models/mlp/mlp_stage.h"
#include "swarm/compression/codecs.h"
#include "swarm/peer/peer.h"
#include "swarm/registry/in_process_registry.h"
#include "swarm/trainer/trainer.h"
#include "swarm/trainer/training_loop.h"
#include "swarm/wiring/stochastic_wiring.h"
#include "transports/inproc/inproc_transport.h"

namespace swarm {
namespace {

using mlp::MlpStage;
using MlpPeer = Peer<MlpStage, InprocTransport, InProcessRegistry, compression::StandardCodecs>;
using SwarmTrainer = Trainer<StochasticWiringRouter, InprocTransport, InProcessRegistry, compression::StandardCodecs>;

constexpr int kRows = 8;

// y = sin(x0) + 0.5 x1 x2 - x3 at seeded random points; fails after `fail_after` batches if set.
struct RegressionPoints {
  using data_source_concept = data_source_t;
  std::mt19937 rng;
  int64_t served = 0;
  int64_t fail_after = -1;

  Result<Microbatch> next() {
    if (fail_after >= 0 && served >= fail_after) return unavailable("the point file ended after {} batches", served);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    Microbatch batch{*Tensor::empty(Shape{kRows, 4}, DType::f32), *Tensor::empty(Shape{kRows, 1}, DType::f32), kRows};
    for (int r = 0; r < kRows; ++r) {
      float* x = batch.inputs.data<float>() + r * 4;
      for (int i = 0; i < 4; ++i) x[i] = uniform(rng);
      batch.targets.data<float>()[r] = std::sin(x[0]) + 0.5f * x[1] * x[2] - x[3];
    }
    ++served;
    return batch;
  }
};
static_assert(DataSource<RegressionPoints>);

struct MlpSwarm {
  InProcessRegistry registry;
  std::unique_ptr<MlpPeer> first, second;
  std::unique_ptr<SwarmTrainer> trainer;

  explicit MlpSwarm(const std::string& name) {
    PeerConfig config;
    config.peer_id = name + "-0";
    config.bind_address = "inproc://" + config.peer_id;
    config.learning_rate = 1e-2f;
    config.step_every_samples = 32;
    config.optimizer.weight_decay = 0;
    config.emulated_seconds_per_sample = 0.0005;  // milliseconds a microbatch: long enough to overlap
    first = std::make_unique<MlpPeer>(config, *MlpStage::create({.in = 4, .out = 32, .gelu = true}, 1), &registry);
    config.stage_index = 1;
    config.peer_id = name + "-1";
    config.bind_address = "inproc://" + config.peer_id;
    second = std::make_unique<MlpPeer>(config, *MlpStage::create({.in = 32, .out = 1, .loss = true}, 2), &registry);
    REQUIRE(first->start().is_ok());
    REQUIRE(second->start().is_ok());
    TrainerConfig trainer_config;
    trainer_config.num_stages = 2;
    trainer = std::make_unique<SwarmTrainer>(trainer_config, std::vector<StochasticWiringRouter>(2), &registry);
  }
};

// The most microbatches that were between their start and end at one moment.
int most_in_flight(const std::vector<StepReport>& reports) {
  std::vector<std::pair<double, int>> edges;
  for (const auto& report : reports) {
    for (const auto& span : report.spans) {
      edges.emplace_back(span.started, 1);
      edges.emplace_back(span.ended, -1);
    }
  }
  std::sort(edges.begin(), edges.end(), [](auto a, auto b) { return a.first != b.first ? a.first < b.first : a.second < b.second; });
  int now = 0, most = 0;
  for (const auto& [t, delta] : edges) most = std::max(most, now += delta);
  return most;
}

Result<TrainingSummary> run_with_deadline(TrainingLoop<SwarmTrainer, RegressionPoints>& loop) {
  auto done = std::async(std::launch::async, [&] { return loop.run(); });
  if (done.wait_for(std::chrono::seconds(120)) != std::future_status::ready) {
    FAIL_CHECK("the loop did not end within 120 s");
    loop.request_stop();
  }
  return done.get();
}

TEST_CASE("a loop over points, not tokens, keeps microbatches in flight, counts samples and trains") {
  MlpSwarm swarm("points");
  TrainingLoopOptions options;
  options.last_step = 60;
  options.microbatches_per_step = 4;
  options.in_flight = 3;
  std::vector<StepReport> reports;
  std::vector<RegressionPoints> sources(1);
  sources[0].rng.seed(5);
  TrainingLoop<SwarmTrainer, RegressionPoints> loop({swarm.trainer.get()}, std::move(sources), options,
                                                    [&](const StepReport& report) { reports.push_back(report); });
  auto summary = run_with_deadline(loop);
  REQUIRE_MESSAGE(summary.is_ok(), summary.status().to_string());
  REQUIRE(reports.size() == 60);
  CHECK(summary->ledger.completed == 240);
  CHECK(summary->ledger.abandoned == 0);
  CHECK(summary->tokens == 240 * kRows);  // samples, as the source counts them
  const int in_flight = most_in_flight(reports);
  MESSAGE("at most " << in_flight << " microbatches in flight; loss " << *reports.front().loss << " -> "
                     << *reports.back().loss);
  CHECK(in_flight >= 2);
  CHECK(in_flight <= 3);
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) first += *reports[i].loss, last += *reports[reports.size() - 1 - i].loss;
  CHECK(last < first * 0.5);
  // Held-out points, weighted by their samples: a batch of 4 counts half as much as one of 8.
  RegressionPoints held_out;
  held_out.rng.seed(99);
  std::vector<Microbatch> validation{*held_out.next(), *held_out.next()};
  validation[1].units = 4;
  auto loss = validation_loss(*swarm.trainer, validation);
  REQUIRE_MESSAGE(loss.is_ok(), loss.status().to_string());
  const double a = swarm.trainer->evaluate(validation[0].inputs, validation[0].targets).loss;
  const double b = swarm.trainer->evaluate(validation[1].inputs, validation[1].targets).loss;
  CHECK(*loss == doctest::Approx((8 * a + 4 * b) / 12));
  CHECK(*loss < first / 5);
  validation[0].units = 0;
  CHECK(validation_loss(*swarm.trainer, validation).status().code() == StatusCode::invalid_argument);
  CHECK(validation_loss(*swarm.trainer, std::vector<Microbatch>{}).status().code() == StatusCode::invalid_argument);
}

TEST_CASE("a data source that fails ends the run with its error, and every started microbatch ends") {
  MlpSwarm swarm("failing");
  TrainingLoopOptions options;
  options.last_step = 1000;
  options.microbatches_per_step = 2;
  options.in_flight = 2;
  std::vector<RegressionPoints> sources(1);
  sources[0].fail_after = 11;
  TrainingLoop<SwarmTrainer, RegressionPoints> loop({swarm.trainer.get()}, std::move(sources), options,
                                                    [](const StepReport&) {});
  auto summary = run_with_deadline(loop);
  CHECK(summary.status().code() == StatusCode::unavailable);
  CHECK(summary.status().message().find("ended after 11 batches") != std::string::npos);
  const Ledger ledger = swarm.trainer->ledger();
  CHECK(ledger.started == 11);  // what the source gave, and not one more
  CHECK(ledger.started == ledger.completed + ledger.abandoned);
}

}  // namespace
}  // namespace swarm
