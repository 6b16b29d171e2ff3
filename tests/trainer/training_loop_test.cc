// TrainingLoop over a real in-process swarm (GPT stages served by Peers, driven
// by Trainers over the in-process transport and registry): step reports come
// in order, microbatches of the next step start before the current step's last
// one ends (no per-step barrier), a stop or a time limit ends the run with every
// started microbatch accounted for, and validation names why it failed.
#include "swarm/compression/codecs.h"
#include "swarm/trainer/training_loop.h"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "kernels/cpu/cpu_backend.h"
#include "models/gpt/gpt_stage.h"
#include "swarm/peer/peer.h"
#include "swarm/registry/in_process_registry.h"
#include "swarm/trainer/trainer.h"
#include "swarm/wiring/stochastic_wiring.h"
#include "transports/inproc/inproc_transport.h"

namespace swarm {
namespace {

using Stage = gpt::GptStage<CpuBackend>;
using GptPeer = Peer<Stage, InprocTransport, InProcessRegistry, compression::StandardCodecs>;
using SwarmTrainer = Trainer<StochasticWiringRouter, InprocTransport, InProcessRegistry, compression::StandardCodecs>;
using Loop = TrainingLoop<SwarmTrainer>;

constexpr int kSeq = 16;
constexpr int kMicrobatch = 2;

gpt::GptConfig tiny_config() {
  gpt::GptConfig config;
  config.vocab_size = 32;
  config.max_seq_len = kSeq;
  config.d_model = 16;
  config.n_heads = 2;
  config.n_layers = 2;
  return config;
}

// A 2-stage swarm with one peer per stage. The emulated cost makes a
// microbatch take milliseconds, long enough for its neighbours to overlap it.
struct Swarm {
  explicit Swarm(const std::string& name, int trainers) {
    for (int stage = 0; stage < 2; ++stage) peers.push_back(make_peer(stage, name + "-s" + std::to_string(stage)));
    for (int t = 0; t < trainers; ++t) this->trainers.push_back(make_trainer());
    for (int i = 0; i < 4096; ++i) tokens.push_back(i % 8);  // a pattern the model learns
  }

  std::unique_ptr<GptPeer> make_peer(int stage, const std::string& id) {
    auto layouts = *gpt::partition_layers(tiny_config(), 2);
    PeerConfig config;
    config.stage_index = stage;
    config.peer_id = id;
    config.bind_address = "inproc://" + id;
    config.emulated_seconds_per_sample = 0.001;
    config.learning_rate = 3e-3f;
    config.step_every_samples = 8;
    config.announce_period_seconds = 0.05;
    auto peer = std::make_unique<GptPeer>(config, *Stage::create(tiny_config(), layouts[stage], 7), &registry);
    REQUIRE(peer->start().is_ok());
    return peer;
  }

  std::unique_ptr<SwarmTrainer> make_trainer() {
    TrainerConfig config;
    config.forward_timeout_seconds = 2;
    config.backward_timeout_seconds = 2;
    config.refresh_period_seconds = 0.1;
    config.abandon_after_seconds = 0.5;  // for the tests that take a stage away
    std::vector<StochasticWiringRouter> routers;
    for (int s = 0; s < 2; ++s) {
      StochasticWiringConfig wiring;
      wiring.seed = 100 + trainers.size() * 10 + s;
      routers.push_back(*StochasticWiringRouter::create(wiring));
    }
    return std::make_unique<SwarmTrainer>(config, std::move(routers), &registry);
  }

  std::vector<SwarmTrainer*> trainer_pointers() {
    std::vector<SwarmTrainer*> out;
    for (auto& trainer : trainers) out.push_back(trainer.get());
    return out;
  }

  std::vector<BatchSampler> samplers() {
    std::vector<BatchSampler> out;
    for (size_t t = 0; t < trainers.size(); ++t) out.emplace_back(&tokens, kMicrobatch, kSeq, 11 + t);
    return out;
  }

  InProcessRegistry registry;
  std::vector<std::unique_ptr<GptPeer>> peers;
  std::vector<std::unique_ptr<SwarmTrainer>> trainers;
  std::vector<int32_t> tokens;
};

struct Run {
  Result<TrainingSummary> summary = internal("did not run");
  std::vector<StepReport> reports;
  bool sink_on_calling_thread = true;
};

// Runs the loop on its own thread and waits for it with a deadline, so a hang
// fails the test instead of stalling it. `stop` (if set) sees the reports so far.
Run run_loop(Swarm& swarm, TrainingLoopOptions options,
             std::function<bool(const std::vector<StepReport>&)> stop = nullptr, double deadline_seconds = 60) {
  Run run;
  std::thread::id caller;
  if (stop) options.stop_requested = [&] { return stop(run.reports); };  // both on the calling thread
  Loop loop(swarm.trainer_pointers(), swarm.samplers(), options, [&](const StepReport& report) {
    if (std::this_thread::get_id() != caller) run.sink_on_calling_thread = false;
    run.reports.push_back(report);
  });
  auto done = std::async(std::launch::async, [&] {
    caller = std::this_thread::get_id();
    return loop.run();
  });
  if (done.wait_for(std::chrono::duration<double>(deadline_seconds)) != std::future_status::ready) {
    FAIL_CHECK("the loop did not end within " << deadline_seconds << " s");
    loop.request_stop();
  }
  run.summary = done.get();
  return run;
}

// Every trainer's own ledger balances, and the loop's totals are their sum.
void check_ledgers(Swarm& swarm, const TrainingSummary& summary) {
  LedgerTotals sum;
  for (auto& trainer : swarm.trainers) {
    Ledger ledger = trainer->ledger();
    CHECK(ledger.started == ledger.completed + ledger.abandoned);
    sum.started += ledger.started;
    sum.completed += ledger.completed;
    sum.abandoned += ledger.abandoned;
  }
  CHECK(summary.ledger.balanced());
  CHECK(summary.ledger.started == sum.started);
  CHECK(summary.ledger.completed == sum.completed);
  CHECK(summary.ledger.abandoned == sum.abandoned);
}

// Reports number consecutive steps from `first`, and together they hold every
// microbatch started, each in the step its start order puts it in.
void check_reports(const Run& run, int64_t first, int per_step) {
  CHECK(run.sink_on_calling_thread);
  int64_t microbatches = 0;
  for (size_t i = 0; i < run.reports.size(); ++i) {
    const StepReport& report = run.reports[i];
    CHECK(report.step == first + static_cast<int64_t>(i));
    CHECK(report.microbatches == static_cast<int>(report.spans.size()));
    if (i + 1 < run.reports.size()) CHECK(report.microbatches == per_step);
    for (const MicrobatchSpan& span : report.spans) {
      CHECK(span.index / per_step == static_cast<int64_t>(i));
      CHECK(span.started <= span.ended);
    }
    microbatches += report.microbatches;
  }
  CHECK(microbatches == run.summary->ledger.started);
}

// Boundaries k|k+1 at which a microbatch of step k+1 started before the last of step k ended.
int overlapping_boundaries(const std::vector<StepReport>& reports) {
  int overlaps = 0;
  for (size_t k = 0; k + 1 < reports.size(); ++k) {
    double last_end = 0, next_first_start = 1e300;
    for (const auto& span : reports[k].spans) last_end = std::max(last_end, span.ended);
    for (const auto& span : reports[k + 1].spans) next_first_start = std::min(next_first_start, span.started);
    if (next_first_start < last_end) ++overlaps;
  }
  return overlaps;
}

TEST_CASE("steps are reported in order while microbatches flow across their boundaries") {
  Swarm swarm("flow", 2);
  TrainingLoopOptions options;
  options.first_step = 5;  // as a resumed run would
  options.last_step = 16;
  options.microbatches_per_step = 4;
  options.in_flight = 3;
  Run run = run_loop(swarm, options);
  REQUIRE(run.summary.is_ok());
  const TrainingSummary& summary = *run.summary;
  CHECK(summary.stopped_by == StopReason::finished);
  CHECK(summary.last_step == 16);
  REQUIRE(run.reports.size() == 12);
  check_reports(run, 5, 4);
  check_ledgers(swarm, summary);
  CHECK(summary.ledger.started == 48);
  CHECK(summary.ledger.completed == 48);
  CHECK(summary.tokens == 48 * kMicrobatch * kSeq);
  for (const StepReport& report : run.reports) {
    CHECK(report.completed == 4);
    REQUIRE(report.loss.has_value());
    CHECK(*report.loss > 0);
    CHECK(report.tokens_per_second > 0);
  }
  // With a barrier there would be none; with 6 in flight and 4 per step, nearly every one.
  const int overlaps = overlapping_boundaries(run.reports);
  MESSAGE(overlaps << " of 11 step boundaries overlapped; loss " << *run.reports.front().loss << " -> "
                   << *run.reports.back().loss);
  CHECK(overlaps >= 6);
  CHECK(*run.reports.back().loss < *run.reports.front().loss);
}

TEST_CASE("a stop predicate ends the run early and loses no microbatch") {
  Swarm swarm("stop", 2);
  TrainingLoopOptions options;
  options.last_step = 1000000;
  options.microbatches_per_step = 3;  // not a multiple of the 4 in flight: the stop may cut a step
  options.in_flight = 2;
  Run run = run_loop(swarm, options, [](const std::vector<StepReport>& reports) { return reports.size() >= 3; });
  REQUIRE(run.summary.is_ok());
  CHECK(run.summary->stopped_by == StopReason::stop_requested);
  CHECK(run.reports.size() >= 3);
  CHECK(run.summary->last_step == static_cast<int64_t>(run.reports.size()));
  CHECK(run.summary->last_step < 100);
  check_ledgers(swarm, *run.summary);
  check_reports(run, 1, 3);
  CHECK(run.summary->ledger.abandoned == 0);
}

TEST_CASE("a time limit ends the run with every started microbatch ended") {
  Swarm swarm("limit", 1);
  TrainingLoopOptions options;
  options.last_step = 1000000;
  options.microbatches_per_step = 2;
  options.in_flight = 3;
  options.time_limit_seconds = 0.5;
  Run run = run_loop(swarm, options);
  REQUIRE(run.summary.is_ok());
  CHECK(run.summary->stopped_by == StopReason::time_limit);
  CHECK(run.reports.size() >= 1);
  check_ledgers(swarm, *run.summary);
  check_reports(run, 1, 2);
  for (const StepReport& report : run.reports) {
    for (const MicrobatchSpan& span : report.spans) CHECK(span.started <= 0.5 + 1e-6);
  }
}

TEST_CASE("with a stage gone, microbatches are abandoned, not lost, and report no loss") {
  Swarm swarm("gone", 1);
  swarm.peers[1]->stop();
  TrainingLoopOptions options;
  options.last_step = 2;
  options.microbatches_per_step = 2;
  options.in_flight = 2;
  Run run = run_loop(swarm, options);
  REQUIRE(run.summary.is_ok());
  REQUIRE(run.reports.size() == 2);
  check_reports(run, 1, 2);
  check_ledgers(swarm, *run.summary);
  CHECK(run.summary->ledger.abandoned == 4);
  for (const StepReport& report : run.reports) {
    CHECK(report.completed == 0);
    CHECK_FALSE(report.loss.has_value());  // not a loss of 0
  }
  CHECK(run.summary->tokens == 0);
}

TEST_CASE("validation loss: a mean over the windows, or an error that says why") {
  Swarm swarm("validation", 1);
  std::vector<TokenWindow> windows = *validation_windows(swarm.tokens, kSeq, 12);  // 8 + 4: two batches
  Result<double> loss = validation_loss(*swarm.trainers[0], windows);
  REQUIRE_MESSAGE(loss.is_ok(), loss.status().to_string());
  CHECK(*loss > 0);
  CHECK(swarm.trainers[0]->ledger().started == 0);  // forward only: not microbatches of the ledger
  CHECK(validation_loss(*swarm.trainers[0], std::vector<TokenWindow>{}).status().code() == StatusCode::invalid_argument);

  swarm.peers[1]->stop();
  Result<double> failed = validation_loss(*swarm.trainers[0], windows);
  REQUIRE_FALSE(failed.is_ok());
  MESSAGE(failed.status().to_string());
  CHECK(failed.status().code() == StatusCode::unavailable);
  CHECK(failed.status().message().find("stage 1") != std::string::npos);
}

}  // namespace
}  // namespace swarm
