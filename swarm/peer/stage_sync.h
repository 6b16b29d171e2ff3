// stage_sync: the peers of a stage training as one (DESIGN §5.3).
//
// A thread publishes this replica's progress, reads its stage-mates', and when the
// stage has processed the global batch runs a round: the gradients are averaged by
// butterfly all-reduce (in the stage's codec, weighted by samples) and every
// replica applies the same LAMB step, ending bit-identical (checked by hash). A
// replica that is behind, failed its round or diverged stops serving, downloads a
// stage-mate's state, and serves again. Its control traffic (parts, state chunks)
// arrives on the peer's control server, never behind compute.
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
#include <map>
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
#include "swarm/averaging/progress.h"
#include "swarm/averaging/state_transfer.h"
#include "swarm/checkpoint/checkpoint.h"
#include "swarm/core/log.h"
#include "swarm/core/random.h"
#include "swarm/optim/lr_schedule.h"
#include "swarm/peer/peer_stats.h"
#include "swarm/peer/replica.h"
#include "swarm/protocol/client_cache.h"

namespace swarm {

struct StageSyncConfig {
  std::string peer_id;
  int64_t global_batch_samples = 16;
  double progress_period_seconds = 0.2;  // publish progress and re-read stage-mates'
  double progress_stale_seconds = 5.0;   // a stage-mate silent this long is not counted
  double record_ttl_seconds = 5.0;
  bool start_on_estimated_arrival = true;
  double gather_timeout_seconds = 2.0;  // wait for stage-mates to join a round
  AllReduceConfig all_reduce;
  StateTransferConfig state_transfer;
  optim::LrSchedule schedule;
  // The stage-mate first in id order writes the stage's checkpoint here every so many global steps.
  std::string checkpoint_path;
  int64_t checkpoint_every_steps = 0;
  int64_t test_die_after_allreduce_sends = 0;
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
        stats_(stats), flags_(flags), announce_(std::move(announce)),
        nonce_source_(static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
                      std::hash<std::string>{}(config_.peer_id)) {}
  ~StageSync() { stop(); }

  // Publishes this replica's progress until the registry shows it, then starts the
  // loop, not serving until it has looked at the stage a few times: a joiner's young
  // DHT node may not yet show the stage-mates it must sync from.
  Status start(std::string control_address) {
    control_address_ = std::move(control_address);
    SWARM_RETURN_IF_ERROR(publish_progress(false));
    const auto visible_by = Clock::now() + std::chrono::seconds(5);
    while (!progress_visible() && Clock::now() < visible_by) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      (void)publish_progress(false);
    }
    set_serving(false);
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
  }

  void withdraw() { (void)registry_->withdraw(progress_registry_key(stage()), config_.peer_id); }

  // A backward arrived: the loop re-checks the global batch now, not at its next tick.
  void wake() {
    {
      std::lock_guard lock(mu_);
      samples_arrived_ = true;
    }
    cv_.notify_all();
  }

  Status deliver_part(const wire::DecodedMessage& message) {
    return inbox_.template deliver<Codecs>(message, config_.all_reduce.codec);
  }

  // Donates even while not serving: a peer waiting out a failed round still holds its
  // step's state, and a joiner may need exactly that. Joiners check the hash.
  wire::Frames donate_state(const wire::DecodedMessage& request) {
    return donor_.handle(request, stage(), replica_->step(), [this] { return replica_->checkpoint(); });
  }
  StateDonor& donor() { return donor_; }

 private:
  int stage() const { return replica_->stage_index(); }

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

  void loop() {
    double last_publish = -1e9;
    while (true) {
      {
        std::unique_lock lock(mu_);
        cv_.wait_for(lock, std::chrono::duration<double>(config_.progress_period_seconds / 2),
                     [&] { return stopping_ || samples_arrived_; });
        samples_arrived_ = false;
        if (stopping_ || flags_->dead) return;
      }
      update_rate();
      const double now = registry_->now();
      if (now - last_publish >= config_.progress_period_seconds) {
        (void)publish_progress(false);
        last_publish = now;
      }
      if (now - last_progress_read_ >= config_.progress_period_seconds) read_progress();
      const GlobalBatchDecision decision = decide();
      if (decision.behind || !flags_->serving) {
        resync();
      } else if (decision.ready) {
        run_round();
        last_publish = -1e9;
      }
    }
  }

  // ---- progress records ----

  ProgressRecord own_progress(bool averaging, int64_t samples_override = -1) {
    ProgressRecord r;
    r.peer_id = config_.peer_id;
    r.address = control_address_;
    r.stage = stage();
    r.published_at = registry_->now();
    r.averaging = averaging;
    r.samples_per_second = samples_per_second_;
    r.step = replica_->step();
    r.samples = samples_override >= 0 ? samples_override : replica_->accumulated_samples();
    r.params_hash = replica_->params_hash();
    r.recent_hashes = replica_->recent_hashes();
    r.round_nonce = averaging ? round_nonce_ : 0;
    r.stage_mates_seen = static_cast<int>(stage_progress_.size());
    r.allreduce_bytes = allreduce_bytes_;
    r.allreduce_values = allreduce_values_;
    return r;
  }

  Status publish_progress(bool averaging, int64_t samples_override = -1) {
    return registry_->announce(progress_registry_key(stage()), config_.peer_id,
                               own_progress(averaging, samples_override).to_json(),
                               registry_->now() + config_.record_ttl_seconds);
  }

  bool progress_visible() {
    auto records = registry_->get(progress_registry_key(stage()));
    if (!records.is_ok()) return false;
    return std::any_of(records->begin(), records->end(), [&](const Record& r) { return r.subkey == config_.peer_id; });
  }

  // Stage-mates' records, merged into what was known, newest per peer, forgotten only
  // once stale: a DHT lookup that misses a record (a young DHT does) must not make a
  // stage-mate vanish and this peer average alone.
  void read_progress() {
    auto records = registry_->get(progress_registry_key(stage()));
    const double now = registry_->now();
    last_progress_read_ = now;
    std::map<std::string, ProgressRecord> merged;
    for (auto& r : stage_progress_) merged[r.peer_id] = std::move(r);
    if (records.is_ok()) {
      ++progress_reads_;
      for (const auto& record : *records) {
        auto progress = ProgressRecord::from_json(record.value);
        if (!progress.is_ok() || progress->peer_id == config_.peer_id) continue;
        auto it = merged.find(progress->peer_id);
        if (it == merged.end() || progress->published_at >= it->second.published_at) {
          merged[progress->peer_id] = *progress;
        }
      }
    }
    stage_progress_.clear();
    for (auto& [id, r] : merged) {
      if (r.published_at >= now - config_.progress_stale_seconds) stage_progress_.push_back(std::move(r));
    }
  }

  GlobalBatchDecision decide() {
    std::vector<ProgressRecord> all = stage_progress_;
    all.push_back(own_progress(false));
    const GlobalBatchConfig batch{config_.global_batch_samples, config_.progress_stale_seconds,
                                  config_.start_on_estimated_arrival};
    return decide_global_batch(batch, replica_->step(), all, registry_->now());
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

  // Not serving until this replica holds the stage's state: that of a stage-mate at a
  // later step, or, after a failed or diverged round, of one at the same step whose
  // parameters differ. The routing record is left to lapse rather than withdrawn, so
  // the next announce (with a later expiry) brings the peer back.
  void resync() {
    const int64_t my_step = replica_->step();
    if (flags_->serving.exchange(false)) {
      stats_->notify();
      log_info("peer {}: stops serving at step {} to re-sync", config_.peer_id, my_step);
      needs_resync_ = true;
    }
    bool stage_mate_catching_up = false;
    std::vector<ProgressRecord> donors = find_donors(my_step, &stage_mate_catching_up);
    if (donors.empty() && progress_reads_ < 3) return;  // not looked long enough to be sure
    if (donors.empty()) {
      serve_own_state(my_step, stage_mate_catching_up);
      return;
    }
    download_from(donors);
  }

  std::vector<ProgressRecord> find_donors(int64_t my_step, bool* stage_mate_catching_up) {
    std::vector<ProgressRecord> donors;
    const double now = registry_->now();
    const uint64_t my_hash = replica_->params_hash();
    for (const auto& r : stage_progress_) {
      if (r.published_at < now - config_.progress_stale_seconds || r.address.empty()) continue;
      if (r.step > my_step || (r.step == my_step && needs_resync_ && r.params_hash != my_hash)) {
        donors.push_back(r);
      } else if (r.step == my_step - 1 && r.averaging) {
        *stage_mate_catching_up = true;  // still in the round this peer just left
      }
    }
    return donors;
  }

  // Nobody holds other state. After a bad round, wait (bounded) for stage-mates still
  // finishing theirs before concluding this state is the stage's.
  void serve_own_state(int64_t my_step, bool stage_mate_catching_up) {
    const double now = registry_->now();
    if (needs_resync_ && stage_mate_catching_up) {
      if (catching_up_since_ < 0) catching_up_since_ = now;
      if (now - catching_up_since_ < config_.progress_stale_seconds) return;
    }
    catching_up_since_ = -1;
    const bool was_resyncing = needs_resync_;
    needs_resync_ = false;
    start_serving();
    if (was_resyncing) log_info("peer {}: serving at step {}: no stage-mate holds other state", config_.peer_id, my_step);
  }

  void download_from(const std::vector<ProgressRecord>& donors) {
    std::vector<AllReduceMember> members;
    for (const auto& d : donors) members.push_back({d.peer_id, d.address});
    StateDownloadReport report;
    auto state = download_state(*clients_, stage(), members, config_.state_transfer, &report);
    if (!state.is_ok()) {
      log_warn("peer {}: state download failed: {}", config_.peer_id, state.status().to_string());
      read_progress();
      return;
    }
    if (Status loaded = replica_->load(*state); !loaded.is_ok()) {
      log_warn("peer {}: downloaded state does not fit: {}", config_.peer_id, loaded.to_string());
      return;
    }
    const uint64_t hash = replica_->params_hash();
    // The donor's published hash for that step must match what arrived.
    for (const auto& d : donors) {
      for (const auto& [step, published] : d.recent_hashes) {
        if (step == state->step && published != hash) {
          log_warn("peer {}: state from {} hashes to {:016x}, {} announced {:016x}", config_.peer_id,
                   report.donors_used.back(), hash, d.peer_id, published);
          return;
        }
      }
    }
    inbox_.finish_step(state->step - 1);
    needs_resync_ = false;
    stats_->update([&](PeerStats& s) {
      ++s.state_downloads;
      s.last_download_donors = static_cast<int64_t>(report.donors_used.size());
      s.last_download_resumed_at = report.resumed_at;
      s.global_step = state->step;
      s.params_hash = hash;
    });
    log_info("peer {}: downloaded {} bytes of step {} from {} (resumed at {}), hash {:016x}; serving", config_.peer_id,
             report.bytes, state->step, fmt::join(report.donors_used, ","), report.resumed_at, hash);
    (void)publish_progress(false);
    start_serving();
  }

  // ---- rounds ----

  void run_round() {
    const int64_t step = replica_->step();
    typename Replica<S>::Gradients gradients = replica_->take_gradients();
    round_nonce_ = nonce_source_.next() | 1;  // never 0, which means "not seen"
    (void)publish_progress(true, gradients.samples);
    if (!gather(step, gradients.samples)) return;
    AllReduceRound round = make_round(step, gradients);
    AllReduceHooks hooks;
    if (config_.test_die_after_allreduce_sends > 0) {
      hooks.after_send = [this](int64_t sent) {
        return sent >= config_.test_die_after_allreduce_sends
                   ? flags_->die(config_.peer_id, "in the middle of an all-reduce")
                   : Status::ok();
      };
    }
    auto result = butterfly_all_reduce<Codecs>(*clients_, inbox_, round, gradients.mean, config_.all_reduce, hooks);
    if (flags_->dead) {
      if (flags_->on_death) flags_->on_death();
      return;
    }
    if (!result.is_ok()) {
      log_warn("peer {}: round of step {} failed: {}", config_.peer_id, step, result.status().to_string());
      fail_round(gradients.samples);
      set_serving(false);  // the stage-mates that finished hold the stage's state now
      return;
    }
    allreduce_bytes_ += result->payload_bytes_sent;
    allreduce_values_ += result->payload_values_sent;
    finish_round(step, gradients.params_hash, *result);
  }

  // Waits for the stage-mates at this step to join; false if the round cannot happen.
  bool gather(int64_t step, int64_t samples) {
    const Deadline until = deadline_after(config_.gather_timeout_seconds);
    while (true) {
      read_progress();
      const GroupReadiness readiness =
          group_readiness(stage_progress_, step, registry_->now(), config_.progress_stale_seconds);
      if (readiness == GroupReadiness::someone_ahead) {
        log_warn("peer {}: a stage-mate is past step {}; dropping this round", config_.peer_id, step);
        fail_round(samples);
        return false;
      }
      if (readiness == GroupReadiness::complete || Clock::now() >= until) return true;
      std::unique_lock lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(10), [&] { return stopping_; });
      if (stopping_) return false;
    }
  }

  AllReduceRound make_round(int64_t step, const typename Replica<S>::Gradients& gradients) {
    AllReduceRound round;
    round.stage = stage();
    round.step = step;
    round.my_id = config_.peer_id;
    round.weight = static_cast<double>(gradients.samples);
    round.params_hash = gradients.params_hash;
    round.members.push_back({config_.peer_id, control_address_, round_nonce_});
    for (const auto& r : round_members(stage_progress_, step, registry_->now(), config_.progress_stale_seconds)) {
      round.members.push_back({r.peer_id, r.address, r.averaging ? r.round_nonce : 0});
    }
    return round;
  }

  void fail_round(int64_t samples) {
    stats_->update([&](PeerStats& s) {
      ++s.rounds_failed;
      s.lost_samples += samples;
    });
    needs_resync_ = true;
  }

  void finish_round(int64_t step, uint64_t hash_before, const AllReduceResult& result) {
    const uint64_t consensus = consensus_hash(result.params_hashes);
    Status stepped = replica_->apply_global_step(result.averaged, config_.schedule);
    if (!stepped.is_ok()) log_warn("peer {}: step {} skipped: {}", config_.peer_id, step + 1, stepped.to_string());
    const uint64_t hash = replica_->params_hash();
    stats_->update([&](PeerStats& s) {
      // Counted with the step itself, so whoever sees the new step sees the round too.
      ++s.rounds_completed;
      ++s.optimizer_steps;
      if (hash_before != consensus) ++s.diverged;
      s.global_step = step + 1;
      s.params_hash = hash;
      s.allreduce_bytes = allreduce_bytes_;
      s.allreduce_values = allreduce_values_;
    });
    inbox_.finish_step(step);
    bool leader = result.members.front().peer_id == config_.peer_id;
    if (hash_before != consensus) {
      // Stepped from different parameters than the stage: this replica is wrong.
      log_warn("peer {}: parameters at step {} hashed {:016x}, the stage's {:016x}: re-syncing", config_.peer_id, step,
               hash_before, consensus);
      set_serving(false);
      needs_resync_ = true;
      leader = false;
    }
    (void)publish_progress(false);
    if (leader) maybe_checkpoint(step + 1);
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
  AllReduceInbox inbox_;
  StateDonor donor_;

  // The sync thread's own state.
  std::vector<ProgressRecord> stage_progress_;
  double last_progress_read_ = -1e9;
  int64_t progress_reads_ = 0;
  bool needs_resync_ = false;  // a round failed or this replica diverged
  double catching_up_since_ = -1;
  uint64_t round_nonce_ = 0;
  SplitMix64 nonce_source_;
  double rate_window_start_ = -1;
  int64_t rate_window_samples_ = 0;
  double samples_per_second_ = 0;
  int64_t allreduce_bytes_ = 0;
  int64_t allreduce_values_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool samples_arrived_ = false;
  std::thread thread_;
};

}  // namespace swarm
