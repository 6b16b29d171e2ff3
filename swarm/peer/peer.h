// peer: the stage server runtime, composed of parts with one job each:
//   Replica       the stage, its optimizers, step, hashes and checkpoints;
//   StageService  forward and backward requests, checked against the StageSpec,
//                 batched (ForwardBatcher), in the stage's codecs;
//   StageSync     progress, all-reduce rounds, the global step and re-sync;
//   PeriodicTask  the announcer that keeps the peer's registry record fresh;
// and two servers: the compute server for trainers, and a control server for
// all-reduce parts, state chunks and pings, so control traffic never queues behind
// compute. Without a global batch (solo mode) a peer takes a local AdamW step every
// `step_every_samples` samples instead of syncing.
//
// A peer built with a StageFactory can change stage (adaptive rebalancing, DESIGN
// §5.4): the stage's parts (replica, service, sync) are rebuilt for the new stage
// while the servers, their addresses and the announcer stay. Rebalancing (its own
// part) decides when.
//
//   swarm::Peer<GptStage<CpuBackend>, ZmqTransport, DhtRegistry, StandardCodecs> peer(config, std::move(stage), &registry);
//   SWARM_RETURN_IF_ERROR(peer.start());
//   ... peer.stop();
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <string>

#include <fmt/format.h>

#include "swarm/api/codec.h"
#include "swarm/api/registry.h"
#include "swarm/api/stage.h"
#include "swarm/api/transport.h"
#include "swarm/averaging/all_reduce.h"
#include "swarm/averaging/state_transfer.h"
#include "swarm/checkpoint/checkpoint.h"
#include "swarm/core/log.h"
#include "swarm/optim/optimizer.h"
#include "swarm/peer/peer_stats.h"
#include "swarm/peer/periodic_task.h"
#include "swarm/peer/rebalancing.h"
#include "swarm/peer/replica.h"
#include "swarm/peer/stage_service.h"
#include "swarm/peer/stage_sync.h"
#include "swarm/protocol/client_cache.h"
#include "swarm/protocol/records.h"
#include "swarm/protocol/validating_handler.h"
#include "swarm/wire/wire.h"

namespace swarm {

// Builds the stage of a given index, for a peer that may change stage.
template <Stage S>
using StageFactory = std::function<Result<S>(int stage_index)>;

struct PeerConfig {
  int stage_index = 0;
  std::string peer_id;
  std::string bind_address = "tcp://127.0.0.1:*";          // trainers' requests
  // Stage-mates' requests; empty: next to bind_address (same host, any port).
  std::string control_bind_address;
  ServerOptions server;
  // Every client this peer opens (all-reduce parts, state downloads) uses these.
  ClientOptions client;
  double announce_period_seconds = 1.0;
  double announce_ttl_seconds = 5.0;
  optim::OptimizerConfig optimizer;
  float learning_rate = 1e-3f;
  int64_t warmup_steps = 0;  // linear warm-up, in optimizer steps (local or global)
  int64_t step_every_samples = 16;
  // A forward or backward that arrives during a round waits this long at most for its step (Replica::wait_for_round_step).
  double compute_waits_for_round_seconds = 0.25;
  // With global steps, a forward that arrives while gradients here wait for a round
  // waits this long at most for a round to take them (Replica::hold_forwards_for_pending).
  double forward_waits_for_pending_seconds = 0.02;
  // Activations and all-reduce parts travel in this codec.
  CodecId codec = CodecId::blockwise8;
  // The backward's output and input gradients; unset: codec (see protocol::StageSpec).
  std::optional<CodecId> gradient_codec;
  // Forward requests that arrive together (from several trainers) are run as
  // one batch of up to this many requests. 1 turns batching off and serves
  // requests on the server's I/O thread, the lowest-latency path.
  int max_batch = 1;
  int64_t max_request_rows = 256;  // sequences per request; more is refused (see StageServiceOptions)
  wire::Limits limits;
  // Emulated machines, for tests and experiments: see StageServiceOptions.
  double slowdown = 1.0;
  double emulated_seconds_per_sample = 0;
  // Forwards remembered to bind their backwards (StageService, ForwardLedger).
  ForwardLedgerLimits forwards;

  // Stage synchronization; 0 keeps the solo mode above.
  int64_t global_batch_samples = 0;
  double progress_period_seconds = 0.2;
  double sync_tick_seconds = 0.005;  // see StageSyncConfig::tick_seconds
  double progress_stale_seconds = 5.0;
  bool start_on_estimated_arrival = true;
  double gather_timeout_seconds = 2.0;
  AllReduceConfig all_reduce;
  StateTransferConfig state_transfer;
  int64_t total_steps = 0;  // for the lr decay; 0: constant after warm-up
  // "{stage}" in it is replaced by the stage's index; a peer that moves needs it.
  std::string checkpoint_path;
  int64_t checkpoint_every_steps = 0;
  std::string resume_from;  // a stage checkpoint to start from
  // Whether a connection's authenticated identity may send all-reduce parts as a
  // peer id (swarm/averaging/all_reduce.h); unset, every part passes.
  SpeaksFor speaks_for;
  // Whether a caller may use this peer's compute, read its info or download its state
  // (a swarm with an owner: certified callers only); unset, every caller that reached
  // the server may. `credential`: this peer's own certificate, for the state requests it sends.
  AdmitCaller admit_caller;
  std::string credential;

  // Peer to peer: how this peer sends the rest of a pipeline on to the next
  // stage (apps give it a trainer's routing and retries); unset, it serves
  // pipeline requests only as the last stage. Each pipeline holds a compute
  // worker while the stages after it run, so the compute server has
  // `pipeline_workers` of them (at least max_batch).
  PassPipelineOn pass_pipeline_on;
  int pipeline_workers = 0;
  // Hops answered at once (a pipeline from a peer carries reply_to): how this peer
  // sends a pipeline's outcome back, and hands on one sent to it (see
  // StageServiceHooks); both unset, pipelines from peers are answered when done.
  // stop_returns wakes the pipelines that wait for outcomes when the peer stops.
  ReturnPipeline return_pipeline;
  DeliverPipelineResult deliver_pipeline_result;
  size_t hop_slots = 64;  // pipelines from peers in progress at once; beyond them, busy
  std::function<void()> stop_returns;
  // A secured swarm: who started a pipeline, from its hop chain; unset, anyone (see StageServiceHooks).
  PipelineOrigin pipeline_origin;

  // Adaptive rebalancing, for a peer built with a StageFactory: every period (with
  // jitter) it may move to the stage the pipeline needs most. 0 turns it off.
  int num_stages = 0;
  double rebalance_period_seconds = 0;
  rebalance::RebalanceConfig rebalance;  // its period_seconds is rebalance_period_seconds
  uint64_t rebalance_seed = 0;
  // How long a moving peer waits for the round that takes its accumulated samples.
  double drain_timeout_seconds = 30;

  // Fault-injection hooks for tests: die (stop answering, or SIGKILL the process
  // with die_by_signal) after sending this many all-reduce parts in one round, or
  // after serving this many state chunks. 0 disables.
  int64_t test_die_after_allreduce_sends = 0;
  int64_t test_die_after_state_chunks = 0;
  bool test_die_by_signal = false;
  // For attack tests: the peer plays a Byzantine stage-mate (see ContributionScale).
  ContributionScale test_contribution_scale;
  int64_t test_forge_reduced_part_from = -1;  // attack tests: see RoundsConfig
};

template <Stage S, Transport T, Registry R, CodecTable Codecs>
class Peer {
 public:
  // Serves config.stage_index for ever.
  Peer(PeerConfig config, S stage, R* registry) : Peer(std::move(config), StageFactory<S>(), registry) {
    initial_stage_.emplace(std::move(stage));
  }
  // Builds stage config.stage_index with make_stage, and others when it moves.
  Peer(PeerConfig config, StageFactory<S> make_stage, R* registry)
      : config_(std::move(config)), registry_(registry), make_stage_(std::move(make_stage)),
        counters_(std::make_shared<wire::ValidationCounters>()),
        stats_([this](PeerStats& s) {
          s.rejected = static_cast<int64_t>(counters_->total());
          s.serving = flags_.serving && !flags_.dead && !moving_;
          if (auto parts = current()) {
            s.stage = parts->index;
            s.ledger = parts->replica->sample_ledger();
          }
        }),
        clients_(config_.client) {}

  ~Peer() { stop(); }

  Status start() {
    if (rebalancing() && (!make_stage_ || config_.num_stages < 2)) {
      return invalid_argument("rebalancing needs a stage factory and at least 2 stages (num_stages {})",
                              config_.num_stages);
    }
    SWARM_RETURN_IF_ERROR(check_device_of_stage(config_.stage_index));
    SWARM_ASSIGN_OR_RETURN(std::shared_ptr<StageParts> parts, make_parts(config_.stage_index));
    if (global_mode() && !config_.resume_from.empty()) SWARM_RETURN_IF_ERROR(resume(*parts));
    SWARM_RETURN_IF_ERROR(bind_servers());
    install(parts);
    SWARM_RETURN_IF_ERROR(start_stage(*parts));
    announcer_.start(config_.announce_period_seconds, [this] {
      if (flags_.dead) return;
      Status status = announce();
      if (!status.is_ok()) log_warn("peer {}: announce failed: {}", config_.peer_id, status.to_string());
    });
    if (rebalancing()) SWARM_RETURN_IF_ERROR(start_rebalancing());
    log_info("peer {} {} stage {} at {} (control {})", config_.peer_id, flags_.serving ? "serves" : "syncs, then serves,",
             parts->index, address(), control_address());
    return Status::ok();
  }

  // Stops announcing, withdraws, and closes the servers.
  void stop() {
    if (stopped_.exchange(true)) return;
    if (auto parts = current(); parts && parts->sync) parts->sync->stop();  // ends a move's wait at once
    if (rebalancing_) rebalancing_->stop();
    announcer_.stop();
    auto parts = current();
    if (parts && parts->sync) parts->sync->stop();
    if (compute_server_ && !flags_.dead && parts) {
      (void)registry_->withdraw(stage_registry_key(parts->index), config_.peer_id);
      if (parts->sync) parts->sync->withdraw();
    }
    if (config_.stop_returns) config_.stop_returns();
    stop_servers();
  }

  // Where trainers send forward and backward requests.
  std::string address() const { return compute_server_ ? std::string(compute_server_->address()) : std::string(); }
  // Where stage-mates send all-reduce parts and state requests.
  std::string control_address() const {
    return control_server_ ? std::string(control_server_->address()) : std::string();
  }
  const PeerConfig& config() const { return config_; }
  // The stage it serves now (it may have moved since it started).
  int stage_index() const {
    auto parts = current();
    return parts ? parts->index : config_.stage_index;
  }
  int64_t requests_in_service() const {
    auto parts = current();
    return parts ? parts->service->in_service() : 0;
  }
  // What the stage takes and sends, as trainers see it through an `info` request.
  protocol::StageSpec spec() const { return current()->service->spec(); }
  PeerStats stats() const { return stats_.snapshot(); }
  bool dead() const { return flags_.dead; }

  // Blocks until done(stats()) holds or the deadline passes; returns whether it holds.
  template <typename Predicate>
  bool wait_for_stats(Predicate done, Deadline deadline) const {
    return stats_.wait_for(std::move(done), deadline);
  }

  // Leaves its stage for stage `to`: stops serving and announcing there, drains the
  // requests in service, lets its accumulated samples go into the stage's next round,
  // then builds the new stage, takes its state from the new stage-mates (or its last
  // checkpoint, if the stage emptied) and announces there. False if it could not, in
  // which case it serves its old stage again. `urgent` (the target stage is empty and
  // nothing flows): no wait for a round, which cannot come while the pipeline is cut;
  // the samples it holds are counted as lost to the move.
  bool move_to(int to, bool urgent = false) {
    auto old = current();
    if (!old || !make_stage_ || to == old->index || to < 0 || to >= config_.num_stages || stopped_) return false;
    const int from = old->index;
    if (Status same_device = check_device_of_stage(to); !same_device.is_ok()) {
      log_warn("peer {}: not moving to stage {}: {}", config_.peer_id, to, same_device.message());
      return false;
    }
    log_info("peer {}: moving from stage {} to stage {}", config_.peer_id, from, to);
    leave_stage(*old, urgent);
    if (stopped_) return false;
    auto parts = make_parts(to);
    if (!parts.is_ok()) {
      log_error("peer {}: cannot build stage {}: {}; back to stage {}", config_.peer_id, to,
                parts.status().to_string(), from);
      parts = make_parts(from);
      if (!parts.is_ok()) return false;
    }
    refill_from_checkpoint(**parts);
    install(*parts);
    if ((*parts)->index != from) (void)registry_->withdraw(stage_registry_key(from), config_.peer_id);
    moving_ = false;
    if ((*parts)->index != from) stats_.update([](PeerStats& s) { ++s.moves; });
    if (Status started = start_stage(**parts); !started.is_ok()) {
      log_error("peer {}: stage {} did not start: {}", config_.peer_id, (*parts)->index, started.to_string());
    }
    log_info("peer {}: moved from stage {} to stage {}", config_.peer_id, from, (*parts)->index);
    return (*parts)->index == to;
  }

 private:
  // What changes with the stage: rebuilt by a move, reached through current().
  struct StageParts {
    int index = 0;
    std::shared_ptr<Replica<S>> replica;
    std::unique_ptr<StageService<S, Codecs>> service;
    std::unique_ptr<StageSync<S, T, R, Codecs>> sync;
  };

  bool global_mode() const { return config_.global_batch_samples > 0; }
  bool rebalancing() const { return config_.rebalance_period_seconds > 0; }

  std::shared_ptr<StageParts> current() const {
    std::lock_guard lock(parts_mu_);
    return parts_;
  }

  void install(std::shared_ptr<StageParts> parts) {
    std::lock_guard lock(parts_mu_);
    served_stages_.insert(parts->index);
    parts_ = std::move(parts);
  }

  Result<std::shared_ptr<StageParts>> make_parts(int index) {
    std::optional<S> stage;
    if (initial_stage_ && index == config_.stage_index) {
      stage.emplace(std::move(*initial_stage_));
      initial_stage_.reset();
    } else if (make_stage_) {
      SWARM_ASSIGN_OR_RETURN(S made, make_stage_(index));
      stage.emplace(std::move(made));
    } else {
      return failed_precondition("peer {} has no stage factory to build stage {}", config_.peer_id, index);
    }
    auto parts = std::make_shared<StageParts>();
    parts->index = index;
    parts->replica = std::make_shared<Replica<S>>(index, std::move(*stage), config_.optimizer);
    parts->replica->wait_for_round_step(config_.compute_waits_for_round_seconds);
    if (global_mode()) parts->replica->hold_forwards_for_pending(config_.forward_waits_for_pending_seconds);
    parts->service =
        std::make_unique<StageService<S, Codecs>>(service_options(), parts->replica, &stats_, service_hooks(parts.get()));
    return parts;
  }

  // Serving, or syncing first (global mode), and announced either way.
  Status start_stage(StageParts& parts) {
    stats_.update([&](PeerStats& s) {
      s.global_step = parts.replica->step();
      s.params_hash = parts.replica->params_hash();
    });
    if (global_mode()) {
      parts.sync = std::make_unique<StageSync<S, T, R, Codecs>>(sync_config(parts), parts.replica, registry_, &clients_,
                                                                &stats_, &flags_, [this] { (void)announce(); });
      install_test_hooks(parts);
      SWARM_RETURN_IF_ERROR(parts.sync->start(control_address()));
    } else {
      flags_.serving = true;
      stats_.notify();
    }
    return announce();
  }

  // Trainers are turned away (unavailable: they retry elsewhere) and the stage's record
  // says it no longer serves (it stays counted there, so no second peer leaves for the
  // same vacancy), requests in service finish, and the stage's next round takes the
  // samples they added. The old stage's ledger is kept for `info` about it.
  void leave_stage(StageParts& old, bool urgent) {
    moving_ = true;
    flags_.serving = false;
    stats_.notify();
    (void)announce();
    const Deadline until = deadline_after(urgent ? 0.0 : config_.drain_timeout_seconds);
    const Deadline drained_by = deadline_after(config_.drain_timeout_seconds);
    while (old.service->in_service() > 0 && Clock::now() < drained_by && !stopped_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (old.sync) {
      const bool clean = old.sync->leave(until);
      if (!clean) log_warn("peer {}: left stage {} before its next round; its pending samples are lost", config_.peer_id, old.index);
    } else {
      old.replica->lose_pending_to_move();
    }
    std::lock_guard lock(parts_mu_);
    add_ledger(past_ledgers_[old.index], old.replica->sample_ledger());
  }

  // A stage that emptied has no stage-mate to download from: its last checkpoint, if
  // this machine has it, beats starting from scratch. Stage-mates ahead of it win.
  void refill_from_checkpoint(StageParts& parts) {
    const std::string path = checkpoint_path_for(parts.index);
    std::error_code error;
    if (path.empty() || !std::filesystem::exists(path, error)) return;
    auto state = load_checkpoint(path);
    Status loaded = state.is_ok() ? parts.replica->load(*state) : state.status();
    if (!loaded.is_ok()) {
      log_warn("peer {}: stage {} checkpoint {} not loaded: {}", config_.peer_id, parts.index, path, loaded.to_string());
      return;
    }
    log_info("peer {}: stage {} from its checkpoint {} at step {}", config_.peer_id, parts.index, path, state->step);
  }

  static void add_ledger(protocol::SampleLedger& into, const protocol::SampleLedger& more) {
    for (const auto& [name, field] : protocol::kSampleLedgerFields) {
      if (__builtin_add_overflow(into.*field, more.*field, &(into.*field))) into.*field = INT64_MAX;
    }
  }

  std::string checkpoint_path_for(int index) const {
    std::string path = config_.checkpoint_path;
    const size_t at = path.find("{stage}");
    if (at != std::string::npos) return path.replace(at, 7, std::to_string(index));
    // A fixed path names the stage it started with; another stage must not overwrite it.
    return path.empty() || index == config_.stage_index ? path : fmt::format("{}.stage-{}", path, index);
  }

  Status start_rebalancing() {
    rebalance::RebalanceConfig policy = config_.rebalance;
    policy.period_seconds = config_.rebalance_period_seconds;
    SWARM_RETURN_IF_ERROR(policy.validate().with_context("rebalancing"));
    rebalancing_ = std::make_unique<Rebalancing<R>>(
        policy, config_.peer_id, config_.num_stages, config_.rebalance_seed, registry_,
        [this] {
          const PeerStats s = stats();
          return rebalance::PeerLoad{config_.peer_id, s.stage, s.throughput,
                                     std::max<int64_t>(0, requests_in_service() - 1)};
        },
        [this] { return flags_.serving && !flags_.dead && !moving_ && !stopped_; },
        [this](int to, bool urgent) { return move_to(to, urgent); });
    rebalancing_->start();
    return Status::ok();
  }

  Status resume(StageParts& parts) {
    SWARM_ASSIGN_OR_RETURN(Checkpoint resumed, load_checkpoint(config_.resume_from));
    SWARM_RETURN_IF_ERROR(parts.replica->load(resumed).with_context(config_.resume_from));
    log_info("peer {} resumed stage {} at step {} from {}", config_.peer_id, parts.index, resumed.step,
             config_.resume_from);
    return Status::ok();
  }

  StageServiceOptions service_options() const {
    return {.codec = config_.codec,
            .gradient_codec = config_.gradient_codec,
            .max_batch = config_.max_batch,
            .max_request_rows = config_.max_request_rows,
            .slowdown = config_.slowdown,
            .emulated_seconds_per_sample = config_.emulated_seconds_per_sample,
            .forwards = config_.forwards,
            .max_answered_pipelines = config_.hop_slots,
            .max_trainer_pipelines = config_.return_pipeline ? static_cast<size_t>(config_.pipeline_workers) : 0};
  }

  // `parts` owns the service these hooks serve, so it outlives every call.
  StageServiceHooks service_hooks(StageParts* parts) {
    return {[this]() -> Status {
              if (flags_.dead) return unavailable("peer {} is dead (test hook)", config_.peer_id);
              if (moving_) return unavailable("peer {} is moving to another stage", config_.peer_id);
              if (!flags_.serving) {
                return unavailable("peer {} is re-syncing its state and does not serve yet", config_.peer_id);
              }
              return Status::ok();
            },
            [this, parts](int64_t) {
              if (parts->sync) {
                parts->sync->wake();
              } else if (!global_mode()) {
                local_step(*parts);
              }
            },
            config_.admit_caller, config_.pass_pipeline_on,
                                            config_.pipeline_origin, config_.return_pipeline,
                                            config_.deliver_pipeline_result};
  }

  void local_step(StageParts& parts) {
    auto stepped =
        parts.replica->maybe_local_step(config_.step_every_samples, config_.learning_rate, config_.warmup_steps);
    if (!stepped.is_ok()) log_warn("peer {}: optimizer step skipped: {}", config_.peer_id, stepped.status().to_string());
    if (stepped.is_ok() && *stepped) stats_.update([](PeerStats& s) { ++s.optimizer_steps; });
  }

  StageSyncConfig sync_config(StageParts& parts) const {
    StageSyncConfig c;
    c.peer_id = config_.peer_id;
    c.global_batch_samples = config_.global_batch_samples;
    c.progress_period_seconds = config_.progress_period_seconds;
    c.tick_seconds = config_.sync_tick_seconds;
    c.progress_stale_seconds = config_.progress_stale_seconds;
    c.record_ttl_seconds = config_.announce_ttl_seconds;
    c.start_on_estimated_arrival = config_.start_on_estimated_arrival;
    c.gather_timeout_seconds = config_.gather_timeout_seconds;
    c.all_reduce = config_.all_reduce;
    c.all_reduce.codec = config_.codec;
    c.state_transfer = config_.state_transfer;
    c.state_transfer.credential = config_.credential;
    // A donor's claimed size is checked against what this stage's state can be.
    c.state_transfer.max_state_bytes =
        std::min(c.state_transfer.max_state_bytes, state_bytes_cap(parts.replica->parameter_count()));
    c.schedule = optim::LrSchedule{.peak_lr = config_.learning_rate, .warmup_steps = config_.warmup_steps,
                                   .total_steps = config_.total_steps};
    c.checkpoint_path = checkpoint_path_for(parts.index);
    c.checkpoint_every_steps = config_.checkpoint_every_steps;
    c.test_die_after_allreduce_sends = config_.test_die_after_allreduce_sends;
    c.test_contribution_scale = config_.test_contribution_scale;
    c.test_forge_reduced_part_from = config_.test_forge_reduced_part_from;
    c.speaks_for = config_.speaks_for;
    return c;
  }

  void install_test_hooks(StageParts& parts) {
    flags_.die_by_signal = config_.test_die_by_signal;
    flags_.on_death = [this] { stop_servers(); };
    if (config_.test_die_after_state_chunks > 0) {
      parts.sync->donor().after_chunk = [this](int64_t served) {
        return served >= config_.test_die_after_state_chunks ? flags_.die(config_.peer_id, "while serving state")
                                                             : Status::ok();
      };
    }
  }

  Status bind_servers() {
    ServerOptions compute = config_.server;
    // Batching needs requests to wait side by side: one worker per batch slot.
    compute.worker_threads = std::max({1, config_.max_batch, config_.pipeline_workers});
    // Hops answered at once: workers to spare beyond the trainers' pipelines, for
    // the outcomes those wait for (StageServiceOptions::max_trainer_pipelines).
    if (config_.return_pipeline) compute.worker_threads = std::max(config_.max_batch, config_.pipeline_workers + 8);
    ServerOptions control = config_.server;
    control.worker_threads = 2;  // a state chunk being encoded must not hold up a part
    SWARM_ASSIGN_OR_RETURN(auto compute_server, T::bind(config_.bind_address, compute));
    compute_server_.emplace(std::move(compute_server));
    SWARM_ASSIGN_OR_RETURN(auto control_server, T::bind(control_bind_address(), control));
    control_server_.emplace(std::move(control_server));
    SWARM_RETURN_IF_ERROR(control_server_->serve(validating_handler(
        config_.limits, counters_,
        [this](const PeerIdentity& from, const wire::DecodedMessage& m) { return this->control(from, m); })));
    return compute_server_->serve(validating_handler(
        config_.limits, counters_,
        [this](const PeerIdentity& from, const wire::DecodedMessage& m) { return this->compute(from, m); }));
  }

  std::string control_bind_address() const {
    if (!config_.control_bind_address.empty()) return config_.control_bind_address;
    const std::string& bind = config_.bind_address;
    const size_t colon = bind.rfind(':');
    if (bind.starts_with("tcp://") && colon != std::string::npos && colon > 5) return bind.substr(0, colon) + ":*";
    return bind + "-control";
  }

  void stop_servers() {
    std::lock_guard lock(servers_mu_);
    if (compute_server_) compute_server_->stop();
    if (control_server_) control_server_->stop();
  }

  wire::Frames control(const PeerIdentity& from, const wire::DecodedMessage& message) {
    auto parts = current();
    if (Status refused = refuse(message, *parts); !refused.is_ok()) return error(message, refused);
    StageSync<S, T, R, Codecs>* sync = parts->sync.get();
    switch (message.header.kind) {
      case wire::MessageKind::ping:
        return ok(message);
      case wire::MessageKind::allreduce_part:
        if (!sync) return error(message, failed_precondition("peer {} does not average (solo mode)", config_.peer_id));
        if (Status delivered = sync->deliver_part(message, from); !delivered.is_ok()) return error(message, delivered);
        return ok(message);
      case wire::MessageKind::state_chunk:
        if (!sync) return error(message, failed_precondition("peer {} does not donate state (solo mode)", config_.peer_id));
        if (Status admitted = admit(from, message); !admitted.is_ok()) return error(message, admitted);
        return sync->donate_state(message);
      default:
        return error(message, unimplemented("the control server does not serve message kind {}",
                                            static_cast<int>(message.header.kind)));
    }
  }

  // A swarm with an owner: the caller's certificate, checked and, refused, counted.
  Status admit(const PeerIdentity& from, const wire::DecodedMessage& message) {
    if (!config_.admit_caller) return Status::ok();
    Status admitted = config_.admit_caller(from, message.header.credential);
    if (!admitted.is_ok()) stats_.update([](PeerStats& s) { ++s.callers_refused; });
    return admitted;
  }

  wire::Frames compute(const PeerIdentity& from, const wire::DecodedMessage& message) {
    auto parts = current();
    if (message.header.kind == wire::MessageKind::info) {
      // What a stage takes and how it refuses is for the swarm's members only.
      if (Status admitted = admit(from, message); !admitted.is_ok()) return error(message, admitted);
      return info(message, *parts);
    }
    if (Status refused = refuse(message, *parts); !refused.is_ok()) return error(message, refused);
    if (message.header.kind == wire::MessageKind::ping) return ok(message);
    return parts->service->handle(from, message);
  }

  // The spec of the stage it serves now, and the sample ledger of the stage asked
  // about: one it left still accounts for the samples it accumulated there.
  wire::Frames info(const wire::DecodedMessage& message, const StageParts& parts) {
    if (flags_.dead) return error(message, unavailable("peer {} is dead (test hook)", config_.peer_id));
    const int asked = static_cast<int>(message.header.stage);
    protocol::SampleLedger ledger;
    {
      std::lock_guard lock(parts_mu_);
      if (!served_stages_.count(asked)) {
        return error(message, invalid_argument("this peer serves stage {}, not {}", parts.index, asked));
      }
      if (auto it = past_ledgers_.find(asked); it != past_ledgers_.end()) ledger = it->second;
    }
    if (asked == parts.index) add_ledger(ledger, parts.replica->sample_ledger());
    const protocol::RefusalCounts refusals = refusal_counts(parts);
    auto reply = protocol::encode_info_reply(message.header.request_id, parts.service->spec(), &ledger, &refusals);
    return reply.is_ok() ? std::move(reply).value() : error(message, reply.status());
  }

  protocol::RefusalCounts refusal_counts(const StageParts& parts) {
    const PeerStats s = stats();
    protocol::RefusalCounts counts{{"validation", s.rejected},
                                   {"spec", s.spec_refused},
                                   {"loss_gradient", s.loss_gradient_refused},
                                   {"backward_unbound", s.backward_unbound},
                                   {"backward_input", s.backward_other_input},
                                   {"callers", s.callers_refused},
                                   {"hop_chains", s.hop_chains_refused},
                                   {"pipelines_busy", s.pipelines_busy},
                                   {"pipeline_results", s.pipeline_results_refused},
                                   {"pipeline_results_unsent", s.pipeline_results_unsent},
                                   {"parts", s.parts_refused},
                                   {"contributions_ignored", s.contributions_ignored},
                                   {"states", s.states_refused},
                                   {"unvouched_ahead", s.unvouched_ahead},
                                   {"bad_records", s.bad_records},
                                   {"members_banned", s.members_banned},
                                   {"backward_duplicates", s.ledger.backward_duplicates_refused},
                                   {"expired", s.ledger.expired_dropped},
                                   {"deadline", s.ledger.deadline_refused}};
    if (parts.sync) counts["state_requests"] = parts.sync->donor().refused_requests();
    if (rebalancing_) counts["bad_records"] += rebalancing_->refused_records();
    std::lock_guard lock(servers_mu_);
    for (const auto* server : {&compute_server_, &control_server_}) {
      if (!server->has_value()) continue;
      if constexpr (requires(const typename T::server_type& sv) { sv.busy_replies(); sv.oversized_requests(); }) {
        counts["busy"] += static_cast<int64_t>((*server)->busy_replies());
        counts["oversized"] += static_cast<int64_t>((*server)->oversized_requests());
      }
      if constexpr (requires(const typename T::server_type& sv) { sv.connection_counts(); }) {
        const auto connections = (*server)->connection_counts();
        counts["connections_refused"] +=
            static_cast<int64_t>(connections.refused_source + connections.refused_budget);
        counts["unfinished_closed"] += static_cast<int64_t>(connections.unfinished_closed);
      }
    }
    return counts;
  }

  // A request for a stage it left is retried elsewhere (unavailable); one for a stage
  // it never served is the caller's mistake.
  Status refuse(const wire::DecodedMessage& message, const StageParts& parts) const {
    if (message.header.stage != static_cast<uint32_t>(parts.index)) {
      std::lock_guard lock(parts_mu_);
      if (served_stages_.count(static_cast<int>(message.header.stage))) {
        return unavailable("peer {} moved to stage {}; it no longer serves stage {}", config_.peer_id, parts.index,
                           message.header.stage);
      }
      return invalid_argument("this peer serves stage {}, not {}", parts.index, message.header.stage);
    }
    if (flags_.dead) return unavailable("peer {} is dead (test hook)", config_.peer_id);
    return Status::ok();
  }

  wire::Frames ok(const wire::DecodedMessage& request) const {
    wire::MessageHeader header;
    header.kind = wire::MessageKind::result;
    header.stage = request.header.stage;
    header.request_id = request.header.request_id;
    return wire::Frames{{wire::serialize_header(header)}};
  }

  wire::Frames error(const wire::DecodedMessage& request, const Status& status) const {
    return wire::make_error_reply(request.header.request_id, request.header.stage, status);
  }

  // Where this peer's replicas step their parameters.
  static constexpr Device kUpdateDevice = stage_updater_t<S>::device;

  // The replicas of one stage step on one device: the CUDA update was written
  // to match the CPU's bit for bit, but no run has proven it, and a stage whose
  // replicas drift apart splits into lineages. So a peer refuses a stage whose
  // announced peers all step on another device. One peer of its own device there
  // is enough to join: a forged record cannot shut a served stage to its peers.
  Status check_device_of_stage(int stage) {
    const std::string own(device_name(kUpdateDevice));
    std::optional<PeerAnnouncementRecord> other;
    for (const auto& [id, record] : read_stage_announcements(*registry_, config_.num_stages)) {
      if (record.stage != stage || id == config_.peer_id) continue;
      if (record.device == own) return Status::ok();
      if (!other) other = record;
    }
    if (!other) return Status::ok();
    return failed_precondition(
        "stage {} is served by peer {}, whose replica steps on {}; this peer's steps on {}. The replicas of one "
        "stage must step on one device (their updates are not proven bit-identical across devices)",
        stage, other->peer_id, other->device, own);
  }

  // Announced while it syncs too, as not serving: trainers pass it by, rebalancers count it.
  Status announce() {
    auto parts = current();
    if (flags_.dead || !parts) return Status::ok();
    PeerAnnouncementRecord record{config_.peer_id, address(), parts->index, stats().throughput,
                                  std::max<int64_t>(0, parts->service->in_service() - 1), flags_.serving.load(),
                                  std::string(device_name(kUpdateDevice))};
    return registry_->announce(stage_registry_key(parts->index), config_.peer_id, record.to_json(),
                               registry_->now() + config_.announce_ttl_seconds);
  }

  PeerConfig config_;
  R* registry_;
  StageFactory<S> make_stage_;
  std::optional<S> initial_stage_;  // the first stage, when built by the caller
  std::shared_ptr<wire::ValidationCounters> counters_;
  PeerFlags flags_;
  std::atomic<bool> moving_{false};
  StatsBoard stats_;
  ClientCache<T> clients_;
  mutable std::mutex parts_mu_;  // guards the three below
  std::shared_ptr<StageParts> parts_;
  std::set<int> served_stages_;
  std::map<int, protocol::SampleLedger> past_ledgers_;
  std::unique_ptr<Rebalancing<R>> rebalancing_;
  std::mutex servers_mu_;
  std::optional<typename T::server_type> compute_server_;
  std::optional<typename T::server_type> control_server_;
  PeriodicTask announcer_;
  std::atomic<bool> stopped_{false};
};

}  // namespace swarm
