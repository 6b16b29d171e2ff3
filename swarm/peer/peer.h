// peer: the stage server runtime, composed of parts with one job each:
//   Replica       the stage, its optimizers, step, hashes and checkpoints;
//   StageService  forward and backward requests, checked against the StageSpec,
//                 batched (ForwardBatcher), in the stage's codec;
//   StageSync     progress, all-reduce rounds, the global step and re-sync;
//   PeriodicTask  the announcer that keeps the peer's registry record fresh;
// and two servers: the compute server for trainers, and a control server for
// all-reduce parts, state chunks and pings, so control traffic never queues behind
// compute. Without a global batch (solo mode) a peer takes a local AdamW step every
// `step_every_samples` samples instead of syncing.
//
//   swarm::Peer<GptStage<CpuBackend>, ZmqTransport, DhtRegistry, StandardCodecs> peer(config, std::move(stage), &registry);
//   SWARM_RETURN_IF_ERROR(peer.start());
//   ... peer.stop();
#pragma once

#include <memory>
#include <optional>
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
#include "swarm/peer/replica.h"
#include "swarm/peer/stage_service.h"
#include "swarm/peer/stage_sync.h"
#include "swarm/protocol/client_cache.h"
#include "swarm/protocol/records.h"
#include "swarm/protocol/validating_handler.h"
#include "swarm/wire/wire.h"

namespace swarm {

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
  // Activations, gradients and all-reduce parts travel in this codec.
  CodecId codec = CodecId::blockwise8;
  // Forward requests that arrive together (from several trainers) are run as
  // one batch of up to this many requests. 1 turns batching off and serves
  // requests on the server's I/O thread, the lowest-latency path.
  int max_batch = 1;
  int64_t max_request_rows = 256;  // sequences per request; more is refused (see StageServiceOptions)
  wire::Limits limits;
  // Emulated machines, for tests and experiments: see StageServiceOptions.
  double slowdown = 1.0;
  double emulated_seconds_per_sample = 0;

  // Stage synchronization; 0 keeps the solo mode above.
  int64_t global_batch_samples = 0;
  double progress_period_seconds = 0.2;
  double progress_stale_seconds = 5.0;
  bool start_on_estimated_arrival = true;
  double gather_timeout_seconds = 2.0;
  AllReduceConfig all_reduce;
  StateTransferConfig state_transfer;
  int64_t total_steps = 0;  // for the lr decay; 0: constant after warm-up
  std::string checkpoint_path;
  int64_t checkpoint_every_steps = 0;
  std::string resume_from;  // a stage checkpoint to start from
  // Whether a connection's authenticated identity may send all-reduce parts as a
  // peer id (swarm/averaging/all_reduce.h); unset, every part passes.
  SpeaksFor speaks_for;

  // Fault-injection hooks for tests: die (stop answering, or SIGKILL the process
  // with die_by_signal) after sending this many all-reduce parts in one round, or
  // after serving this many state chunks. 0 disables.
  int64_t test_die_after_allreduce_sends = 0;
  int64_t test_die_after_state_chunks = 0;
  bool test_die_by_signal = false;
};

template <Stage S, Transport T, Registry R, CodecTable Codecs>
class Peer {
 public:
  Peer(PeerConfig config, S stage, R* registry)
      : config_(std::move(config)), registry_(registry), counters_(std::make_shared<wire::ValidationCounters>()),
        stats_([this](PeerStats& s) {
          s.rejected = static_cast<int64_t>(counters_->total());
          s.serving = flags_.serving && !flags_.dead;
          s.ledger = replica_->sample_ledger();
        }),
        replica_(std::make_shared<Replica<S>>(config_.stage_index, std::move(stage), config_.optimizer)),
        clients_(config_.client) {}

  ~Peer() { stop(); }

  Status start() {
    if (global_mode() && !config_.resume_from.empty()) SWARM_RETURN_IF_ERROR(resume());
    stats_.update([&](PeerStats& s) {
      s.global_step = replica_->step();
      s.params_hash = replica_->params_hash();
    });
    service_ = std::make_unique<StageService<S, Codecs>>(service_options(), replica_, &stats_, service_hooks());
    SWARM_RETURN_IF_ERROR(bind_servers());
    if (global_mode()) {
      sync_ = std::make_unique<StageSync<S, T, R, Codecs>>(sync_config(), replica_, registry_, &clients_, &stats_,
                                                           &flags_, [this] { (void)announce(); });
      install_test_hooks();
      SWARM_RETURN_IF_ERROR(sync_->start(control_address()));
    } else {
      flags_.serving = true;
      stats_.notify();
    }
    if (flags_.serving) SWARM_RETURN_IF_ERROR(announce());
    announcer_.start(config_.announce_period_seconds, [this] {
      if (flags_.dead) return;
      Status status = announce();
      if (!status.is_ok()) log_warn("peer {}: announce failed: {}", config_.peer_id, status.to_string());
    });
    log_info("peer {} {} stage {} at {} (control {})", config_.peer_id, flags_.serving ? "serves" : "syncs, then serves,",
             config_.stage_index, address(), control_address());
    return Status::ok();
  }

  // Stops announcing, withdraws, and closes the servers.
  void stop() {
    if (stopped_.exchange(true)) return;
    announcer_.stop();
    if (sync_) sync_->stop();
    if (compute_server_ && !flags_.dead) {
      (void)registry_->withdraw(stage_registry_key(config_.stage_index), config_.peer_id);
      if (sync_) sync_->withdraw();
    }
    stop_servers();
  }

  // Where trainers send forward and backward requests.
  std::string address() const { return compute_server_ ? std::string(compute_server_->address()) : std::string(); }
  // Where stage-mates send all-reduce parts and state requests.
  std::string control_address() const {
    return control_server_ ? std::string(control_server_->address()) : std::string();
  }
  const PeerConfig& config() const { return config_; }
  int64_t requests_in_service() const { return service_ ? service_->in_service() : 0; }
  // What the stage takes and sends, as trainers see it through an `info` request.
  protocol::StageSpec spec() const { return service_->spec(); }
  PeerStats stats() const { return stats_.snapshot(); }
  bool dead() const { return flags_.dead; }

  // Blocks until done(stats()) holds or the deadline passes; returns whether it holds.
  template <typename Predicate>
  bool wait_for_stats(Predicate done, Deadline deadline) const {
    return stats_.wait_for(std::move(done), deadline);
  }

 private:
  bool global_mode() const { return config_.global_batch_samples > 0; }

  Status resume() {
    SWARM_ASSIGN_OR_RETURN(Checkpoint resumed, load_checkpoint(config_.resume_from));
    SWARM_RETURN_IF_ERROR(replica_->load(resumed).with_context(config_.resume_from));
    log_info("peer {} resumed stage {} at step {} from {}", config_.peer_id, config_.stage_index, resumed.step,
             config_.resume_from);
    return Status::ok();
  }

  StageServiceOptions service_options() const {
    return {config_.codec, config_.max_batch, config_.max_request_rows, config_.slowdown,
            config_.emulated_seconds_per_sample};
  }

  StageServiceHooks service_hooks() {
    return {[this]() -> Status {
              if (flags_.dead) return unavailable("peer {} is dead (test hook)", config_.peer_id);
              if (!flags_.serving) {
                return unavailable("peer {} is re-syncing its state and does not serve yet", config_.peer_id);
              }
              return Status::ok();
            },
            [this](int64_t) { global_mode() ? sync_->wake() : local_step(); }};
  }

  void local_step() {
    auto stepped = replica_->maybe_local_step(config_.step_every_samples, config_.learning_rate, config_.warmup_steps);
    if (!stepped.is_ok()) log_warn("peer {}: optimizer step skipped: {}", config_.peer_id, stepped.status().to_string());
    if (stepped.is_ok() && *stepped) stats_.update([](PeerStats& s) { ++s.optimizer_steps; });
  }

  StageSyncConfig sync_config() const {
    StageSyncConfig c;
    c.peer_id = config_.peer_id;
    c.global_batch_samples = config_.global_batch_samples;
    c.progress_period_seconds = config_.progress_period_seconds;
    c.progress_stale_seconds = config_.progress_stale_seconds;
    c.record_ttl_seconds = config_.announce_ttl_seconds;
    c.start_on_estimated_arrival = config_.start_on_estimated_arrival;
    c.gather_timeout_seconds = config_.gather_timeout_seconds;
    c.all_reduce = config_.all_reduce;
    c.all_reduce.codec = config_.codec;
    c.state_transfer = config_.state_transfer;
    // A donor's claimed size is checked against what this stage's state can be.
    c.state_transfer.max_state_bytes =
        std::min(c.state_transfer.max_state_bytes, state_bytes_cap(replica_->parameter_count()));
    c.schedule = optim::LrSchedule{.peak_lr = config_.learning_rate, .warmup_steps = config_.warmup_steps,
                                   .total_steps = config_.total_steps};
    c.checkpoint_path = config_.checkpoint_path;
    c.checkpoint_every_steps = config_.checkpoint_every_steps;
    c.test_die_after_allreduce_sends = config_.test_die_after_allreduce_sends;
    c.speaks_for = config_.speaks_for;
    return c;
  }

  void install_test_hooks() {
    flags_.die_by_signal = config_.test_die_by_signal;
    flags_.on_death = [this] { stop_servers(); };
    if (config_.test_die_after_state_chunks > 0) {
      sync_->donor().after_chunk = [this](int64_t served) {
        return served >= config_.test_die_after_state_chunks ? flags_.die(config_.peer_id, "while serving state")
                                                             : Status::ok();
      };
    }
  }

  Status bind_servers() {
    ServerOptions compute = config_.server;
    // Batching needs requests to wait side by side: one worker per batch slot.
    compute.worker_threads = std::max(1, config_.max_batch);
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
        config_.limits, counters_, [this](const PeerIdentity&, const wire::DecodedMessage& m) { return this->compute(m); }));
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
    if (Status refused = refuse_if_dead(message); !refused.is_ok()) return error(message, refused);
    switch (message.header.kind) {
      case wire::MessageKind::ping:
        return ok(message);
      case wire::MessageKind::allreduce_part:
        if (!sync_) return error(message, failed_precondition("peer {} does not average (solo mode)", config_.peer_id));
        if (Status delivered = sync_->deliver_part(message, from); !delivered.is_ok()) return error(message, delivered);
        return ok(message);
      case wire::MessageKind::state_chunk:
        if (!sync_) return error(message, failed_precondition("peer {} does not donate state (solo mode)", config_.peer_id));
        return sync_->donate_state(message);
      default:
        return error(message, unimplemented("the control server does not serve message kind {}",
                                            static_cast<int>(message.header.kind)));
    }
  }

  wire::Frames compute(const wire::DecodedMessage& message) {
    if (Status refused = refuse_if_dead(message); !refused.is_ok()) return error(message, refused);
    if (message.header.kind == wire::MessageKind::ping) return ok(message);
    if (message.header.kind == wire::MessageKind::info) {
      const protocol::SampleLedger ledger = replica_->sample_ledger();
      const protocol::RefusalCounts refusals = refusal_counts();
      auto reply = protocol::encode_info_reply(message.header.request_id, service_->spec(), &ledger, &refusals);
      return reply.is_ok() ? std::move(reply).value() : error(message, reply.status());
    }
    return service_->handle(message);
  }

  protocol::RefusalCounts refusal_counts() {
    const PeerStats s = stats();
    protocol::RefusalCounts counts{{"validation", s.rejected},
                                   {"spec", s.spec_refused},
                                   {"parts", s.parts_refused},
                                   {"contributions_ignored", s.contributions_ignored},
                                   {"states", s.states_refused},
                                   {"unvouched_ahead", s.unvouched_ahead},
                                   {"bad_records", s.bad_records},
                                   {"backward_duplicates", s.ledger.backward_duplicates_refused},
                                   {"expired", s.ledger.expired_dropped},
                                   {"deadline", s.ledger.deadline_refused}};
    if (sync_) counts["state_requests"] = sync_->donor().refused_requests();
    std::lock_guard lock(servers_mu_);
    for (const auto* server : {&compute_server_, &control_server_}) {
      if (!server->has_value()) continue;
      if constexpr (requires(const typename T::server_type& sv) { sv.busy_replies(); sv.oversized_requests(); }) {
        counts["busy"] += static_cast<int64_t>((*server)->busy_replies());
        counts["oversized"] += static_cast<int64_t>((*server)->oversized_requests());
      }
    }
    return counts;
  }

  Status refuse_if_dead(const wire::DecodedMessage& message) const {
    if (message.header.stage != static_cast<uint32_t>(config_.stage_index)) {
      return invalid_argument("this peer serves stage {}, not {}", config_.stage_index, message.header.stage);
    }
    if (flags_.dead) return unavailable("peer {} is dead (test hook)", config_.peer_id);
    return Status::ok();
  }

  wire::Frames ok(const wire::DecodedMessage& request) const {
    wire::MessageHeader header;
    header.kind = wire::MessageKind::result;
    header.stage = static_cast<uint32_t>(config_.stage_index);
    header.request_id = request.header.request_id;
    return wire::Frames{{wire::serialize_header(header)}};
  }

  wire::Frames error(const wire::DecodedMessage& request, const Status& status) const {
    return wire::make_error_reply(request.header.request_id, static_cast<uint32_t>(config_.stage_index), status);
  }

  Status announce() {
    if (flags_.dead || !flags_.serving) return Status::ok();
    PeerAnnouncementRecord record{config_.peer_id, address(), config_.stage_index, stats().throughput,
                                  std::max<int64_t>(0, requests_in_service() - 1)};
    return registry_->announce(stage_registry_key(config_.stage_index), config_.peer_id, record.to_json(),
                               registry_->now() + config_.announce_ttl_seconds);
  }

  PeerConfig config_;
  R* registry_;
  std::shared_ptr<wire::ValidationCounters> counters_;
  PeerFlags flags_;
  StatsBoard stats_;
  std::shared_ptr<Replica<S>> replica_;
  ClientCache<T> clients_;
  std::unique_ptr<StageService<S, Codecs>> service_;
  std::unique_ptr<StageSync<S, T, R, Codecs>> sync_;
  std::mutex servers_mu_;
  std::optional<typename T::server_type> compute_server_;
  std::optional<typename T::server_type> control_server_;
  PeriodicTask announcer_;
  std::atomic<bool> stopped_{false};
};

}  // namespace swarm
