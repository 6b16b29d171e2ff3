// Peers that change stage (DESIGN §5.4), with real Peers, a Trainer and the
// in-process transport and registry: a stage-0 peer moves to the thinned stage 1,
// takes its state and steps with it; an emptied stage is refilled; a balanced
// swarm stays put; and the samples the mover accumulated before it left still count.
#include <random>

#include <doctest/doctest.h>

#include "kernels/cpu/cpu_backend.h"
#include "models/gpt/gpt_stage.h"
#include "tests/swarm/tiny_gpt.h"
#include "swarm/compression/codecs.h"
#include "swarm/peer/peer.h"
#include "swarm/registry/in_process_registry.h"
#include "swarm/trainer/trainer.h"
#include "swarm/wiring/stochastic_wiring.h"
#include "transports/inproc/inproc_transport.h"

namespace swarm {
namespace {

using Stage = gpt::GptStage<CpuBackend>;
using GptPeer = Peer<Stage, InprocTransport, InProcessRegistry, compression::StandardCodecs>;
using SwTrainer = Trainer<StochasticWiringRouter, InprocTransport, InProcessRegistry, compression::StandardCodecs>;

constexpr int kRows = 2;

gpt::GptConfig tiny_config() { return testing::tiny_gpt_config(); }

PeerConfig mover_config(int stage, const std::string& id, double rebalance_period) {
  PeerConfig config;
  config.stage_index = stage;
  config.peer_id = id;
  config.bind_address = "inproc://" + id;
  config.announce_period_seconds = 0.05;
  config.announce_ttl_seconds = 1.0;
  config.global_batch_samples = 4 * kRows;
  config.progress_period_seconds = 0.02;
  config.progress_stale_seconds = 1.0;
  config.gather_timeout_seconds = 0.5;
  config.all_reduce.part_timeout_seconds = 1.0;
  config.all_reduce.ping_timeout_seconds = 0.5;
  config.all_reduce.round_timeout_seconds = 10.0;
  config.learning_rate = 3e-3f;
  // Every peer of a stage computes at the same emulated speed, so throughputs are comparable.
  config.emulated_seconds_per_sample = 0.002;
  config.num_stages = 2;
  config.rebalance_period_seconds = rebalance_period;
  config.rebalance.jitter_fraction = 0.2;
  config.drain_timeout_seconds = 5;
  return config;
}

StageFactory<Stage> stage_factory() {
  return [](int index) { return Stage::create(tiny_config(), (*gpt::partition_layers(tiny_config(), 2))[index], 7); };
}

std::unique_ptr<GptPeer> start_peer(InProcessRegistry* registry, PeerConfig config) {
  auto peer = std::make_unique<GptPeer>(std::move(config), stage_factory(), registry);
  REQUIRE(peer->start().is_ok());
  return peer;
}

void pattern_batch(std::mt19937& rng, Tensor* tokens, Tensor* targets) {
  const int T = tiny_config().max_seq_len;
  *tokens = *Tensor::empty(Shape{kRows, T}, DType::i32);
  *targets = *Tensor::empty(Shape{kRows, T}, DType::i32);
  for (int b = 0; b < kRows; ++b) {
    const int offset = static_cast<int>(rng() % 8);
    for (int t = 0; t < T; ++t) {
      tokens->data<int32_t>()[b * T + t] = (offset + t) % 8;
      targets->data<int32_t>()[b * T + t] = (offset + t + 1) % 8;
    }
  }
}

Deadline seconds_from_now(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// Keeps a trainer's microbatches flowing on its own thread until stopped, counting outcomes.
class TrainerLoad {
 public:
  explicit TrainerLoad(InProcessRegistry* registry) : trainer_(trainer_config(), routers(), registry) {
    thread_ = std::thread([this] { run(); });
  }
  ~TrainerLoad() { stop(); }
  void stop() {
    stopping_ = true;
    if (thread_.joinable()) thread_.join();
  }
  int64_t completed() const { return completed_; }
  int64_t abandoned() const { return abandoned_; }
  int64_t samples_completed() const { return completed_ * kRows; }
  std::string last_abandon_reason() {
    std::lock_guard lock(mu_);
    return reason_;
  }

 private:
  static TrainerConfig trainer_config() {
    TrainerConfig config;
    config.refresh_period_seconds = 0.05;
    config.forward_timeout_seconds = 2;
    config.backward_timeout_seconds = 4;
    return config;
  }
  static std::vector<StochasticWiringRouter> routers() {
    std::vector<StochasticWiringRouter> out;
    for (int i = 0; i < 2; ++i) out.push_back(*StochasticWiringRouter::create({}));
    return out;
  }
  void run() {
    std::mt19937 rng(3);
    Tensor tokens, targets;
    while (!stopping_) {
      pattern_batch(rng, &tokens, &targets);
      MicrobatchOutcome outcome = trainer_.run_microbatch(tokens, targets);
      if (outcome.completed) {
        ++completed_;
      } else {
        ++abandoned_;
        std::lock_guard lock(mu_);
        reason_ = outcome.abandon_reason;
      }
    }
  }
  SwTrainer trainer_;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> completed_{0}, abandoned_{0};
  std::mutex mu_;
  std::string reason_;
  std::thread thread_;
};

// Waits for a condition over several peers, re-checking whenever `watched` changes
// (and at least every 20 ms, since the others' changes do not wake it).
template <typename Predicate>
bool eventually(GptPeer* watched, Predicate done, double seconds) {
  const Deadline deadline = seconds_from_now(seconds);
  while (!done()) {
    if (Clock::now() >= deadline) return false;
    int64_t seen = watched->stats().forward + watched->stats().backward;
    (void)watched->wait_for_stats([&](const PeerStats& s) { return s.forward + s.backward != seen; },
                                  std::min(deadline, seconds_from_now(0.02)));
  }
  return true;
}

int64_t total_moves(const std::vector<GptPeer*>& peers) {
  int64_t moves = 0;
  for (GptPeer* p : peers) moves += p->stats().moves;
  return moves;
}

// Waits until `peer` has served stage `stage` at global step >= `step`.
bool serves_at(GptPeer* peer, int stage, int64_t step, double seconds) {
  return peer->wait_for_stats(
      [&](const PeerStats& s) { return s.stage == stage && s.serving && s.global_step >= step; },
      seconds_from_now(seconds));
}

TEST_CASE("a stage-0 peer moves to a thinned stage 1, takes its state, and steps with it bit for bit") {
  InProcessRegistry registry;
  auto a = start_peer(&registry, mover_config(0, "mv-a", 0.5));
  auto b = start_peer(&registry, mover_config(0, "mv-b", 0.5));
  auto c = start_peer(&registry, mover_config(0, "mv-c", 0.5));
  auto d = start_peer(&registry, mover_config(1, "mv-d", 0.5));
  std::vector<GptPeer*> stage0{a.get(), b.get(), c.get()};
  TrainerLoad load(&registry);

  // 3 peers against 1: moving one doubles the pipeline. Exactly one of the equally
  // fast stage-0 peers moves (the tie goes to the lowest id), within a few periods.
  const auto first_mover = [&]() -> GptPeer* {
    for (GptPeer* p : stage0) {
      if (p->stats().moves > 0) return p;
    }
    return nullptr;
  };
  REQUIRE_MESSAGE(eventually(d.get(), [&] { return first_mover() != nullptr; }, 20), "no peer moved");
  GptPeer* mover = first_mover();
  REQUIRE(serves_at(mover, 1, 0, 20));
  // Its replica is the stage's: after the next steps its hash is its stage-mate's.
  const int64_t step = d->stats().global_step + 2;
  REQUIRE(serves_at(mover, 1, step, 30));
  REQUIRE(serves_at(d.get(), 1, step, 30));
  bool same_hash = false;
  for (int i = 0; i < 200 && !same_hash; ++i) {  // both at one step: compare there
    const PeerStats sm = mover->stats(), sd = d->stats();
    same_hash = sm.global_step == sd.global_step && sm.params_hash == sd.params_hash;
    if (!same_hash) mover->wait_for_stats([&](const PeerStats& s) { return s.global_step != sm.global_step; },
                                          seconds_from_now(0.05));
  }
  CHECK(same_hash);
  // 2 + 2 is balanced: nobody moves back over several more periods.
  const int64_t moves_then = total_moves({a.get(), b.get(), c.get(), d.get()});
  CHECK(moves_then == 1);
  CHECK_FALSE(eventually(d.get(), [&] { return total_moves({a.get(), b.get(), c.get(), d.get()}) > moves_then; }, 3));
  CHECK(total_moves({a.get(), b.get(), c.get(), d.get()}) == moves_then);
  load.stop();
  CHECK_MESSAGE(load.abandoned() == 0, load.last_abandon_reason());
  CHECK(load.completed() > 0);
}

TEST_CASE("an emptied stage is refilled from the other, which is never emptied itself") {
  InProcessRegistry registry;
  auto a = start_peer(&registry, mover_config(0, "em-a", 0.5));
  auto b = start_peer(&registry, mover_config(0, "em-b", 0.5));
  auto d = start_peer(&registry, mover_config(1, "em-d", 0.5));
  TrainerLoad load(&registry);
  REQUIRE(serves_at(d.get(), 1, 2, 30));
  d->stop();  // stage 1 is empty now
  const auto refilled = [&] { return a->stats().stage == 1 || b->stats().stage == 1; };
  REQUIRE(eventually(a.get(), refilled, 20));
  GptPeer* mover = a->stats().stage == 1 ? a.get() : b.get();
  GptPeer* stayer = mover == a.get() ? b.get() : a.get();
  CHECK(serves_at(mover, 1, 0, 20));
  // The other stays: stage 0 keeps its one peer.
  CHECK(stayer->stats().stage == 0);
  CHECK(stayer->stats().moves == 0);
  // Training goes on through the refilled stage.
  const int64_t before = load.completed();
  CHECK(mover->wait_for_stats([&](const PeerStats& s) { return s.ledger.samples_accumulated_total >= 5 * kRows; },
                              seconds_from_now(30)));
  CHECK(load.completed() > before);
  load.stop();
}

TEST_CASE("a balanced swarm stays put over ten periods") {
  InProcessRegistry registry;
  std::vector<std::unique_ptr<GptPeer>> peers;
  for (int i = 0; i < 4; ++i) peers.push_back(start_peer(&registry, mover_config(i % 2, fmt::format("bal-{}", i), 0.3)));
  TrainerLoad load(&registry);
  // Ten periods (3 s) of checks on live throughputs: no move.
  const bool someone_moved = eventually(
      peers[0].get(),
      [&] {
        for (auto& p : peers) {
          if (p->stats().moves > 0) return true;
        }
        return false;
      },
      3.5);
  CHECK_FALSE(someone_moved);
  load.stop();
  CHECK(load.completed() > 0);
}

TEST_CASE("a mover's samples from its old stage stay in that stage's ledger, and are stepped") {
  InProcessRegistry registry;
  auto a = start_peer(&registry, mover_config(0, "lg-a", 0));
  auto b = start_peer(&registry, mover_config(0, "lg-b", 0));
  auto d = start_peer(&registry, mover_config(1, "lg-d", 0));
  {
    TrainerLoad load(&registry);
    REQUIRE(a->wait_for_stats([](const PeerStats& s) { return s.ledger.samples_stepped >= 8; }, seconds_from_now(30)));
  }
  REQUIRE(a->move_to(1));
  CHECK(a->stage_index() == 1);
  CHECK(a->stats().moves == 1);
  // Every sample it accumulated in stage 0 went into a step or is named as lost to the move.
  SwTrainer trainer(TrainerConfig{}, std::vector<StochasticWiringRouter>(2), &registry);
  auto infos = trainer.peer_infos({{"lg-a", 0, a->address()}, {"lg-a", 1, a->address()}}, 2.0);
  REQUIRE(infos.size() == 2);
  for (const auto& report : infos) {
    REQUIRE_MESSAGE(report.info.is_ok(), report.info.status().to_string());
    REQUIRE(report.info->samples.has_value());
    CHECK(report.info->samples->unaccounted() == 0);
  }
  const protocol::SampleLedger old_stage = *infos[0].info->samples;
  CHECK(old_stage.samples_accumulated_total >= 8);
  CHECK(old_stage.samples_pending == 0);
  CHECK(old_stage.samples_stepped + old_stage.samples_lost_moved + old_stage.samples_lost_failed_round ==
        old_stage.samples_accumulated_total);
  // Its new stage keeps a ledger of its own: nothing has trained there yet.
  CHECK(infos[1].info->samples->samples_accumulated_total == 0);
}

TEST_CASE("forged announcements are left out of rebalancing and counted; nobody moves for them") {
  InProcessRegistry registry;
  auto a = start_peer(&registry, mover_config(0, "fg-a", 0.3));
  auto b = start_peer(&registry, mover_config(1, "fg-b", 0.3));
  // A wrong-typed field, a record under another stage's key, and one that is not JSON:
  // each would tempt the policy (stage 1 looks crowded, stage 0 empty) if it were read.
  const double expires = registry.now() + 60;
  REQUIRE(registry.announce(stage_registry_key(1), "f1",
                            R"({"peer":"f1","address":"x","stage":1,"throughput":1e9,"serving":"yes"})", expires)
              .is_ok());
  REQUIRE(registry.announce(stage_registry_key(1), "f2", R"({"peer":"f2","address":"x","stage":0})", expires).is_ok());
  REQUIRE(registry.announce(stage_registry_key(1), "f3", "{not json", expires).is_ok());
  SwTrainer trainer(TrainerConfig{}, std::vector<StochasticWiringRouter>(2), &registry);
  const auto bad_records = [&] {
    auto infos = trainer.peer_infos({{"fg-a", 0, a->address()}}, 2.0);
    if (infos.empty() || !infos[0].info.is_ok()) return int64_t{0};
    const auto& counts = infos[0].info->refusals;
    const auto it = counts.find("bad_records");
    return it == counts.end() ? int64_t{0} : it->second;
  };
  CHECK(eventually(a.get(), [&] { return bad_records() >= 3; }, 10));
  CHECK(a->stats().moves == 0);
  CHECK(b->stats().moves == 0);
}

TEST_CASE("a peer started without a stage joins the one the swarm needs most") {
  InProcessRegistry registry;
  CHECK(stage_the_swarm_needs(registry, 2) == 0);  // an empty swarm: the first stage
  auto a = start_peer(&registry, mover_config(0, "pick-a", 0));
  CHECK(stage_the_swarm_needs(registry, 2) == 1);  // the empty stage first
  auto b = start_peer(&registry, mover_config(1, "pick-b", 0));
  auto c = start_peer(&registry, mover_config(1, "pick-c", 0));
  CHECK(stage_the_swarm_needs(registry, 2) == 0);  // 1 against 2: the thinner stage
  CHECK(stage_the_swarm_needs(registry, 3) == 2);  // a third stage nobody serves yet
}

}  // namespace
}  // namespace swarm
