// A loss stage's metrics (a classifier head's accuracy) from the peer that
// computes them to the trainer's outcome, the loop's step reports and the
// validation, over the in-process transport; and MetricMeans, which averages
// them and leaves out what a peer sends wrong.
#include <chrono>
#include <cmath>
#include <future>
#include <random>

#include <doctest/doctest.h>

#include "kernels/cpu/cpu_backend.h"
#include "swarm/compression/codecs.h"
#include "swarm/layers/layers.h"
#include "swarm/peer/peer.h"
#include "swarm/registry/in_process_registry.h"
#include "swarm/stages/any_stage.h"
#include "swarm/trainer/metric_means.h"
#include "swarm/trainer/trainer.h"
#include "swarm/trainer/training_loop.h"
#include "swarm/wiring/stochastic_wiring.h"
#include "transports/inproc/inproc_transport.h"

namespace swarm {
namespace {

namespace L = layers;
using Cpu = L::HostOps<CpuBackend>;
using Trunk = L::Sequential<L::Linear<Cpu>, L::Tanh<Cpu>>;
using Head = L::Sequential<L::Linear<Cpu>, L::SoftmaxCrossEntropy<Cpu, L::ReportAccuracy>>;
using StagePeer = Peer<AnyStage, InprocTransport, InProcessRegistry, compression::StandardCodecs>;
using SwarmTrainer = Trainer<StochasticWiringRouter, InprocTransport, InProcessRegistry, compression::StandardCodecs>;

constexpr int kRows = 16;

// Points labelled by their quadrant pair: class = (x > 0) + (y > 0).
struct Quadrants {
  using data_source_concept = data_source_t;
  std::mt19937 rng;
  Result<Microbatch> next() {
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    Microbatch batch{*Tensor::empty(Shape{kRows, 2}, DType::f32), *Tensor::empty(Shape{kRows}, DType::i32), kRows};
    for (int i = 0; i < kRows; ++i) {
      const float a = uniform(rng), b = uniform(rng);
      batch.inputs.data<float>()[2 * i] = a;
      batch.inputs.data<float>()[2 * i + 1] = b;
      batch.targets.data<int32_t>()[i] = (a > 0) + (b > 0);
    }
    return batch;
  }
};

struct ClassifierSwarm {
  InProcessRegistry registry;
  std::unique_ptr<StagePeer> trunk, head;
  std::unique_ptr<SwarmTrainer> trainer;

  ClassifierSwarm() {
    PeerConfig config;
    config.peer_id = "metrics-0";
    config.bind_address = "inproc://metrics-0";
    config.learning_rate = 3e-2f;
    config.step_every_samples = 32;
    trunk = std::make_unique<StagePeer>(config, AnyStage(*Trunk::create(1, {2, 16}, {})), &registry);
    config.stage_index = 1;
    config.peer_id = "metrics-1";
    config.bind_address = "inproc://metrics-1";
    head = std::make_unique<StagePeer>(config, AnyStage(*Head::create(2, {16, 3}, {})), &registry);
    REQUIRE(trunk->start().is_ok());
    REQUIRE(head->start().is_ok());
    TrainerConfig trainer_config;
    trainer_config.num_stages = 2;
    trainer = std::make_unique<SwarmTrainer>(trainer_config, std::vector<StochasticWiringRouter>(2), &registry);
    REQUIRE(trainer->check_stages().is_ok());
  }
};

std::vector<StepReport> train(ClassifierSwarm& swarm, size_t metrics, int steps) {
  TrainingLoopOptions options;
  options.last_step = steps;
  options.microbatches_per_step = 2;
  options.in_flight = 2;
  options.metrics = metrics;
  std::vector<StepReport> reports;
  std::vector<Quadrants> sources{Quadrants{std::mt19937(5)}};
  TrainingLoop<SwarmTrainer, Quadrants> loop({swarm.trainer.get()}, std::move(sources), options,
                                             [&](const StepReport& report) { reports.push_back(report); });
  auto done = std::async(std::launch::async, [&] { return loop.run(); });
  if (done.wait_for(std::chrono::seconds(120)) != std::future_status::ready) {
    FAIL_CHECK("the loop did not end within 120 s");
    loop.request_stop();
  }
  auto summary = done.get();
  REQUIRE_MESSAGE(summary.is_ok(), summary.status().to_string());
  return reports;
}

TEST_CASE("a head's accuracy reaches the trainer, the loop's steps and the validation, and rises as it trains") {
  ClassifierSwarm swarm;
  auto spec = swarm.trainer->stage_spec(1);
  REQUIRE(spec.is_ok());
  CHECK(spec->io.metrics == std::vector<std::string>{"accuracy"});
  CHECK(swarm.trainer->stage_spec(0)->io.metrics.empty());

  Quadrants one{std::mt19937(3)};
  const Microbatch batch = *one.next();
  const MicrobatchOutcome outcome = swarm.trainer->run_microbatch(batch.inputs, batch.targets);
  REQUIRE_MESSAGE(outcome.completed, outcome.abandon_reason);
  REQUIRE(outcome.metrics.size() == 1);
  CHECK(outcome.metrics[0] >= 0.0f);
  CHECK(outcome.metrics[0] <= 1.0f);

  const std::vector<StepReport> reports = train(swarm, 1, 200);
  REQUIRE(reports.size() == 200);
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) {
    REQUIRE(reports[i].metrics.size() == 1);
    REQUIRE(reports[reports.size() - 1 - i].metrics.size() == 1);
    first += reports[i].metrics[0] / 5;
    last += reports[reports.size() - 1 - i].metrics[0] / 5;
  }
  for (const StepReport& report : reports) {
    CHECK(report.metrics[0] >= 0.0);
    CHECK(report.metrics[0] <= 1.0);
  }
  MESSAGE("accuracy over the first 5 steps " << first << ", over the last 5 " << last);
  CHECK(last > 0.8);
  CHECK(last > first);

  // The validation's accuracy is the held-out microbatches', each weighted by its units.
  Quadrants held_out{std::mt19937(99)};
  std::vector<Microbatch> validation{*held_out.next(), *held_out.next()};
  validation[1].units = kRows / 2;
  const ValidationResult result = validate_until(*swarm.trainer, validation, std::nullopt, 1);
  REQUIRE(result.metrics.size() == 1);
  const MicrobatchOutcome a = swarm.trainer->evaluate(validation[0].inputs, validation[0].targets);
  const MicrobatchOutcome b = swarm.trainer->evaluate(validation[1].inputs, validation[1].targets);
  REQUIRE(a.metrics.size() == 1);
  REQUIRE(b.metrics.size() == 1);
  CHECK(result.metrics[0] == doctest::Approx((kRows * a.metrics[0] + kRows / 2 * b.metrics[0]) / (1.5 * kRows)));
  // A loop or validation that expects no metrics, or another count, reports none.
  CHECK(validate_until(*swarm.trainer, validation, std::nullopt).metrics.empty());
  CHECK(validate_until(*swarm.trainer, validation, std::nullopt, 2).metrics.empty());
  for (const StepReport& report : train(swarm, 2, 3)) CHECK(report.metrics.empty());
}

TEST_CASE("metric means weigh each microbatch, and leave out a wrong count, a non-finite value or weight") {
  MetricMeans means(2);
  CHECK(means.means().empty());  // nothing added yet
  means.add({1.0f, 0.0f}, 3.0);
  means.add({0.0f, 1.0f}, 1.0);
  means.add({0.5f}, 1.0);                          // one value of two
  means.add({std::nanf(""), 0.0f}, 1.0);           // not finite
  means.add({0.5f, 0.5f, 0.5f}, 1.0);              // three of two
  means.add({0.5f, 0.5f}, 0.0);                    // no weight
  means.add({0.5f, 0.5f}, std::nan(""));
  const std::vector<double> got = means.means();
  REQUIRE(got.size() == 2);
  CHECK(got[0] == doctest::Approx(0.75));
  CHECK(got[1] == doctest::Approx(0.25));
  CHECK(means.refused() == 5);
  MetricMeans none;  // a loss stage without metrics
  none.add({0.5f}, 1.0);
  CHECK(none.means().empty());
  CHECK(none.refused() == 0);
}

}  // namespace
}  // namespace swarm
