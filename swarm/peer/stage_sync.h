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
#include <optional>
#include <set>
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
#include "swarm/optim/optimizer.h"
#include "swarm/peer/peer_stats.h"
#include "swarm/peer/replica.h"
#include "swarm/peer/stage_state.h"
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
  // Whether a connection may send all-reduce parts as a peer id; unset, all may.
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
        stats_(stats), flags_(flags), announce_(std::move(announce)), inbox_(inbox_options()),
        nonce_source_(static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
                      std::hash<std::string>{}(config_.peer_id)) {}
  ~StageSync() { stop(); }

  // Publishes this replica's progress until the registry shows it, then starts the
  // loop, not serving until it has looked at the stage a few times: a joiner's young
  // DHT node may not yet show the stage-mates it must sync from.
  Status start(std::string control_address) {
    control_address_ = std::move(control_address);
    inbox_.finish_step(replica_->step() - 1);  // a resumed replica takes parts from its own step on
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

  // The peer moves to another stage and no longer serves this one. The loop takes
  // part in the round that ends this step, so the samples this replica accumulated
  // still count; then a departed record tells the stage-mates not to wait for it.
  // True if it left after that round (or with nothing pending, or with no stage-mate
  // at its step to take them); false at `until`. Samples no round took are counted as
  // lost to the move.
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
    replica_->lose_pending_to_move();  // what no round took (none when one did)
    departed_ = true;
    (void)publish_progress(false);
    return clean;
  }

  // A backward arrived: the loop re-checks the global batch now, not at its next tick.
  void wake() {
    {
      std::lock_guard lock(mu_);
      samples_arrived_ = true;
    }
    cv_.notify_all();
  }

  // `from`: who the transport authenticated, checked against the part's sender by speaks_for.
  Status deliver_part(const wire::DecodedMessage& message, const PeerIdentity& from) {
    return inbox_.template deliver<Codecs>(message, config_.all_reduce.codec, from);
  }

  // Donates even while not serving: a peer waiting out a failed round still holds its
  // step's state, and a joiner may need exactly that. Joiners check the hash.
  wire::Frames donate_state(const wire::DecodedMessage& request) {
    return donor_.handle(request, stage(), replica_->step(), [this] { return replica_->checkpoint(); });
  }
  StateDonor& donor() { return donor_; }

 private:
  int stage() const { return replica_->stage_index(); }

  // Bounded by this stage's gradient and the global batch; parts only from known
  // stage-mates, as whoever speaks_for says may send as them.
  AllReduceInbox::Options inbox_options() {
    AllReduceInbox::Options options;
    options.limits = inbox_limits(replica_->parameter_count(), config_.all_reduce,
                                  static_cast<double>(config_.global_batch_samples));
    options.speaks_for = config_.speaks_for;
    options.is_member = [this](const std::string& peer_id) {
      std::lock_guard lock(known_mates_mu_);
      return known_mates_.count(peer_id) != 0;
    };
    return options;
  }

  // What the inbox refused or left out, onto the board (and now and then the log,
  // since hostile mail may change it every tick) when it changed.
  void report_inbox_counters() {
    const InboxCounters c = inbox_.counters();
    if (c.refused() == reported_refused_ && c.ignored() == reported_ignored_) return;
    reported_refused_ = c.refused();
    reported_ignored_ = c.ignored();
    stats_->update([&](PeerStats& s) {
      s.parts_refused = c.refused();
      s.contributions_ignored = c.ignored();
    });
    const double now = registry_->now();
    if (now - last_inbox_log_ < config_.progress_stale_seconds) return;
    last_inbox_log_ = now;
    log_warn("peer {}: all-reduce parts refused so far: {} malformed, {} bad weight, {} impostor, {} not a stage-mate, "
             "{} stale, {} far ahead, {} duplicate, {} inbox full; left out: {} wrong sender, {} over published",
             config_.peer_id, c.malformed, c.bad_weight, c.impostor, c.not_member, c.stale, c.far_future, c.duplicate,
             c.full, c.wrong_sender, c.over_published);
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

  void loop() {
    double last_publish = -1e9;
    bool leaving = false;
    while (true) {
      {
        std::unique_lock lock(mu_);
        cv_.wait_for(lock, std::chrono::duration<double>(config_.progress_period_seconds / 2),
                     [&] { return stopping_ || samples_arrived_; });
        samples_arrived_ = false;
        if (stopping_ || flags_->dead) return;
        leaving = leaving_;
      }
      update_rate();
      report_inbox_counters();
      const double now = registry_->now();
      if (now - last_publish >= config_.progress_period_seconds) {
        (void)publish_progress(false);
        last_publish = now;
      }
      if (now - last_progress_read_ >= config_.progress_period_seconds) read_progress();
      const GlobalBatchDecision decision = decide();
      if (leaving) {
        if (leave_after(decision)) return;
        continue;
      }
      if (decision.behind || !flags_->serving) {
        resync();
      } else if (decision.ready) {
        run_round();
        last_publish = -1e9;
      }
    }
  }

  // While leaving: the round that ends this step takes the pending samples; with none
  // pending, or once stage-mates are past this step, there is nothing to wait for.
  // A leaving replica's own step is thrown away: a round is worth it only with a
  // stage-mate to take its samples (alone, it would publish a step nobody else has).
  bool leave_after(const GlobalBatchDecision& decision) {
    const bool mates_at_step =
        !round_members(stage_progress_, replica_->step(), registry_->now(), config_.progress_stale_seconds).empty();
    if (decision.ready && replica_->accumulated_samples() > 0 && mates_at_step) run_round();
    if (!decision.ready && !decision.behind && mates_at_step && replica_->accumulated_samples() > 0) return false;
    {
      std::lock_guard lock(mu_);
      left_ = true;
    }
    left_cv_.notify_all();
    return true;
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
    r.departed = departed_;
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
        // A record from the future would stay fresh for ever.
        if (!progress.is_ok() || progress->published_at > now + kMaxClockSkewSeconds) {
          stats_->update([](PeerStats& s) { ++s.bad_records; });
          continue;
        }
        if (progress->peer_id == config_.peer_id) continue;
        auto it = merged.find(progress->peer_id);
        if (it == merged.end() || progress->published_at >= it->second.published_at) {
          merged[progress->peer_id] = *progress;
        }
      }
    }
    stage_progress_.clear();
    for (auto& [id, r] : merged) {
      if (r.departed) continue;  // moved to another stage: gone now, not once stale
      if (r.published_at >= now - config_.progress_stale_seconds) stage_progress_.push_back(std::move(r));
    }
    std::lock_guard lock(known_mates_mu_);
    known_mates_.clear();
    for (const auto& r : stage_progress_) known_mates_.insert(r.peer_id);
  }

  GlobalBatchDecision decide() {
    std::vector<ProgressRecord> all = vouched_progress();
    all.push_back(own_progress(false));
    const GlobalBatchConfig batch{config_.global_batch_samples, config_.progress_stale_seconds,
                                  config_.start_on_estimated_arrival};
    return decide_global_batch(batch, replica_->step(), all, registry_->now());
  }

  // The stage-mates' records, less those ahead of this replica that no strict
  // majority of fresh stage-mates vouches for: one forged record claiming a later
  // step must not stop this peer's rounds or take it out of service.
  std::vector<ProgressRecord> vouched_progress() {
    const int64_t my_step = replica_->step();
    const double now = registry_->now();
    std::vector<ProgressRecord> vouched;
    int64_t dropped = 0;
    for (const auto& r : stage_progress_) {
      if (r.step > my_step) {
        const auto majority = majority_hash(stage_progress_, r.step, now, config_.progress_stale_seconds);
        if (!majority || *majority != r.params_hash) {
          ++dropped;
          continue;
        }
      }
      vouched.push_back(r);
    }
    if (dropped > 0) stats_->update([&](PeerStats& s) { s.unvouched_ahead += dropped; });
    return vouched;
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
    // Only a donor a strict majority vouches for can pass the state check. With none,
    // this replica's state is the best the stage has: a forged record ahead, re-announced
    // for ever, must not keep it out of service.
    const std::vector<AllReduceMember> donors = verifiable_donors(find_donors(my_step, &stage_mate_catching_up));
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
    return donors_freshest_first(std::move(donors));
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

  // Donors whose published hash is the one a strict majority of fresh stage-mates
  // published for their step, freshest first; the others would offer a state that
  // cannot pass the check.
  std::vector<AllReduceMember> verifiable_donors(const std::vector<ProgressRecord>& donors) {
    const double now = registry_->now();
    std::vector<AllReduceMember> members;
    for (const auto& d : donors) {
      const auto majority = majority_hash(stage_progress_, d.step, now, config_.progress_stale_seconds);
      if (majority && *majority == d.params_hash) members.push_back({d.peer_id, d.address});
    }
    if (members.empty() && !donors.empty() && now - last_unverifiable_log_ >= config_.progress_stale_seconds) {
      last_unverifiable_log_ = now;
      log_warn("peer {}: {} stage-mates hold other state, but no strict majority of the {} fresh ones vouches for it",
               config_.peer_id, donors.size(), stage_progress_.size());
    }
    return members;
  }

  // A state is the stage's when a strict majority of the fresh stage-mates (as this
  // peer sees them now) published its parameters hash for its step. Checked, with
  // its layout and values, before it is loaded; `*verified` is set to the hash it passed with.
  StateCheck state_check(int64_t min_step, std::shared_ptr<uint64_t> verified) {
    auto mates = std::make_shared<const std::vector<ProgressRecord>>(stage_progress_);
    const double now = registry_->now();
    const double stale = config_.progress_stale_seconds;
    StateCheck check;
    check.step = [=](int64_t step) -> Status {
      if (step < min_step) return failed_precondition("step {} is behind this replica's {}", step, min_step);
      if (majority_hash(*mates, step, now, stale)) return Status::ok();
      return failed_precondition("no strict majority of {} fresh stage-mates published a hash for step {}",
                                 mates->size(), step);
    };
    check.state = [this, mates, now, stale, verified](const Checkpoint& state) -> Status {
      const auto expected = majority_hash(*mates, state.step, now, stale);
      if (!expected) return failed_precondition("no strict majority vouches for step {}", state.step);
      SWARM_ASSIGN_OR_RETURN(uint64_t hash, inspect_state(state));
      if (hash != *expected) {
        return data_loss("its parameters hash to {:016x}; a majority of stage-mates published {:016x} for step {}",
                         hash, *expected, state.step);
      }
      *verified = hash;
      return Status::ok();
    };
    return check;
  }

  struct ParamLayout {
    std::string name;
    DType dtype;
    Shape shape;
  };
  // What a downloaded state holds, as far as Replica::load cares.
  struct StateTally {
    std::map<std::string, const Tensor*> params;
    std::map<std::string, int> moments;  // per parameter: 1 the first moment, 2 the second
    int step_counters = 0;
  };

  // Checks a downloaded state against this stage before anything loads it, as
  // Replica::load would and more (finite values), so a state that passes loads; and
  // returns the parameters hash the replica will have once it does (the parameters
  // in the stage's order, under the stage's names).
  Result<uint64_t> inspect_state(const Checkpoint& state) {
    const auto layout = replica_->exclusive([](S& stage) {
      std::vector<ParamLayout> out;
      for (const auto& view : stage.parameter_views()) out.push_back({view.name, view.value.dtype(), view.value.shape()});
      return out;
    });
    std::map<std::string, const ParamLayout*> by_name;
    for (const auto& p : layout) by_name[p.name] = &p;
    StateTally tally;
    for (const NamedTensor& named : state.tensors) SWARM_RETURN_IF_ERROR(check_state_entry(named, by_name, &tally));
    if (tally.params.size() != layout.size()) {
      return invalid_argument("the state has {} of this stage's {} parameters", tally.params.size(), layout.size());
    }
    if (tally.step_counters != 1) return invalid_argument("the state has {} optimizer step counters", tally.step_counters);
    for (const auto& [param, which] : tally.moments) {
      if (which != 3) return invalid_argument("the state has one optimizer moment of {} without the other", param);
    }
    SWARM_RETURN_IF_ERROR(check_finite(state));
    std::vector<NamedTensorView> views;
    for (const auto& p : layout) views.push_back({p.name, tally.params.at(p.name)->view()});
    return content_hash(views);
  }

  // One tensor of a downloaded state: a parameter of this stage with its dtype and
  // shape, an optimizer moment (f32, the second one >= 0) of one of them with its
  // shape, or the optimizer's step counter (>= 0). Anything else, or any of them
  // twice, is no part of this stage's state.
  static Status check_state_entry(const NamedTensor& named, const std::map<std::string, const ParamLayout*>& layout,
                                  StateTally* tally) {
    const std::string_view name = named.name;
    const Tensor& t = named.tensor;
    // Of the parameter's shape, and of `dtype` (unset: the parameter's).
    auto fits = [&](const std::string& param, std::optional<DType> dtype) {
      auto it = layout.find(param);
      return it != layout.end() && t.dtype() == dtype.value_or(it->second->dtype) && t.shape() == it->second->shape;
    };
    if (name.starts_with(kParamPrefix)) {
      const std::string param(name.substr(kParamPrefix.size()));
      if (!fits(param, std::nullopt)) return invalid_argument("state parameter {} does not fit this stage", param);
      if (!tally->params.emplace(param, &t).second) return invalid_argument("state parameter {} appears twice", param);
      return Status::ok();
    }
    const std::string_view entry = name.starts_with(kOptimizerPrefix) ? name.substr(kOptimizerPrefix.size()) : "";
    if (entry == optim::kStepStateName && t.dtype() == DType::i64 && t.numel() == 1 && t.data<int64_t>()[0] >= 0) {
      ++tally->step_counters;
      return Status::ok();
    }
    for (int which : {1, 2}) {
      const std::string_view prefix = which == 1 ? optim::kFirstMomentPrefix : optim::kSecondMomentPrefix;
      if (!entry.starts_with(prefix)) continue;
      const std::string param(entry.substr(prefix.size()));
      if (!fits(param, DType::f32)) break;
      const auto values = t.span<const float>();
      if (which == 2 && std::any_of(values.begin(), values.end(), [](float x) { return x < 0.0f; })) {
        return invalid_argument("state tensor {} holds a negative second moment", name);
      }
      int& seen = tally->moments[param];
      if ((seen & which) != 0) return invalid_argument("state tensor {} appears twice", name);
      seen |= which;
      return Status::ok();
    }
    return invalid_argument("state tensor {} is no part of this stage's state", name);
  }

  void download_from(const std::vector<AllReduceMember>& members) {
    StateDownloadReport report;
    auto verified = std::make_shared<uint64_t>(0);
    auto state = download_state(*clients_, stage(), members, config_.state_transfer, &report,
                                state_check(replica_->step(), verified));
    for (const auto& why : report.refused) log_warn("peer {}: refused a state: {}", config_.peer_id, why);
    if (!report.refused.empty()) {
      stats_->update([&](PeerStats& s) { s.states_refused += static_cast<int64_t>(report.refused.size()); });
    }
    if (!state.is_ok()) {
      log_warn("peer {}: state download failed: {}", config_.peer_id, state.status().to_string());
      read_progress();
      return;
    }
    // inspect_state checked what load checks: a failure here means the two disagree,
    // and load leaves the replica as it was.
    if (Status loaded = replica_->load(*state); !loaded.is_ok()) {
      log_warn("peer {}: downloaded state does not fit: {}", config_.peer_id, loaded.to_string());
      return;
    }
    const uint64_t hash = replica_->params_hash();
    if (hash != *verified) {  // inspect_state and the replica disagree on the hash: a bug, not an attack
      log_error("peer {}: loaded state of step {} hashes to {:016x}, checked as {:016x}", config_.peer_id, state->step,
                hash, *verified);
      return;
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
    auto taken = replica_->take_gradients();
    if (!taken.is_ok()) {
      log_warn("peer {}: no round for step {}: {}", config_.peer_id, step, taken.status().to_string());
      return;
    }
    typename Replica<S>::Gradients gradients = std::move(taken).value();
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
    // Owners refuse a weight above the global batch; samples that arrived while a
    // long round ran may exceed it, and are worth no more than a full batch.
    round.weight = static_cast<double>(std::min(gradients.samples, config_.global_batch_samples));
    round.params_hash = gradients.params_hash;
    round.members.push_back({config_.peer_id, control_address_, round_nonce_});
    for (const auto& r : round_members(stage_progress_, step, registry_->now(), config_.progress_stale_seconds)) {
      // The count it published as it joined (publish_progress(true, samples)) caps its weight.
      round.members.push_back({r.peer_id, r.address, r.averaging ? r.round_nonce : 0, static_cast<double>(r.samples)});
    }
    return round;
  }

  void fail_round(int64_t samples) {
    replica_->lose_round_samples();  // in the replica's ledger too, so they stay accounted for
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
  // Ids of the stage-mates in stage_progress_, for the server threads' inbox (which
  // asks them, so they outlive it).
  std::mutex known_mates_mu_;
  std::set<std::string> known_mates_;
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
  int64_t reported_refused_ = 0;
  int64_t reported_ignored_ = 0;
  double last_unverifiable_log_ = -1e9;
  double last_inbox_log_ = -1e9;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool samples_arrived_ = false;
  bool leaving_ = false;
  bool left_ = false;
  std::condition_variable left_cv_;
  std::atomic<bool> departed_{false};
  std::thread thread_;
};

}  // namespace swarm
