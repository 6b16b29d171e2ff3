// Each sample is counted once per stage: a peer refuses a second backward of one
// microbatch, drops work whose deadline has passed (before computing it, and
// after, putting its gradients back), and its ledger accounts for every sample it
// accepted. Peers are real (ZeroMQ sockets on loopback); the replica is tested on
// its own where the gradients themselves must be compared.
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <chrono>
#include <cmath>
#include <memory>
#include <random>
#include <thread>

#include <doctest/doctest.h>

#include "models/mlp/mlp_stage.h"
#include "swarm/compression/codecs.h"
#include "swarm/peer/peer.h"
#include "swarm/registry/in_process_registry.h"
#include "swarm/trainer/trainer.h"
#include "swarm/wiring/baseline_routers.h"
#include "transports/zmq/zmq_transport.h"

namespace swarm {
namespace {

using namespace std::chrono_literals;
using mlp::MlpStage;

// Wakes every SlowStage that holds a backward when any of them counts a call, so a
// hold can wait on what another peer does.
struct Signals {
  std::mutex mu;
  std::condition_variable changed;
  void notify() {
    { std::lock_guard lock(mu); }
    changed.notify_all();
  }
};

// What a test can do to a SlowStage from outside, and what it did. A held backward
// computes once `release()` holds or, with no release set, once the Unix time passes
// `hold_past_unix_ms` (the deadline the test gave it): never on a guessed delay.
struct Knobs {
  std::atomic<int> slow_backwards{0};  // backwards still to hold; the rest run at once
  std::atomic<int64_t> hold_past_unix_ms{0};
  std::function<bool()> release;       // set before any backward is held
  std::shared_ptr<Signals> signals = std::make_shared<Signals>();
  std::atomic<int> forward_calls{0};
  std::atomic<int> backward_calls{0};

  void hold() {
    std::unique_lock lock(signals->mu);
    if (release) {
      signals->changed.wait_until(lock, Clock::now() + 10s, [&] { return release(); });
      return;
    }
    const auto past = std::chrono::system_clock::time_point(std::chrono::milliseconds(hold_past_unix_ms + 1));
    signals->changed.wait_until(lock, past, [&] { return protocol::unix_millis_now() > hold_past_unix_ms; });
  }
};

// Holds the calling thread until the Unix time is past `deadline_ms`.
void wait_past(int64_t deadline_ms) {
  Knobs clock_only;
  clock_only.hold_past_unix_ms = deadline_ms;
  clock_only.hold();
}

// An MLP stage whose backward can be made slower than a deadline.
class SlowStage {
 public:
  using stage_concept = stage_t;
  SlowStage(MlpStage inner, std::shared_ptr<Knobs> knobs) : inner_(std::move(inner)), knobs_(std::move(knobs)) {}
  bool takes_targets() const { return inner_.takes_targets(); }
  StageIoSpec io_spec() const { return inner_.io_spec(); }
  Result<Tensor> forward(const TensorView& input, const TensorView* targets) {
    ++knobs_->forward_calls;
    return inner_.forward(input, targets);
  }
  Result<Tensor> backward(const TensorView& input, const TensorView& grad, const TensorView* targets) {
    ++knobs_->backward_calls;
    knobs_->signals->notify();
    if (knobs_->slow_backwards.fetch_sub(1) > 0) knobs_->hold();
    return inner_.backward(input, grad, targets);
  }
  std::vector<StageParameterView> parameter_views() { return inner_.parameter_views(); }
  Status zero_grad() { return inner_.zero_grad(); }

 private:
  MlpStage inner_;
  std::shared_ptr<Knobs> knobs_;
};
static_assert(Stage<SlowStage>);

using SlowPeer = Peer<SlowStage, ZmqTransport, InProcessRegistry, compression::StandardCodecs>;
constexpr mlp::MlpLayerConfig kFirstLayer{.in = 3, .out = 5, .gelu = true};
constexpr int64_t kRows = 4;

Tensor random_tensor(Shape shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  Tensor t = *Tensor::empty(shape, DType::f32);
  for (float& v : t.span<float>()) v = normal(rng);
  return t;
}

// A solo-mode peer that never steps on its own here, so every accepted sample stays pending.
std::unique_ptr<SlowPeer> start_peer(InProcessRegistry* registry, const std::string& id,
                                     std::shared_ptr<Knobs> knobs, mlp::MlpLayerConfig layer = kFirstLayer,
                                     int stage = 0) {
  PeerConfig config;
  config.stage_index = stage;
  config.peer_id = id;
  config.bind_address = "tcp://127.0.0.1:*";
  config.codec = CodecId::none;
  config.step_every_samples = 1 << 20;
  config.announce_period_seconds = 0.05;
  auto peer = std::make_unique<SlowPeer>(config, SlowStage(*MlpStage::create(layer, 5), std::move(knobs)), registry);
  REQUIRE(peer->start().is_ok());
  return peer;
}

// One request to stage 0 as a trainer would send it; the reply's status.
class RawClient {
 public:
  explicit RawClient(const std::string& address) : client_(ZmqTransport::connect(address, {}).value()) {}

  // As a trainer sends it: after its forward, at this peer, from this client (a
  // peer takes a backward only for a forward it served the caller).
  Status backward(uint64_t microbatch, int64_t deadline_ms) {
    if (Status forwarded = forward(microbatch, protocol::unix_millis_now() + 20'000); !forwarded.is_ok()) {
      return forwarded;
    }
    protocol::StageRequest request{wire::MessageKind::backward, next_id_++, protocol::raw_tensor(input_),
                                   protocol::raw_tensor(grad_), std::nullopt, microbatch, deadline_ms};
    return send(request);
  }
  // A backward with no forward sent first: `other_input` sends other bytes as its input.
  Status backward_only(uint64_t microbatch, bool other_input = false) {
    const Tensor input = other_input ? random_tensor(Shape{kRows, kFirstLayer.in}, 3) : input_;
    protocol::StageRequest request{wire::MessageKind::backward, next_id_++, protocol::raw_tensor(input),
                                   protocol::raw_tensor(grad_), std::nullopt, microbatch,
                                   protocol::unix_millis_now() + 20'000};
    return send(request);
  }
  Status forward(uint64_t microbatch, int64_t deadline_ms) {
    protocol::StageRequest request{wire::MessageKind::forward, next_id_++, protocol::raw_tensor(input_),
                                   std::nullopt, std::nullopt, microbatch, deadline_ms};
    return send(request);
  }

 private:
  Status send(const protocol::StageRequest& request) {
    auto frames = protocol::encode_request(request, 0, CodecId::none);
    REQUIRE(frames.is_ok());
    auto reply = client_.call(std::move(frames).value(), Clock::now() + 20s).get();
    if (!reply.is_ok()) return reply.status();
    return protocol::parse_reply(*reply, wire::Limits{}, /*has_loss=*/false).status();
  }

  ZmqClient client_;
  Tensor input_ = random_tensor(Shape{kRows, kFirstLayer.in}, 1);
  Tensor grad_ = random_tensor(Shape{kRows, kFirstLayer.out}, 2);
  uint64_t next_id_ = 1;
};

int64_t in_ms(int64_t ms) { return protocol::unix_millis_now() + ms; }

TEST_CASE("a peer accumulates a microbatch's backward once; a second one is an error reply, counted") {
  InProcessRegistry registry;
  auto knobs = std::make_shared<Knobs>();
  auto peer = start_peer(&registry, "dedup-peer", knobs);
  RawClient client(peer->address());

  CHECK(client.backward(0x77, in_ms(10'000)).is_ok());
  Status again = client.backward(0x77, in_ms(10'000));  // a retry whose first reply was lost
  CHECK(again.code() == StatusCode::already_exists);
  CHECK(again.message().find("already accumulated") != std::string::npos);
  CHECK(client.backward(0x78, in_ms(10'000)).is_ok());

  const PeerStats stats = peer->stats();
  CHECK(stats.ledger.samples_accumulated_total == 2 * kRows);
  CHECK(stats.ledger.samples_pending == 2 * kRows);
  CHECK(stats.ledger.backward_duplicates_refused == 1);
  CHECK(stats.ledger.unaccounted() == 0);
  CHECK(stats.backward == 2);
  CHECK(knobs->backward_calls == 2);  // refused before any compute
}

TEST_CASE("a peer takes a backward only for a forward it served the same caller, with the same input, once") {
  InProcessRegistry registry;
  auto knobs = std::make_shared<Knobs>();
  auto peer = start_peer(&registry, "binding-peer", knobs);
  RawClient alice(peer->address()), mallory(peer->address());

  CHECK(mallory.backward_only(0x21).code() == StatusCode::permission_denied);  // never forwarded
  REQUIRE(alice.forward(0x22, in_ms(10'000)).is_ok());
  CHECK(mallory.backward_only(0x22).code() == StatusCode::permission_denied);  // alice's forward
  CHECK(alice.backward_only(0x22, /*other_input=*/true).code() == StatusCode::permission_denied);
  CHECK(alice.backward_only(0x22).is_ok());
  CHECK(alice.backward_only(0x22).code() == StatusCode::permission_denied);  // spent

  const PeerStats stats = peer->stats();
  CHECK(stats.backward_unbound == 3);
  CHECK(stats.backward_other_input == 1);
  CHECK(stats.ledger.samples_accumulated_total == kRows);
  CHECK(knobs->backward_calls == 1);  // refused before any compute
}

TEST_CASE("a peer drops work whose deadline passed, before or during its compute, and refuses a far deadline") {
  InProcessRegistry registry;
  auto knobs = std::make_shared<Knobs>();
  auto peer = start_peer(&registry, "deadline-peer", knobs);
  RawClient client(peer->address());

  CHECK(client.forward(0x10, in_ms(-1)).code() == StatusCode::deadline_exceeded);
  CHECK(client.backward(0x11, in_ms(-1)).code() == StatusCode::deadline_exceeded);
  CHECK(knobs->forward_calls == 1);  // 0x11's forward (RawClient::backward sends it first), not the refused ones
  CHECK(knobs->backward_calls == 0);

  // The deadline passes while the stage computes: not accumulated.
  const int64_t deadline = in_ms(300);
  knobs->hold_past_unix_ms = deadline;
  knobs->slow_backwards = 1;
  Status late = client.backward(0x12, deadline);
  CHECK(late.code() == StatusCode::deadline_exceeded);
  CHECK(late.message().find("not accumulated") != std::string::npos);
  CHECK(knobs->backward_calls == 1);

  Status far = client.backward(0x13, in_ms(protocol::kMaxDeadlineAheadMs + 60'000));
  CHECK(far.code() == StatusCode::invalid_argument);
  CHECK(client.backward(0x14, 0).code() == StatusCode::invalid_argument);  // no deadline at all
  CHECK(client.backward(0, in_ms(10'000)).code() == StatusCode::invalid_argument);  // no microbatch id
  CHECK(knobs->backward_calls == 1);

  PeerStats stats = peer->stats();
  CHECK(stats.ledger.expired_dropped == 3);
  CHECK(stats.ledger.deadline_refused == 1);
  CHECK(stats.spec_refused == 2);
  CHECK(stats.ledger.samples_accumulated_total == 0);
  CHECK(stats.backward == 0);

  // A dropped backward was never accumulated, so its retry (same id, a new deadline) is.
  CHECK(client.backward(0x12, in_ms(10'000)).is_ok());
  stats = peer->stats();
  CHECK(stats.ledger.samples_accumulated_total == kRows);
  CHECK(stats.ledger.backward_duplicates_refused == 0);
  CHECK(stats.ledger.unaccounted() == 0);
}

// ---- the replica itself: the gradients, not just the counts ----

using SlowReplica = Replica<SlowStage>;

std::vector<float> gradients_of(SlowReplica& replica) {
  return replica.exclusive([](SlowStage& stage) { return *flatten_gradients(stage, 1.0); });
}

struct ReplicaFixture {
  std::shared_ptr<Knobs> knobs = std::make_shared<Knobs>();
  SlowReplica replica{0, SlowStage(*MlpStage::create(kFirstLayer, 5), knobs), optim::OptimizerConfig{}};
  Tensor input = random_tensor(Shape{kRows, kFirstLayer.in}, 3);
  Tensor grad = random_tensor(Shape{kRows, kFirstLayer.out}, 4);

  Status backward(uint64_t id, int64_t deadline_ms) {
    return replica.backward(input, grad, BackwardTicket{id, deadline_ms, kRows, nullptr}).status();
  }
};

bool all_zero(const std::vector<float>& values) {
  return std::all_of(values.begin(), values.end(), [](float v) { return v == 0.0f; });
}

TEST_CASE("a backward that outlives its deadline leaves the gradients exactly as they were") {
  ReplicaFixture f;
  int64_t deadline = in_ms(100);
  f.knobs->hold_past_unix_ms = deadline;
  f.knobs->slow_backwards = 1;
  CHECK(f.backward(1, deadline).code() == StatusCode::deadline_exceeded);
  CHECK(all_zero(gradients_of(f.replica)));  // the first of a step: nothing to keep but zeros

  REQUIRE(f.backward(2, in_ms(10'000)).is_ok());
  const std::vector<float> one = gradients_of(f.replica);
  REQUIRE_FALSE(all_zero(one));
  deadline = in_ms(100);
  f.knobs->hold_past_unix_ms = deadline;
  f.knobs->slow_backwards = 1;
  CHECK(f.backward(3, deadline).code() == StatusCode::deadline_exceeded);
  CHECK(gradients_of(f.replica) == one);  // bit for bit
  CHECK(f.backward(2, in_ms(10'000)).code() == StatusCode::already_exists);
  CHECK(gradients_of(f.replica) == one);

  // An emulated machine's extra time counts toward its deadline.
  bool emulated = false;
  const int64_t sleepy_deadline = in_ms(100);
  auto sleepy = BackwardTicket{4, sleepy_deadline, kRows, [&] {
                                 emulated = true;
                                 wait_past(sleepy_deadline);
                               }};
  CHECK(f.replica.backward(f.input, f.grad, sleepy).status().code() == StatusCode::deadline_exceeded);
  CHECK(emulated);
  CHECK(gradients_of(f.replica) == one);

  const protocol::SampleLedger ledger = f.replica.sample_ledger();
  CHECK(ledger.samples_accumulated_total == kRows);
  CHECK(ledger.expired_dropped == 3);
  CHECK(ledger.backward_duplicates_refused == 1);
  CHECK(f.replica.accumulated_samples() == kRows);
}

TEST_CASE("the ledger follows every sample: into a round, then stepped, lost with the round, or non-finite") {
  ReplicaFixture f;
  const optim::LrSchedule schedule{.peak_lr = 1e-2f};
  uint64_t id = 1;
  auto accumulate = [&](int microbatches) {
    for (int i = 0; i < microbatches; ++i) REQUIRE(f.backward(id++, in_ms(10'000)).is_ok());
  };
  const auto check_balanced = [&] { CHECK(f.replica.sample_ledger().unaccounted() == 0); };

  accumulate(2);
  auto taken = *f.replica.take_gradients();
  CHECK(taken.samples == 2 * kRows);  // the count of exactly the gradients taken
  CHECK(f.replica.sample_ledger().samples_in_round == 2 * kRows);
  accumulate(1);  // arrives during the round: toward the next step
  REQUIRE(f.replica.apply_global_step(taken.mean, schedule).is_ok());
  CHECK(f.replica.sample_ledger().samples_stepped == 2 * kRows);
  CHECK(f.replica.sample_ledger().samples_pending == kRows);
  check_balanced();

  taken = *f.replica.take_gradients();
  f.replica.lose_round_samples();
  CHECK(f.replica.sample_ledger().samples_lost_failed_round == kRows);
  check_balanced();

  accumulate(1);
  taken = *f.replica.take_gradients();
  std::vector<float> poisoned(taken.mean.size(), std::nanf(""));
  CHECK_FALSE(f.replica.apply_global_step(poisoned, schedule).is_ok());
  CHECK(f.replica.sample_ledger().samples_lost_nonfinite == kRows);
  check_balanced();

  accumulate(2);
  auto state = f.replica.checkpoint();
  REQUIRE(state.is_ok());
  REQUIRE(f.replica.load(*state).is_ok());  // a re-sync drops what was accumulated
  const protocol::SampleLedger ledger = f.replica.sample_ledger();
  CHECK(ledger.samples_lost_resync == 2 * kRows);
  CHECK(ledger.samples_pending == 0);
  CHECK(ledger.samples_accumulated_total == 6 * kRows);
  check_balanced();
}

// One backward accumulated and taken into a round, with requests that arrive
// meanwhile waiting for its step (30 s at most).
// A forward on its own thread, and the global step the replica was at when it returned.
class ForwardInThread {
 public:
  explicit ForwardInThread(ReplicaFixture& f)
      : thread_([this, &f] {
          CHECK(f.replica.forward(f.input, nullptr).is_ok());
          std::lock_guard lock(mu_);
          step_ = f.replica.step();
          cv_.notify_all();
        }) {}
  ~ForwardInThread() {
    if (thread_.joinable()) thread_.join();
  }
  bool returned_within(Clock::duration wait) {
    std::unique_lock lock(mu_);
    return cv_.wait_until(lock, Clock::now() + wait, [&] { return step_ >= 0; });
  }
  int64_t step_seen() {  // waits for it to return
    thread_.join();
    std::lock_guard lock(mu_);
    return step_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t step_ = -1;
  std::thread thread_;  // last: it starts once the members above exist
};

SlowReplica::Gradients open_round(ReplicaFixture& f) {
  f.replica.wait_for_round_step(30);
  REQUIRE(f.backward(1, in_ms(10'000)).is_ok());
  return *f.replica.take_gradients();
}

// Without the wait, a backward that lands between take_gradients and the round's
// step was computed at the weights before the step and applied after it: with 2
// peers per stage, a third to a half of every global batch one step stale.
TEST_CASE("a backward during a round waits for the round's step, so its gradient is taken at the new weights") {
  ReplicaFixture f;
  const optim::LrSchedule schedule{.peak_lr = 1e-2f};
  auto taken = open_round(f);
  const int calls_before = f.knobs->backward_calls.load();
  std::atomic<int64_t> computed_at{-1};
  std::thread during([&] {
    const BackwardTicket ticket{2, in_ms(10'000), kRows, [&] { computed_at = f.replica.step(); }};
    CHECK(f.replica.backward(f.input, f.grad, ticket).is_ok());
  });
  {
    // It must not start computing while the round is open (the old code did at once).
    std::unique_lock lock(f.knobs->signals->mu);
    const bool started = f.knobs->signals->changed.wait_until(
        lock, Clock::now() + 300ms, [&] { return f.knobs->backward_calls.load() > calls_before; });
    CHECK_FALSE(started);
  }
  REQUIRE(f.replica.apply_global_step(taken.mean, schedule).is_ok());
  during.join();
  CHECK(computed_at.load() == 1);  // after the step, at its weights
  CHECK(f.replica.sample_ledger().samples_pending == kRows);

  // Bounded: a round that never ends (a silent member) holds a backward only that long.
  f.replica.wait_for_round_step(0.2);
  taken = *f.replica.take_gradients();
  const auto start = Clock::now();
  CHECK(f.backward(3, in_ms(10'000)).is_ok());
  CHECK(Clock::now() - start >= 200ms);
  CHECK(f.replica.step() == 1);  // the round is still open: computed at the old weights after all
  f.replica.lose_round_samples();
}

// Before: a forward during a round ran at once, at the weights before the step, and
// the backward that followed recomputed at the new ones from a grad_output the
// next stage took at the old.
TEST_CASE("a forward during a round waits for the round's step too; an aborted round lets waiters go") {
  ReplicaFixture f;
  const optim::LrSchedule schedule{.peak_lr = 1e-2f};
  auto taken = open_round(f);
  ForwardInThread during(f);
  CHECK_FALSE(during.returned_within(300ms));
  REQUIRE(f.replica.apply_global_step(taken.mean, schedule).is_ok());
  CHECK(during.step_seen() == 1);

  // A round that ends without a step keeps its gradient for the next attempt, and
  // lets the work waiting on it go at once, not after the bound.
  taken = *f.replica.take_gradients();
  f.replica.round_aborted();
  const auto start = Clock::now();
  CHECK(f.replica.forward(f.input, nullptr).is_ok());
  CHECK(f.backward(2, in_ms(10'000)).is_ok());
  CHECK(Clock::now() - start < 10s);
}

// Before: a forward that came while the replica held gradients for the next round
// ran at once, on the weights that round was about to replace (58% of the 2-peer
// main job's microbatches ran their forward a global step before their backward).
TEST_CASE("a forward waits, briefly, for a round to take the gradients pending here, then for its step") {
  ReplicaFixture f;
  const optim::LrSchedule schedule{.peak_lr = 1e-2f};
  f.replica.wait_for_round_step(30);
  f.replica.hold_forwards_for_pending(30);
  REQUIRE(f.backward(1, in_ms(10'000)).is_ok());  // pending, no round yet
  ForwardInThread during(f);
  CHECK_FALSE(during.returned_within(300ms));
  const auto taken = *f.replica.take_gradients();
  CHECK_FALSE(during.returned_within(100ms));  // taken, not stepped: it waits on, now for the step
  REQUIRE(f.replica.apply_global_step(taken.mean, schedule).is_ok());
  CHECK(during.step_seen() == 1);

  // Nothing pending: no wait. Pending with no round coming: only as long as the bound.
  auto start = Clock::now();
  CHECK(f.replica.forward(f.input, nullptr).is_ok());
  CHECK(Clock::now() - start < 10s);
  f.replica.hold_forwards_for_pending(0.2);
  REQUIRE(f.backward(2, in_ms(10'000)).is_ok());
  start = Clock::now();
  CHECK(f.replica.forward(f.input, nullptr).is_ok());
  CHECK(Clock::now() - start >= 200ms);
  CHECK(f.replica.step() == 1);
}

// Before: a round of two global batches applied one update at the second's
// learning rate, moving the stage as far as one batch would.
TEST_CASE("a round that counts for two global steps applies two updates, as two rounds of one would") {
  const optim::LrSchedule schedule{.peak_lr = 1e-2f, .warmup_steps = 4};
  ReplicaFixture once, twice;
  for (ReplicaFixture* f : {&once, &twice}) REQUIRE(f->backward(1, in_ms(10'000)).is_ok());
  const auto taken_once = *once.replica.take_gradients();
  const auto taken_twice = *twice.replica.take_gradients();
  REQUIRE(taken_once.mean == taken_twice.mean);
  REQUIRE(once.replica.apply_global_step(taken_once.mean, schedule, 2).is_ok());
  REQUIRE(twice.replica.apply_global_step(taken_twice.mean, schedule, 1).is_ok());
  REQUIRE(twice.replica.apply_global_step(taken_twice.mean, schedule, 1).is_ok());
  CHECK(once.replica.step() == 2);
  CHECK(once.replica.optimizer_steps() == 2);
  CHECK(once.replica.params_hash() == twice.replica.params_hash());
}

TEST_CASE("the replica remembers a bounded number of microbatch ids, oldest forgotten first") {
  ReplicaFixture f;
  const uint64_t kept = SlowReplica::kRememberedMicrobatches;
  for (uint64_t id = 1; id <= kept + 1; ++id) REQUIRE(f.backward(id, in_ms(60'000)).is_ok());
  CHECK(f.backward(kept + 1, in_ms(60'000)).code() == StatusCode::already_exists);
  CHECK(f.backward(2, in_ms(60'000)).code() == StatusCode::already_exists);
  CHECK(f.backward(1, in_ms(60'000)).is_ok());  // the oldest, forgotten
}

// ---- a trainer against a peer slower than its backward timeout ----

TEST_CASE("a backward retried elsewhere after a timeout is accumulated by one peer of the stage only") {
  InProcessRegistry registry;
  auto slow_knobs = std::make_shared<Knobs>();
  auto fast_knobs = std::make_shared<Knobs>();
  auto last_knobs = std::make_shared<Knobs>();
  // The slow peer holds a backward until the trainer, past its timeout (and so past the
  // request's deadline), has retried it at the fast peer.
  fast_knobs->signals = slow_knobs->signals;
  slow_knobs->release = [fast = fast_knobs.get(), seen = std::make_shared<int>(-1)] {
    if (*seen < 0) *seen = fast->backward_calls;
    if (fast->backward_calls <= *seen) return false;
    *seen = -1;  // the next held backward waits for the next retry
    return true;
  };
  slow_knobs->slow_backwards = 2;
  auto slow = start_peer(&registry, "stage0-slow", slow_knobs);
  auto fast = start_peer(&registry, "stage0-fast", fast_knobs);
  auto last = start_peer(&registry, "stage1", last_knobs, {.in = kFirstLayer.out, .out = 1, .loss = true}, 1);

  TrainerConfig config;
  config.codec = CodecId::none;
  config.backward_timeout_seconds = 0.5;
  Trainer<RoundRobinRouter, ZmqTransport, InProcessRegistry, compression::StandardCodecs> trainer(
      config, std::vector<RoundRobinRouter>(2), &registry);
  constexpr int kMicrobatches = 12;
  for (int i = 0; i < kMicrobatches; ++i) {
    Tensor x = random_tensor(Shape{kRows, kFirstLayer.in}, 10 + i);
    Tensor y = random_tensor(Shape{kRows, 1}, 100 + i);
    MicrobatchOutcome outcome = trainer.run_microbatch(x, y);
    REQUIRE_MESSAGE(outcome.completed, outcome.abandon_reason);
  }
  const Ledger ledger = trainer.ledger();
  CHECK(ledger.samples_completed == kMicrobatches * kRows);
  CHECK(ledger.retries > 0);
  // The slow peer finishes its late backwards after the trainer gave up on them:
  // wait (bounded) until it has, so the check below sees their fate.
  REQUIRE(slow->wait_for_stats([](const PeerStats& s) { return s.ledger.expired_dropped >= 1; },
                               Clock::now() + 10s));
  const auto a = slow->stats().ledger;
  const auto b = fast->stats().ledger;
  MESSAGE("slow peer accumulated " << a.samples_accumulated_total << " (dropped " << a.expired_dropped
                                   << " expired), fast peer " << b.samples_accumulated_total);
  CHECK(a.samples_accumulated_total + b.samples_accumulated_total == ledger.samples_completed);
  CHECK(last->stats().ledger.samples_accumulated_total == ledger.samples_completed);
  CHECK(a.unaccounted() == 0);
  CHECK(b.unaccounted() == 0);
}

}  // namespace
}  // namespace swarm
