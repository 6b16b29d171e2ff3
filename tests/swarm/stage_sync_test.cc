// Stage synchronization with real Peers and a Trainer in one process (in-process
// transport and registry): a 2-stage x 2-peer swarm matches single-process training
// on the same global batch; a peer killed mid-all-reduce is dropped and the others
// stay identical; a joiner downloads the state (finishing from a second donor when
// the first dies) and serves only once its hash matches; a swarm with 4-bit
// activations and 8-bit gradients sends each in its codec and stays identical.
#include <atomic>
#include <limits>
#include <random>
#include <thread>

#include <doctest/doctest.h>

#include "kernels/cpu/cpu_backend.h"
#include "models/gpt/gpt_model.h"
#include "models/gpt/gpt_stage.h"
#include "tests/swarm/tiny_gpt.h"
#include "swarm/compression/codecs.h"
#include "swarm/optim/lr_schedule.h"
#include "swarm/peer/peer.h"
#include "swarm/registry/in_process_registry.h"
#include "swarm/trainer/trainer.h"
#include "swarm/wiring/baseline_routers.h"
#include "transports/inproc/inproc_transport.h"

namespace swarm {
namespace {

using Stage = gpt::GptStage<CpuBackend>;
using GptPeer = Peer<Stage, InprocTransport, InProcessRegistry, compression::StandardCodecs>;
using RrTrainer = Trainer<RoundRobinRouter, InprocTransport, InProcessRegistry, compression::StandardCodecs>;

constexpr int kRows = 2;            // sequences per microbatch
constexpr int kMicrobatches = 4;    // per global step
constexpr float kLearningRate = 1e-2f;

gpt::GptConfig tiny_config() { return testing::tiny_gpt_config(); }

optim::OptimizerConfig no_clip() {
  optim::OptimizerConfig o;  // the paper's LAMB: beta2 0.95, weight decay 0.01
  // Clipping is per stage in a swarm and over the whole model in one process; off, the two are the same math.
  o.clip_norm = 0;
  return o;
}

PeerConfig sync_config(int stage, const std::string& id) {
  PeerConfig config;
  config.stage_index = stage;
  config.peer_id = id;
  config.bind_address = "inproc://" + id;
  config.announce_period_seconds = 0.05;
  config.announce_ttl_seconds = 1.0;
  config.global_batch_samples = kRows * kMicrobatches;
  config.start_on_estimated_arrival = false;  // steps close on exact sample counts
  config.progress_period_seconds = 0.02;
  config.progress_stale_seconds = 1.0;
  config.gather_timeout_seconds = 1.0;
  config.all_reduce.part_timeout_seconds = 1.0;
  config.all_reduce.ping_timeout_seconds = 0.5;
  config.all_reduce.round_timeout_seconds = 10.0;
  config.optimizer = no_clip();
  config.learning_rate = kLearningRate;
  config.codec = CodecId::none;  // equivalence with one process is exact only without compression
  return config;
}

std::unique_ptr<GptPeer> start_peer(InProcessRegistry* registry, PeerConfig config) {
  auto layouts = *gpt::partition_layers(tiny_config(), 2);
  const int stage = config.stage_index;
  auto peer = std::make_unique<GptPeer>(std::move(config), *Stage::create(tiny_config(), layouts[stage], 7), registry);
  REQUIRE(peer->start().is_ok());
  return peer;
}

void pattern_batch(std::mt19937& rng, int rows, Tensor* tokens, Tensor* targets) {
  const int T = tiny_config().max_seq_len;
  *tokens = *Tensor::empty(Shape{rows, T}, DType::i32);
  *targets = *Tensor::empty(Shape{rows, T}, DType::i32);
  for (int b = 0; b < rows; ++b) {
    const int offset = static_cast<int>(rng() % 8);
    const int stride = 1 + static_cast<int>(rng() % 3);
    for (int t = 0; t < T; ++t) {
      tokens->data<int32_t>()[b * T + t] = (offset + stride * t) % 16;
      targets->data<int32_t>()[b * T + t] = (offset + stride * (t + 1)) % 16;
    }
  }
}

Deadline seconds_from_now(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// Waits, with a deadline, until every peer is at `step` and serving (or dead).
bool wait_for_step(const std::vector<GptPeer*>& peers, int64_t step, double seconds = 20) {
  const Deadline deadline = seconds_from_now(seconds);
  for (GptPeer* p : peers) {
    const bool reached = p->wait_for_stats(
        [&](const PeerStats& s) { return p->dead() || (s.global_step >= step && s.serving); }, deadline);
    if (!reached) return false;
  }
  return true;
}

// One global batch of pattern microbatches through the trainer, then every peer at `step`.
void train_global_step(RrTrainer& trainer, std::mt19937& rng, const std::vector<GptPeer*>& peers, int step) {
  for (int m = 0; m < kMicrobatches; ++m) {
    Tensor tokens, targets;
    pattern_batch(rng, kRows, &tokens, &targets);
    auto outcome = trainer.run_microbatch(tokens, targets);
    REQUIRE_MESSAGE(outcome.completed, outcome.abandon_reason);
  }
  REQUIRE_MESSAGE(wait_for_step(peers, step), "the swarm did not take global step " << step);
}

std::vector<float> stage_parameters(Stage& stage) {
  std::vector<float> out;
  for (auto& view : stage.parameter_views()) {
    auto span = view.value.span<const float>();
    out.insert(out.end(), span.begin(), span.end());
  }
  return out;
}

TEST_CASE("a 2-stage x 2-peer swarm matches single-process training on the same global batch") {
  constexpr int kSteps = 3;
  InProcessRegistry registry;
  auto s0a = start_peer(&registry, sync_config(0, "eq-s0a"));
  auto s0b = start_peer(&registry, sync_config(0, "eq-s0b"));
  auto s1a = start_peer(&registry, sync_config(1, "eq-s1a"));
  auto s1b = start_peer(&registry, sync_config(1, "eq-s1b"));
  std::vector<GptPeer*> peers{s0a.get(), s0b.get(), s1a.get(), s1b.get()};
  TrainerConfig trainer_config;
  trainer_config.refresh_period_seconds = 0.05;
  trainer_config.codec = CodecId::none;
  RrTrainer trainer(trainer_config, std::vector<RoundRobinRouter>(2), &registry);

  // The reference: the same model, trained in one process on the whole global batch at once.
  auto reference = *gpt::GptModel<CpuBackend>::create(tiny_config(), *gpt::partition_layers(tiny_config(), 2), 7);
  std::vector<optim::Lamb> reference_optimizers(2, optim::Lamb(no_clip()));
  const optim::LrSchedule schedule{.peak_lr = kLearningRate};

  std::mt19937 rng(11);
  std::vector<double> swarm_losses, reference_losses;
  for (int step = 1; step <= kSteps; ++step) {
    const int T = tiny_config().max_seq_len;
    Tensor all_tokens = *Tensor::empty(Shape{kRows * kMicrobatches, T}, DType::i32);
    Tensor all_targets = *Tensor::empty(Shape{kRows * kMicrobatches, T}, DType::i32);
    double loss_sum = 0;
    for (int m = 0; m < kMicrobatches; ++m) {
      Tensor tokens, targets;
      pattern_batch(rng, kRows, &tokens, &targets);
      std::memcpy(all_tokens.data<int32_t>() + m * kRows * T, tokens.data<int32_t>(), tokens.size_bytes());
      std::memcpy(all_targets.data<int32_t>() + m * kRows * T, targets.data<int32_t>(), targets.size_bytes());
      auto outcome = trainer.run_microbatch(tokens, targets);
      REQUIRE_MESSAGE(outcome.completed, outcome.abandon_reason);
      loss_sum += outcome.loss;
    }
    swarm_losses.push_back(loss_sum / kMicrobatches);
    REQUIRE_MESSAGE(wait_for_step(peers, step), "the swarm did not take global step " << step);

    REQUIRE(reference.zero_grad().is_ok());
    auto loss = reference.forward_backward(all_tokens, all_targets);
    REQUIRE(loss.is_ok());
    reference_losses.push_back(*loss);
    for (int s = 0; s < 2; ++s) {
      std::vector<optim::ParamRef> refs;
      for (auto& view : reference.stages()[s].parameter_views()) {
        refs.push_back({view.name, view.value, view.grad, view.apply_weight_decay});
      }
      REQUIRE(reference_optimizers[s].step(refs, schedule.lr_at(step)).is_ok());
    }
  }
  // Both replicas of each stage: bit-identical to each other, and within reduction-order tolerance of the reference.
  for (int s = 0; s < 2; ++s) {
    GptPeer* a = peers[2 * s];
    GptPeer* b = peers[2 * s + 1];
    CHECK(a->stats().params_hash == b->stats().params_hash);
    CHECK(a->stats().global_step == kSteps);
    CHECK(a->stats().rounds_completed == kSteps);
  }
  // The peers' parameters are reachable through a state snapshot; read them via the
  // hash-checked download path a joiner would use.
  ClientCache<InprocTransport> clients;
  double worst = 0, largest_change = 0;
  for (int s = 0; s < 2; ++s) {
    auto state = download_state(clients, s, {{peers[2 * s]->config().peer_id, peers[2 * s]->control_address()}},
                                StateTransferConfig{}, nullptr);
    REQUIRE_MESSAGE(state.is_ok(), state.status().to_string());
    CHECK(state->step == kSteps);
    auto initial = *Stage::create(tiny_config(), (*gpt::partition_layers(tiny_config(), 2))[s], 7);
    std::vector<float> start = stage_parameters(initial);
    std::vector<float> expect = stage_parameters(reference.stages()[s]);
    std::vector<float> got;
    for (const auto& named : state->tensors) {
      if (!named.name.starts_with(kParamPrefix)) continue;
      auto span = named.tensor.view().span<const float>();
      got.insert(got.end(), span.begin(), span.end());
    }
    REQUIRE(got.size() == expect.size());
    for (size_t i = 0; i < got.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::abs(got[i] - expect[i])));
      largest_change = std::max(largest_change, static_cast<double>(std::abs(expect[i] - start[i])));
    }
  }
  MESSAGE("max |swarm - single process| over all parameters after " << kSteps << " LAMB steps: " << worst
                                                                    << " (largest parameter change " << largest_change
                                                                    << ")");
  CHECK(largest_change > 1e-3);  // the steps really moved the weights
  CHECK(worst < 1e-5);           // the stated tolerance: float reduction order only
  for (int i = 0; i < kSteps; ++i) {
    MESSAGE("step " << i + 1 << " loss: swarm " << swarm_losses[i] << ", single process " << reference_losses[i]);
    CHECK(swarm_losses[i] == doctest::Approx(reference_losses[i]).epsilon(1e-5));
  }
  CHECK(reference_losses.back() < reference_losses.front());
}

// The sync thread ticks only every half second here. A global step needs a
// JOIN, a BEGIN, parts, DONEs and a COMMIT; were each held to the next tick, a
// step would take a second or more, and every forward that arrives meanwhile
// would run on the old weights (2 peers per stage: 90% of the first stage's
// microbatches were a step stale between forward and backward, against 47% with
// one peer per stage). A backward and a round message tick it at once.
TEST_CASE("a backward or a round message ticks the stage's protocol at once, not at the sync thread's next tick") {
  constexpr double kTick = 0.5;
  constexpr int kTimedSteps = 5;
  InProcessRegistry registry;
  std::vector<std::unique_ptr<GptPeer>> owned;
  std::vector<GptPeer*> peers;
  for (const auto& [stage, id] : std::vector<std::pair<int, std::string>>{
           {0, "tick-s0a"}, {0, "tick-s0b"}, {1, "tick-s1a"}, {1, "tick-s1b"}}) {
    PeerConfig config = sync_config(stage, id);
    config.sync_tick_seconds = kTick;
    owned.push_back(start_peer(&registry, config));
    peers.push_back(owned.back().get());
  }
  TrainerConfig trainer_config;
  trainer_config.refresh_period_seconds = 0.05;
  trainer_config.codec = CodecId::none;
  RrTrainer trainer(trainer_config, std::vector<RoundRobinRouter>(2), &registry);
  std::mt19937 rng(5);
  train_global_step(trainer, rng, peers, 1);  // serving starts at a tick
  const auto started = Clock::now();
  for (int step = 2; step <= 1 + kTimedSteps; ++step) train_global_step(trainer, rng, peers, step);
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  MESSAGE(kTimedSteps << " global steps of 2 peers per stage in " << seconds << " s, the sync thread ticking every "
                      << kTick << " s");
  CHECK(seconds < kTimedSteps * kTick);  // less than one tick per step
  for (GptPeer* p : peers) CHECK(p->stats().rounds_completed == 1 + kTimedSteps);
}

// A peer of a 4-bit activations, 8-bit gradients swarm.
PeerConfig split_codecs_config(int stage, const std::string& id) {
  PeerConfig config = sync_config(stage, id);
  config.codec = CodecId::blockwise4;
  config.gradient_codec = CodecId::blockwise8;
  return config;
}

int64_t encoded_bytes(CodecId codec, int64_t values) {
  return static_cast<int64_t>(*compression::StandardCodecs::encoded_bytes(codec, static_cast<uint64_t>(values)));
}

// One request straight to a peer, as a trainer sends it: the reply as the trainer sees it.
Result<protocol::StageReply> call_directly(GptPeer& peer, protocol::StageRequest request, uint64_t microbatch) {
  const protocol::StageSpec spec = peer.spec();
  request.microbatch_id = microbatch;
  request.deadline_unix_ms = protocol::unix_millis_now() + 10'000;
  SWARM_ASSIGN_OR_RETURN(InprocClient client, InprocTransport::connect(peer.address(), {}));
  SWARM_ASSIGN_OR_RETURN(wire::Frames frames,
                         protocol::encode_request(request, spec.stage, protocol::reply_codec_for(spec, request.kind)));
  SWARM_ASSIGN_OR_RETURN(wire::Frames reply, client.call(std::move(frames), seconds_from_now(10)).get());
  return protocol::parse_reply(reply, wire::Limits{}, spec.io.targets.has_value());
}

TEST_CASE("4-bit activations and 8-bit gradients: each crosses the wire in its codec, and the replicas agree") {
  constexpr int kSteps = 2;
  InProcessRegistry registry;
  auto s0a = start_peer(&registry, split_codecs_config(0, "gc-s0a"));
  auto s0b = start_peer(&registry, split_codecs_config(0, "gc-s0b"));
  auto s1a = start_peer(&registry, split_codecs_config(1, "gc-s1a"));
  auto s1b = start_peer(&registry, split_codecs_config(1, "gc-s1b"));
  std::vector<GptPeer*> peers{s0a.get(), s0b.get(), s1a.get(), s1b.get()};
  TrainerConfig trainer_config;
  trainer_config.refresh_period_seconds = 0.05;
  trainer_config.codec = CodecId::blockwise4;
  trainer_config.gradient_codec = CodecId::blockwise8;
  RrTrainer trainer(trainer_config, std::vector<RoundRobinRouter>(2), &registry);
  // The peers announce themselves serving once they see their stage-mates, and
  // announce before they count as serving.
  REQUIRE_MESSAGE(wait_for_step(peers, 0), "the peers did not start serving");
  const Status checked = trainer.check_stages();
  REQUIRE_MESSAGE(checked.is_ok(), checked.to_string());

  std::mt19937 rng(13);
  for (int step = 1; step <= kSteps; ++step) train_global_step(trainer, rng, peers, step);
  for (int s = 0; s < 2; ++s) {
    CHECK(peers[2 * s]->stats().params_hash == peers[2 * s + 1]->stats().params_hash);
    CHECK(peers[2 * s]->stats().global_step == kSteps);
  }

  // Per microbatch: tokens twice and targets once (raw i32); the activation out of
  // stage 0 and into stage 1 (4-bit); the input gradient out of stage 1 and into
  // stage 0 (8-bit); d_loss and the loss (raw f32).
  const int64_t ints = int64_t{kRows} * tiny_config().max_seq_len;
  const int64_t floats = ints * tiny_config().d_model;
  const int64_t in_four = encoded_bytes(CodecId::blockwise4, floats);
  const int64_t in_eight = encoded_bytes(CodecId::blockwise8, floats);
  const double four = static_cast<double>(in_four) / static_cast<double>(floats);
  const double eight = static_cast<double>(in_eight) / static_cast<double>(floats);
  const WireVolume wire = trainer.wire_volume();
  const double per_value = static_cast<double>(wire.bytes) / static_cast<double>(wire.values);
  MESSAGE("pipeline: " << per_value << " bytes/value; 4bit " << four << ", 8bit " << eight);
  CHECK(per_value > four);
  CHECK(per_value < eight);
  const Ledger ledger = trainer.ledger();
  if (ledger.retries == 0) {  // a retry sends a request twice
    CHECK(wire.bytes == ledger.completed * (3 * ints * 4 + 2 * in_four + 2 * in_eight + 2 * 4));
    CHECK(wire.values == ledger.completed * (3 * ints + 4 * floats + 2));
  }
  // The all-reduce parts stay in the activation codec.
  for (GptPeer* p : peers) {
    const PeerStats stats = p->stats();
    REQUIRE(stats.allreduce_values > 0);
    CHECK(static_cast<double>(stats.allreduce_bytes) / static_cast<double>(stats.allreduce_values) < (four + eight) / 2);
  }

  // What the peers reply: a forward's output in 4-bit, a backward's input gradient in 8-bit.
  Tensor tokens, targets;
  pattern_batch(rng, kRows, &tokens, &targets);
  auto output = call_directly(*s0a, {wire::MessageKind::forward, 1, protocol::raw_tensor(tokens), {}, {}}, 0x6C01);
  REQUIRE_MESSAGE(output.is_ok(), output.status().to_string());
  REQUIRE(output->tensor.has_value());
  CHECK(output->tensor->codec == CodecId::blockwise4);
  Tensor d_loss = *Tensor::empty(Shape{1}, DType::f32);
  d_loss.data<float>()[0] = 1.0f;
  auto gradient = call_directly(*s1a,
                                {wire::MessageKind::backward, 2, *output->tensor, protocol::raw_tensor(d_loss),
                                 protocol::raw_tensor(targets)},
                                0x6C02);
  REQUIRE_MESSAGE(gradient.is_ok(), gradient.status().to_string());
  REQUIRE(gradient->tensor.has_value());
  CHECK(gradient->tensor->codec == CodecId::blockwise8);
  CHECK(trainer.ledger().abandoned == 0);
}

TEST_CASE("a peer killed mid-all-reduce is dropped; a joiner syncs from a second donor when the first dies") {
  InProcessRegistry registry;
  auto donor_dies = sync_config(0, "ft-a");
  donor_dies.test_die_after_state_chunks = 2;
  auto dies_in_round = sync_config(0, "ft-c");
  dies_in_round.test_die_after_allreduce_sends = 1;
  auto a = start_peer(&registry, donor_dies);
  auto b = start_peer(&registry, sync_config(0, "ft-b"));
  auto c = start_peer(&registry, dies_in_round);
  auto z = start_peer(&registry, sync_config(1, "ft-z"));
  TrainerConfig trainer_config;
  trainer_config.codec = CodecId::none;
  trainer_config.refresh_period_seconds = 0;  // every hop sees the registry as it is: the joiner at once
  trainer_config.forward_timeout_seconds = 2;
  trainer_config.backward_timeout_seconds = 2;
  RrTrainer trainer(trainer_config, std::vector<RoundRobinRouter>(2), &registry);
  std::mt19937 rng(3);
  auto train_one_global_batch = [&] {
    for (int m = 0; m < kMicrobatches; ++m) {
      Tensor tokens, targets;
      pattern_batch(rng, kRows, &tokens, &targets);
      auto outcome = trainer.run_microbatch(tokens, targets);
      REQUIRE_MESSAGE(outcome.completed, outcome.abandon_reason);
    }
  };

  train_one_global_batch();
  const auto round_started = Clock::now();
  // The round c dies in is aborted: nobody steps, a and b keep their gradients.
  // The samples c held died with it, so the stage steps once a and b hold a
  // global batch between them: one more batch of microbatches gives them that.
  REQUIRE(a->wait_for_stats([](const PeerStats& s) { return s.rounds_failed >= 1; }, seconds_from_now(20)));
  CHECK(a->stats().global_step == 0);
  CHECK(b->stats().global_step == 0);
  train_one_global_batch();
  REQUIRE(wait_for_step({a.get(), b.get(), c.get(), z.get()}, 1));
  const double round_seconds = std::chrono::duration<double>(Clock::now() - round_started).count();
  CHECK(c->dead());
  CHECK(a->stats().rounds_completed == 1);
  CHECK(b->stats().rounds_completed == 1);
  CHECK(a->stats().params_hash == b->stats().params_hash);
  CHECK(round_seconds < a->config().all_reduce.round_timeout_seconds);
  MESSAGE("the two survivors finished the round in " << round_seconds << " s");

  // A joiner: it must download step 1's state before it serves. Donors are asked
  // freshest first, and ft-a and ft-b publish at the same step, so either may be
  // asked first. ft-a dies serving its second chunk: asked first, ft-b finishes the
  // download from where it stopped. (tests/averaging covers the resume itself
  // deterministically.)
  auto joiner_config = sync_config(0, "ft-d");
  joiner_config.state_transfer.chunk_bytes = 4096;
  auto d = start_peer(&registry, joiner_config);
  REQUIRE(d->wait_for_stats([](const PeerStats& s) { return s.serving; }, seconds_from_now(20)));
  const PeerStats joined = d->stats();
  CHECK(joined.state_downloads == 1);
  // The round after c died held about 1.7 global batches (a's and b's share of the
  // first, and the second): it counts for as many global steps as it holds batches.
  const int64_t survivors_step = b->stats().global_step;
  CHECK(survivors_step >= 1);
  CHECK(joined.global_step == survivors_step);
  CHECK(joined.params_hash == b->stats().params_hash);
  CHECK(joined.forward + joined.backward == 0);  // verified before serving anything
  CHECK(joined.states_refused == 0);
  if (a->dead()) {
    CHECK(joined.last_download_donors == 2);
    CHECK(joined.last_download_resumed_at == 4096);  // one chunk kept; the second died with its donor
  } else {
    CHECK(joined.last_download_donors == 1);  // ft-b was the fresher and served it all
  }
  MESSAGE("the joiner asked " << (a->dead() ? "ft-a first, which died; ft-b finished" : "ft-b first, which served it all"));

  // The next global batch: the joiner serves, and b and d step together, identical.
  train_one_global_batch();
  REQUIRE(wait_for_step({b.get(), d.get(), z.get()}, survivors_step + 1));
  CHECK(b->stats().params_hash == d->stats().params_hash);
  CHECK(d->stats().forward + d->stats().backward > 0);
  CHECK(trainer.ledger().abandoned == 0);
}


// A stage-mate that lies: it publishes the stage's own parameters hash, fresher than
// anyone's, and serves a forged state under it.
struct Forger {
  std::string id;
  Checkpoint state;
  StateDonor donor;
  std::atomic<int64_t> chunks_served{0};
  std::optional<InprocServer> server;
  std::shared_ptr<wire::ValidationCounters> counters = std::make_shared<wire::ValidationCounters>();

  Forger(std::string name, Checkpoint forged) : id(std::move(name)), state(std::move(forged)) {
    donor.after_chunk = [this](int64_t served) {
      chunks_served = served;
      return Status::ok();
    };
    server.emplace(*InprocTransport::bind(address(), ServerOptions{}));
    REQUIRE(server
                ->serve(validating_handler(wire::Limits{}, counters,
                                           [this](const PeerIdentity&, const wire::DecodedMessage& m) {
                                             return donor.handle(m, 0, state.step,
                                                                 [this]() -> Result<Checkpoint> { return state; });
                                           }))
                .is_ok());
  }
  std::string address() const { return "inproc://forger-" + id; }

  void announce(InProcessRegistry& registry, uint64_t claimed_hash, double ahead_seconds) {
    ProgressRecord r;
    r.peer_id = id;
    r.address = address();
    r.step = state.step;
    r.params_hash = claimed_hash;
    r.recent_hashes = {{state.step, claimed_hash}};
    r.published_at = registry.now() + ahead_seconds;  // the freshest record: asked first
    REQUIRE(registry.announce(progress_registry_key(0), id, r.to_json(), registry.now() + 30).is_ok());
  }
};

Checkpoint deep_copy(const Checkpoint& state) {
  Checkpoint out = state;
  for (auto& named : out.tensors) named.tensor = named.tensor.clone();
  return out;
}

NamedTensor* find_tensor(Checkpoint& state, std::string_view prefix) {
  for (auto& named : state.tensors) {
    if (named.name.starts_with(prefix)) return &named;
  }
  return nullptr;
}

TEST_CASE("forged states (wrong hash, forged moments or step counter under the honest parameters, NaN, wrong size, negative moment) are refused before load; the joiner syncs honestly") {
  InProcessRegistry registry;
  auto a = start_peer(&registry, sync_config(0, "fg-a"));
  auto b = start_peer(&registry, sync_config(0, "fg-b"));
  auto z = start_peer(&registry, sync_config(1, "fg-z"));
  TrainerConfig trainer_config;
  trainer_config.codec = CodecId::none;
  trainer_config.refresh_period_seconds = 0.05;
  RrTrainer trainer(trainer_config, std::vector<RoundRobinRouter>(2), &registry);
  std::mt19937 rng(5);
  for (int m = 0; m < kMicrobatches; ++m) {
    Tensor tokens, targets;
    pattern_batch(rng, kRows, &tokens, &targets);
    REQUIRE(trainer.run_microbatch(tokens, targets).completed);
  }
  REQUIRE(wait_for_step({a.get(), b.get(), z.get()}, 1));
  const uint64_t honest_hash = a->stats().params_hash;
  ClientCache<InprocTransport> clients;
  auto honest = download_state(clients, 0, {{"fg-a", a->control_address()}}, StateTransferConfig{}, nullptr);
  REQUIRE_MESSAGE(honest.is_ok(), honest.status().to_string());

  // Other parameters under the honest hash.
  Checkpoint other = deep_copy(*honest);
  find_tensor(other, kParamPrefix)->tensor.data<float>()[0] += 1.0f;
  // The honest parameters, so the hash matches; only the moments are poisoned or misshapen.
  Checkpoint nan = deep_copy(*honest);
  NamedTensor* v = find_tensor(nan, "optim/adam.v/");
  REQUIRE(v != nullptr);
  v->tensor.data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
  // A negative second moment: Replica::load would refuse it only after the download,
  // and this forger, the freshest, would be asked first again and again.
  Checkpoint negative = deep_copy(*honest);
  find_tensor(negative, "optim/adam.v/")->tensor.data<float>()[1] = -1.0f;
  Checkpoint misshapen = deep_copy(*honest);
  NamedTensor* m = find_tensor(misshapen, "optim/adam.m/");
  REQUIRE(m != nullptr);
  m->tensor = *Tensor::zeros(Shape{m->tensor.numel() + 1}, DType::f32);
  // The honest parameters and the honest layout: only the optimizer state is forged,
  // within what any optimizer could hold (finite, second moments >= 0). Its next
  // steps would move every weight by what the forger chose.
  Checkpoint moments = deep_copy(*honest);
  for (auto& t : moments.tensors) {
    if (!t.name.starts_with(std::string(kOptimizerPrefix) + std::string(optim::kFirstMomentPrefix))) continue;
    for (float& x : t.tensor.span<float>()) x = x * 1e6f + 1.0f;
  }
  Checkpoint counter = deep_copy(*honest);
  find_tensor(counter, std::string(kOptimizerPrefix) + std::string(optim::kStepStateName))->tensor.data<int64_t>()[0] =
      1'000'000'000;
  std::vector<std::unique_ptr<Forger>> forgers;
  forgers.push_back(std::make_unique<Forger>("hash", std::move(other)));
  forgers.push_back(std::make_unique<Forger>("moments", std::move(moments)));
  forgers.push_back(std::make_unique<Forger>("counter", std::move(counter)));
  forgers.push_back(std::make_unique<Forger>("nan", std::move(nan)));
  forgers.push_back(std::make_unique<Forger>("size", std::move(misshapen)));
  forgers.push_back(std::make_unique<Forger>("negative", std::move(negative)));
  for (size_t i = 0; i < forgers.size(); ++i) forgers[i]->announce(registry, honest_hash, static_cast<double>(forgers.size() - i));

  // The application's speaks_for, here: a connection named later may send as no one.
  struct Banned {
    std::mutex mu;
    PeerIdentity identity;
  };
  auto banned = std::make_shared<Banned>();
  auto joiner_config = sync_config(0, "fg-d");
  joiner_config.speaks_for = [banned](const std::string&, const PeerIdentity& from) {
    std::lock_guard lock(banned->mu);
    return !(from == banned->identity);
  };
  auto d = start_peer(&registry, joiner_config);
  REQUIRE(d->wait_for_stats([](const PeerStats& s) { return s.serving; }, seconds_from_now(20)));
  auto impostor = InprocTransport::connect(d->control_address(), {});
  auto outsider = InprocTransport::connect(d->control_address(), {});
  REQUIRE(impostor.is_ok());
  REQUIRE(outsider.is_ok());
  {
    std::lock_guard lock(banned->mu);
    banned->identity = impostor->identity();
  }
  const PeerStats joined = d->stats();
  CHECK(joined.states_refused == 6);
  CHECK(joined.state_downloads == 1);
  CHECK(joined.global_step == 1);
  CHECK(joined.params_hash == honest_hash);
  CHECK(joined.last_download_donors == 7);  // the six forgers, then an honest stage-mate
  CHECK(joined.forward + joined.backward == 0);
  for (const auto& f : forgers) {
    INFO(f->id);
    CHECK(f->chunks_served > 0);  // each was asked, its whole state fetched, and refused
  }

  // Round parts sent to the joiner's control server: as a stage-mate from the
  // banned connection, for a group it never received a BEGIN for, and for a step
  // far ahead: each refused at once, and counted.
  auto send = [&](InprocClient& client, const std::string& sender, int64_t step) {
    RoundMessage part;
    part.op = RoundOp::part;
    part.step = step;
    part.sender = sender;
    part.leader = sender;
    part.group = 77;
    part.phase = 0;
    part.part = 0;
    part.from = 1;
    part.values = {1, 2};
    auto frames = encode_round_message(part, RoundCodec::raw());
    REQUIRE(frames.is_ok());
    return decode_result_reply(client.call(std::move(frames).value(), seconds_from_now(5)).get()).status();
  };
  CHECK(send(*impostor, "fg-a", 1).code() == StatusCode::permission_denied);
  CHECK(send(*outsider, "fg-nobody", 1).code() == StatusCode::failed_precondition);
  CHECK(send(*outsider, "fg-a", 50).code() == StatusCode::failed_precondition);
  CHECK(d->wait_for_stats([](const PeerStats& s) { return s.parts_refused == 3; }, seconds_from_now(10)));
}

}  // namespace
}  // namespace swarm
