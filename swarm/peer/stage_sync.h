// stage_sync: the peers of a stage training as one (DESIGN §5.3), driven here.
//
// What is decided (who leads a round, who is in it, when it begins, commits or is
// aborted, whom to trust, when to re-sync) is StageRounds (swarm/averaging/
// round_protocol.h), a state machine without clock or I/O. This is its thin
// driver: three threads feed it the time, the registry's records and the messages
// that arrive on the peer's control server, send what it returns over the
// Transport, download the state it asks for, and apply what it decides.
//   - a publisher publishes this replica's progress on its own timer, never held up
//     by a round or a download, so a stage-mate never vanishes while it works;
//   - a reader reads the stage's records into the protocol;
//   - the sync thread ticks the protocol, sends its messages, collects the
//     replies, and runs state downloads.
//
//   StageSync<S, T, R, Codecs> sync(config, replica, &registry, &clients, &stats, &flags, announce);
//   SWARM_RETURN_IF_ERROR(sync.start(control_address));
#pragma once

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "swarm/api/codec.h"
#include "swarm/api/registry.h"
#include "swarm/api/transport.h"
#include "swarm/averaging/all_reduce.h"
#include "swarm/averaging/averaging_messages.h"
#include "swarm/averaging/progress.h"
#include "swarm/averaging/round_protocol.h"
#include "swarm/averaging/state_transfer.h"
#include "swarm/checkpoint/checkpoint.h"
#include "swarm/core/log.h"
#include "swarm/optim/lr_schedule.h"
#include "swarm/peer/peer_stats.h"
#include "swarm/peer/periodic_task.h"
#include "swarm/peer/replica.h"
#include "swarm/peer/replica_port.h"
#include "swarm/peer/state_inspection.h"
#include "swarm/protocol/client_cache.h"

namespace swarm {

struct StageSyncConfig {
  std::string peer_id;
  int64_t global_batch_samples = 16;
  double progress_period_seconds = 0.2;  // publish progress and re-read stage-mates'
  double progress_stale_seconds = 5.0;   // a stage-mate silent this long is absent
  // The sync thread ticks the protocol this often (timeouts, retries); a backward
  // or a round message ticks it at once.
  double tick_seconds = 0.005;
  double record_ttl_seconds = 5.0;
  bool start_on_estimated_arrival = true;
  double gather_timeout_seconds = 2.0;  // unused by the agreed rounds; kept for the flag
  AllReduceConfig all_reduce;           // codec, chunk size, part timeout (a group's phase timeout)
  StateTransferConfig state_transfer;
  optim::LrSchedule schedule;
  // The leader of a round writes the stage's checkpoint here every so many global steps.
  std::string checkpoint_path;
  int64_t checkpoint_every_steps = 0;
  int64_t test_die_after_allreduce_sends = 0;
  ContributionScale test_contribution_scale;  // attack tests: a Byzantine stage-mate
  int64_t test_forge_reduced_part_from = -1;  // attack tests: see RoundsConfig
  // Whether a connection may send round messages as a peer id; unset, all may.
  SpeaksFor speaks_for;
};

// Whether the peer serves, and whether a test hook has "killed" it; shared by its parts.
struct PeerFlags {
  std::atomic<bool> serving{false};
  std::atomic<bool> dead{false};
  bool die_by_signal = false;
  // Makes the peer unreachable, like a killed process; called from the sync thread,
  // never from a request handler (which cannot stop its own server).
  std::function<void()> on_death;

  Status die(const std::string& peer_id, std::string_view where) {
    log_warn("peer {}: test hook: dying {}", peer_id, where);
    if (die_by_signal) ::raise(SIGKILL);
    dead = true;
    return cancelled("peer {} died (test hook) {}", peer_id, where);
  }
};

template <Stage S, Transport T, Registry R, CodecTable Codecs>
class StageSync {
 public:
  StageSync(StageSyncConfig config, std::shared_ptr<Replica<S>> replica, R* registry, ClientCache<T>* clients,
            StatsBoard* stats, PeerFlags* flags, std::function<void()> announce)
      : config_(std::move(config)), replica_(std::move(replica)), registry_(registry), clients_(clients),
        stats_(stats), flags_(flags), announce_(std::move(announce)), port_(replica_, config_.schedule, config_.test_contribution_scale) {}
  ~StageSync() { stop(); }

  // Publishes this replica's progress until the registry shows it, then starts the
  // threads; the protocol looks at the stage a while before it trusts an empty view.
  Status start(std::string control_address) {
    control_address_ = std::move(control_address);
    const RoundsConfig rounds = rounds_config();
    SWARM_RETURN_IF_ERROR(rounds.validate(config_.progress_period_seconds));
    SWARM_RETURN_IF_ERROR(config_.all_reduce.validate());
    if (!(config_.tick_seconds > 0) || config_.tick_seconds > rounds.phase_timeout_seconds) {
      return invalid_argument("the sync thread ticks every {} s: it must be > 0 and at most the {} s phase timeout "
                              "its ticks enforce", config_.tick_seconds, rounds.phase_timeout_seconds);
    }
    rounds_ = std::make_unique<StageRounds>(rounds, &port_, RoundCodec::of<Codecs>(config_.all_reduce.codec),
                                            registry_->now());
    (void)publish_progress();
    const auto visible_by = Clock::now() + std::chrono::seconds(5);
    while (!progress_visible() && Clock::now() < visible_by) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      (void)publish_progress();
    }
    set_serving(false);
    publisher_.start(config_.progress_period_seconds, [this] { (void)publish_progress(); });
    reader_.start(config_.progress_period_seconds, [this] { read_progress(); });
    thread_ = std::thread([this] { loop(); });
    return Status::ok();
  }

  void stop() {
    {
      std::lock_guard lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    publisher_.stop();
    reader_.stop();
  }

  void withdraw() { (void)registry_->withdraw(progress_registry_key(stage()), config_.peer_id); }

  // The peer moves to another stage and no longer serves this one. It stays in the
  // stage's rounds until one steps the samples it accumulated (or none is pending,
  // or no stage-mate serves its step to take them), then a departed record tells
  // the stage-mates not to wait for it. True if it left that way; false at `until`.
  // Samples no round took are counted as lost to the move.
  bool leave(Deadline until) {
    {
      std::lock_guard lock(mu_);
      leaving_ = true;
    }
    cv_.notify_all();
    bool clean = false;
    {
      std::unique_lock lock(mu_);
      clean = left_cv_.wait_until(lock, until, [&] { return left_ || stopping_; }) && left_;
    }
    stop();
    replica_->lose_pending_to_move();
    departed_ = true;
    (void)publish_progress();
    return clean;
  }

  // A backward arrived: the protocol re-checks the global batch now, not at its next tick.
  void wake() {
    {
      std::lock_guard lock(mu_);
      woken_ = true;
    }
    cv_.notify_all();
  }

  // A round message from a stage-mate: checked, then handed to the protocol. The
  // error it returns is the sender's reply. `from`: who the transport authenticated.
  Status deliver_part(const wire::DecodedMessage& message, const PeerIdentity& from) {
    RoundMessageLimits limits;
    limits.max_chunk_elements = config_.all_reduce.max_chunk_elements;
    limits.max_members = config_.all_reduce.max_members;
    auto parsed = parse_round_message(message, RoundCodec::of<Codecs>(config_.all_reduce.codec), limits);
    if (!parsed.is_ok()) {
      ++malformed_;
      return parsed.status();
    }
    if (config_.speaks_for && !config_.speaks_for(parsed->sender, from)) {
      ++impostor_;
      return permission_denied("round message: the connection does not speak for {}", parsed->sender);
    }
    Status received;
    {
      std::lock_guard lock(mu_);
      if (!rounds_) return unavailable("peer {} has not started its rounds", config_.peer_id);
      received = rounds_->receive(*parsed, registry_->now());
      // The protocol answers now: a JOIN may complete the batch, a BEGIN start the
      // round. A refused message does not, or junk would spin the thread.
      woken_ = woken_ || received.is_ok();
    }
    cv_.notify_all();
    return received;
  }

  // Donates even while not serving: a peer waiting out a failed round still holds its
  // step's state, and a joiner may need exactly that. Joiners check the hash.
  wire::Frames donate_state(const wire::DecodedMessage& request) {
    return donor_.handle(request, stage(), replica_->step(), [this] { return replica_->checkpoint(); });
  }
  StateDonor& donor() { return donor_; }

 private:
  using CallHandle = decltype(std::declval<typename T::client_type&>().call(wire::Frames{}, Deadline{}));
  struct InFlight {
    Outgoing sent;  // frames moved out; the rest kept for delivery_failed
    CallHandle call;
  };

  int stage() const { return replica_->stage_index(); }

  RoundsConfig rounds_config() const {
    RoundsConfig c;
    c.peer_id = config_.peer_id;
    c.address = control_address_;
    c.stage = stage();
    c.global_batch_samples = config_.global_batch_samples;
    c.start_on_estimated_arrival = config_.start_on_estimated_arrival;
    c.stale_seconds = config_.progress_stale_seconds;
    c.join_period_seconds = config_.progress_period_seconds;
    c.joiner_silent_seconds = std::max(1.5, 4 * config_.progress_period_seconds);
    c.phase_timeout_seconds = config_.all_reduce.part_timeout_seconds;
    c.look_seconds = 3 * config_.progress_period_seconds;
    c.max_chunk_elements = config_.all_reduce.max_chunk_elements;
    c.max_members = config_.all_reduce.max_members;
    c.max_early_values = 2 * std::max<int64_t>(replica_->parameter_count(), 1);
    c.gradient_values = replica_->parameter_count();
    c.test_forge_reduced_part_from = config_.test_forge_reduced_part_from;
    return c;
  }

  void set_serving(bool serving) {
    flags_->serving = serving;
    stats_->notify();
  }

  // Announced before waiters see it serve, so whoever sees `serving` finds the record.
  void start_serving() {
    flags_->serving = true;
    announce_();
    stats_->notify();
  }

  // ---- the publisher and the reader ----

  Status publish_progress() {
    if (flags_->dead) return Status::ok();  // a "killed" peer's record lapses, as a killed process's does
    ProgressRecord record;
    {
      std::lock_guard lock(mu_);
      if (!rounds_) return Status::ok();
      record = rounds_->progress(registry_->now());
    }
    record.departed = departed_;
    Status announced = registry_->announce(progress_registry_key(stage()), config_.peer_id, record.to_json(),
                                           registry_->now() + config_.record_ttl_seconds);
    if (announced.is_ok()) {
      std::lock_guard lock(mu_);
      if (rounds_) rounds_->published(record.published_at);
    }
    return announced;
  }

  bool progress_visible() {
    auto records = registry_->get(progress_registry_key(stage()));
    if (!records.is_ok()) return false;
    return std::any_of(records->begin(), records->end(), [&](const Record& r) { return r.subkey == config_.peer_id; });
  }

  // Stage-mates' records, merged into what was known, newest per peer, forgotten only
  // once stale: a DHT lookup that misses a record (a young DHT does) must not make a
  // stage-mate vanish.
  void read_progress() {
    auto records = registry_->get(progress_registry_key(stage()));
    const double now = registry_->now();
    int64_t bad = 0;
    if (records.is_ok()) {
      for (const auto& record : *records) {
        auto progress = ProgressRecord::from_json(record.value);
        // A record from the future would stay fresh for ever.
        if (!progress.is_ok() || progress->published_at > now + kMaxClockSkewSeconds) {
          ++bad;
          continue;
        }
        if (progress->peer_id == config_.peer_id) continue;
        auto& known = known_records_[progress->peer_id];
        if (progress->published_at >= known.published_at) known = std::move(progress).value();
      }
    }
    std::erase_if(known_records_, [&](const auto& entry) {
      return entry.second.published_at < now - config_.progress_stale_seconds;
    });
    std::vector<ProgressRecord> view;
    for (const auto& [id, r] : known_records_) view.push_back(r);
    if (bad > 0) stats_->update([&](PeerStats& s) { s.bad_records += bad; });
    {
      std::lock_guard lock(mu_);
      if (rounds_) rounds_->observe(view, now);
    }
    cv_.notify_all();
  }

  // ---- the sync thread ----

  void loop() {
    while (true) {
      {
        std::unique_lock lock(mu_);
        const double join_in = rounds_->join_due_at() - registry_->now();
        // The floor keeps a JOIN that stays due (its leader has no address yet) from spinning the thread.
        const double wait = std::clamp(join_in, std::min(0.002, config_.tick_seconds), config_.tick_seconds);
        cv_.wait_for(lock, std::chrono::duration<double>(wait), [&] { return stopping_ || woken_; });
        woken_ = false;
        if (stopping_ || flags_->dead) return;
      }
      update_rate();
      const double now = registry_->now();
      std::vector<Outgoing> outbox;
      std::vector<RoundEvent> events;
      std::optional<VouchedState> target;
      bool serving = false;
      bool leave_now = false;
      {
        std::lock_guard lock(mu_);
        rounds_->set_rate(samples_per_second_);
        rounds_->tick(now);
        outbox = rounds_->take_outbox();
        events = rounds_->take_events();
        if (rounds_->mode() == StageRounds::Mode::resyncing) target = rounds_->resync_target();
        serving = rounds_->serving();
        leave_now = leaving_ && !rounds_->in_round() &&
                    (replica_->accumulated_samples() == 0 || !rounds_->mates_at_step());
      }
      send_all(std::move(outbox));
      if (flags_->dead) {
        if (flags_->on_death) flags_->on_death();
        return;
      }
      collect_replies();
      for (const auto& event : events) handle(event);
      report_counters();
      if (serving != flags_->serving.load()) serving ? start_serving() : set_serving(false);
      if (target) resync(*target);
      if (leave_now) {
        {
          std::lock_guard lock(mu_);
          left_ = true;
        }
        left_cv_.notify_all();
        return;
      }
    }
  }

  void send_all(std::vector<Outgoing> outbox) {
    const Deadline deadline = deadline_after(config_.all_reduce.part_timeout_seconds);
    for (auto& out : outbox) {
      auto client = clients_->get(out.address);
      if (client == nullptr) {
        failed(out, unavailable("cannot connect to {}", out.address));
        continue;
      }
      wire::Frames frames = std::move(out.frames);
      in_flight_.push_back({std::move(out), client->call(std::move(frames), deadline)});
      if (in_flight_.back().sent.op == RoundOp::part && config_.test_die_after_allreduce_sends > 0 &&
          ++parts_sent_ >= config_.test_die_after_allreduce_sends) {
        (void)flags_->die(config_.peer_id, "in the middle of an all-reduce");
        return;
      }
    }
  }

  void collect_replies() {
    for (auto it = in_flight_.begin(); it != in_flight_.end();) {
      if (!it->call.ready()) {
        ++it;
        continue;
      }
      auto reply = decode_result_reply(it->call.get());
      if (!reply.is_ok() && reply.status().code() != StatusCode::already_exists) {
        const StatusCode code = reply.status().code();
        if (code == StatusCode::unavailable || code == StatusCode::deadline_exceeded) {
          clients_->forget(it->sent.address);
        }
        failed(it->sent, reply.status());
      }
      it = in_flight_.erase(it);
    }
  }

  void failed(const Outgoing& sent, const Status& why) {
    std::lock_guard lock(mu_);
    rounds_->delivery_failed(sent, why, registry_->now());
  }

  void handle(const RoundEvent& event) {
    switch (event.kind) {
      case RoundEvent::Kind::stepped:
        stats_->update([&](PeerStats& s) {
          // Counted with the step itself, so whoever sees the new step sees the round too.
          ++s.rounds_completed;
          ++s.optimizer_steps;
          s.global_step = replica_->step();
          s.params_hash = replica_->params_hash();
        });
        if (!event.text.empty()) log_warn("peer {}: step {}: {}", config_.peer_id, event.step, event.text);
        if (event.led) maybe_checkpoint(event.step);
        break;
      case RoundEvent::Kind::aborted:
        stats_->update([](PeerStats& s) { ++s.rounds_failed; });
        log_warn("peer {}: round {:016x} of step {} aborted: {}", config_.peer_id, event.group, event.step, event.text);
        break;
      case RoundEvent::Kind::diverged:
        stats_->update([](PeerStats& s) { ++s.diverged; });
        log_warn("peer {}: step {}: {}; re-syncing", config_.peer_id, event.step, event.text);
        break;
      case RoundEvent::Kind::resync:
        log_info("peer {}: stops serving at step {} to re-sync: {}", config_.peer_id, replica_->step(), event.text);
        set_serving(false);
        break;
      case RoundEvent::Kind::serving:
        log_info("peer {}: serving its own state at step {}: {}", config_.peer_id, event.step, event.text);
        break;
      case RoundEvent::Kind::refused:
        break;
      case RoundEvent::Kind::banned:
        stats_->update([](PeerStats& s) { ++s.members_banned; });
        log_warn("peer {}: step {}: {}", config_.peer_id, event.step, event.text);
        break;
    }
  }

  void report_counters() {
    RoundCounters c;
    {
      std::lock_guard lock(mu_);
      c = rounds_->counters();
    }
    const int64_t refused = c.refused_no_begin + c.refused_not_member + c.refused_bad_part + c.refused_full +
                            malformed_.load() + impostor_.load();
    stats_->update([&](PeerStats& s) {
      s.parts_refused = refused;
      s.unvouched_ahead = c.unvouched_ahead;
      s.allreduce_bytes = c.payload_bytes;
      s.allreduce_values = c.payload_values;
    });
  }

  void update_rate() {
    const double now = registry_->now();
    const int64_t total = stats_->snapshot().samples;
    if (rate_window_start_ < 0) {
      rate_window_start_ = now;
      rate_window_samples_ = total;
      return;
    }
    const double elapsed = now - rate_window_start_;
    if (elapsed < config_.progress_period_seconds) return;
    const double rate = static_cast<double>(total - rate_window_samples_) / elapsed;
    samples_per_second_ = samples_per_second_ == 0 ? rate : 0.7 * samples_per_second_ + 0.3 * rate;
    rate_window_start_ = now;
    rate_window_samples_ = total;
  }

  // ---- re-sync ----

  // Downloads the state the protocol found vouched for, checked before it loads:
  // its step at least the target's, its parameters hashing to what a strict
  // majority published for that step, its layout the stage's, its values finite.
  void resync(const VouchedState& target) {
    set_serving(false);
    std::vector<AllReduceMember> donors;
    for (const auto& d : target.donors) donors.push_back({d.peer_id, d.address});
    auto verified = std::make_shared<uint64_t>(0);
    StateCheck check;
    check.step = [&](int64_t step) -> Status {
      if (step >= target.step) return Status::ok();
      return failed_precondition("step {} is behind the vouched step {}", step, target.step);
    };
    check.state = [&](const Checkpoint& state) -> Status {
      SWARM_ASSIGN_OR_RETURN(uint64_t hash, StateInspection<S>::inspect(*replica_, state));
      // A donor that stepped since the target was chosen hands over a newer state,
      // which this peer's view of the records may not show yet: the reader keeps
      // reading while it waits (bounded) for a majority to be seen vouching for it.
      const Deadline until = deadline_after(config_.progress_stale_seconds);
      for (auto verdict = judge_download(state.step, hash); verdict != StageRounds::Downloaded::load;
           verdict = judge_download(state.step, hash)) {
        if (verdict == StageRounds::Downloaded::refuse || Clock::now() >= until || flags_->dead) {
          return data_loss("its parameters hash to {:016x}, which no majority vouches for at step {}{}", hash,
                           state.step, verdict == StageRounds::Downloaded::refuse ? " (the stage moved past it)" : "");
        }
        std::this_thread::sleep_for(std::chrono::duration<double>(config_.progress_period_seconds / 4));
      }
      *verified = hash;
      return Status::ok();
    };
    StateDownloadReport report;
    auto state = download_state(*clients_, stage(), donors, config_.state_transfer, &report, check);
    for (const auto& why : report.refused) log_warn("peer {}: refused a state: {}", config_.peer_id, why);
    if (!report.refused.empty()) {
      stats_->update([&](PeerStats& s) { s.states_refused += static_cast<int64_t>(report.refused.size()); });
    }
    bool loaded = false;
    if (!state.is_ok()) {
      log_warn("peer {}: state download failed: {}", config_.peer_id, state.status().to_string());
    } else if (Status status = replica_->load(*state); !status.is_ok()) {
      log_warn("peer {}: downloaded state does not fit: {}", config_.peer_id, status.to_string());
    } else if (replica_->params_hash() != *verified) {  // inspection and replica disagree: a bug, not an attack
      log_error("peer {}: loaded state of step {} hashes to {:016x}, checked as {:016x}", config_.peer_id, state->step,
                replica_->params_hash(), *verified);
    } else {
      loaded = true;
      stats_->update([&](PeerStats& s) {
        ++s.state_downloads;
        s.last_download_donors = static_cast<int64_t>(report.donors_used.size());
        s.last_download_resumed_at = report.resumed_at;
        s.global_step = state->step;
        s.params_hash = *verified;
      });
      log_info("peer {}: downloaded {} bytes of step {} from {} (resumed at {}), hash {:016x}", config_.peer_id,
               report.bytes, state->step, fmt::join(report.donors_used, ","), report.resumed_at, *verified);
    }
    std::lock_guard lock(mu_);
    rounds_->resync_finished(loaded, registry_->now());
  }

  StageRounds::Downloaded judge_download(int64_t step, uint64_t hash) {
    std::lock_guard lock(mu_);
    return rounds_->judge_download(step, hash);
  }

  void maybe_checkpoint(int64_t step) {
    if (config_.checkpoint_path.empty() || config_.checkpoint_every_steps <= 0) return;
    if (step % config_.checkpoint_every_steps != 0) return;
    Result<Checkpoint> state = replica_->checkpoint();
    Status saved = state.is_ok() ? save_checkpoint(config_.checkpoint_path, *state) : state.status();
    if (!saved.is_ok()) log_warn("peer {}: checkpoint failed: {}", config_.peer_id, saved.to_string());
  }

  const StageSyncConfig config_;
  std::shared_ptr<Replica<S>> replica_;
  R* registry_;
  ClientCache<T>* clients_;
  StatsBoard* stats_;
  PeerFlags* flags_;
  std::function<void()> announce_;
  std::string control_address_;
  ReplicaPort<S> port_;
  StateDonor donor_;

  std::mutex mu_;  // rounds_ and the flags below
  std::unique_ptr<StageRounds> rounds_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool woken_ = false;  // a backward or a round message came: tick now
  bool leaving_ = false;
  bool left_ = false;
  std::condition_variable left_cv_;
  std::atomic<bool> departed_{false};
  std::atomic<int64_t> malformed_{0}, impostor_{0};

  // The reader's own.
  std::map<std::string, ProgressRecord> known_records_;
  // The sync thread's own.
  std::vector<InFlight> in_flight_;
  int64_t parts_sent_ = 0;
  double rate_window_start_ = -1;
  int64_t rate_window_samples_ = 0;
  double samples_per_second_ = 0;

  PeriodicTask publisher_;
  PeriodicTask reader_;
  std::thread thread_;
};

}  // namespace swarm
