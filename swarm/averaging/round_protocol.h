// round_protocol: one peer's side of its stage's rounds, as a state machine.
//
// The peers of a stage agree on every round instead of each forming it from its
// own view of the registry:
//   - one leader per (stage, step): the lowest id among the peers serving at that
//     step with the same parameters (stage_view.h). Members JOIN it, again every
//     join period, with their samples; a JOIN to a peer that is not the leader is
//     refused naming the leader it sees;
//   - the leader sends BEGIN once the JOINed samples reach the global batch (or
//     are estimated to by now) and the group holds a strict majority of the
//     committed membership: never a group of one from an empty view;
//   - the group id is the round's name. Parts of a group this peer has no BEGIN
//     for are refused at once (held only when they come from its own leader's
//     round at its step, whose BEGIN is on its way), so a mismatch costs one
//     round trip, not a timeout;
//   - every member ends a round the same way: each reports DONE once it holds
//     every part; the leader steps and sends COMMIT once all have. A member that
//     misses the COMMIT holds the averaged gradient and follows as soon as a
//     stage-mate's record shows the group committed, without reloading. Otherwise
//     the round is aborted, nobody steps, and each member keeps its gradient for
//     the next attempt: a failed round loses no samples.
// Why commit rather than "everyone advances and the hash check repairs": an
// advance that some members skip splits the stage until a download repairs it,
// which costs a whole state transfer and a lineage per (stage, step) is then
// only eventually true; with the commit, a round either stepped everywhere it
// completed or nowhere.
//
// No clock, no I/O: the caller feeds it the registry's records, the messages that
// arrive and the time, sends what it returns, and publishes progress(). Tests
// step it with a fake clock and a seeded network (tests/sync_harness).
//
//   StageRounds rounds(config, &replica, RoundCodec::of<Codecs>(codec));
//   rounds.observe(records, now); rounds.tick(now);
//   for (auto& out : rounds.take_outbox()) send(out);
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "swarm/averaging/ban_policy.h"
#include "swarm/averaging/progress.h"
#include "swarm/averaging/resync_hold.h"
#include "swarm/averaging/round_group.h"
#include "swarm/averaging/round_messages.h"
#include "swarm/averaging/stage_view.h"
#include "swarm/core/status.h"

namespace swarm {

// Global steps count samples: a round whose members took k global batches between
// them counts for k steps (1 to this many), the leader carrying the remainder
// (`credit`, within a batch) to its next round, so a stage's step follows its
// samples / global batch whatever the round latency, and so does the
// learning-rate schedule on it. The COMMIT says how many.
inline constexpr int64_t kMaxStepsPerRound = 8;
int64_t steps_for_samples(int64_t samples, int64_t global_batch, int64_t* credit);

struct RoundsConfig {
  std::string peer_id;
  std::string address;  // this peer's control server
  int stage = 0;
  int64_t global_batch_samples = 16;
  bool start_on_estimated_arrival = true;
  double stale_seconds = 5.0;          // a record older than this is absent
  double join_period_seconds = 0.2;    // a member re-JOINs its leader this often
  // and sooner, this long after its last JOIN, once its samples changed (0: never
  // sooner): a leader that hears of samples only every join period begins its
  // round late, and the samples that came meanwhile make a round of several
  // global batches, one optimizer step where one peer would have taken several.
  double join_on_samples_seconds = 0.01;
  double joiner_silent_seconds = 1.5;  // a leader forgets a joiner silent this long
  double phase_timeout_seconds = 5.0;  // a group's wait for its parts, and the leader's for DONE
  double look_seconds = 1.0;           // a starting peer reads the stage this long before it trusts its view
  // A leader holds its round up to this long for a stage-mate that catches up, a
  // tenth of its time at most per mate (resync_hold.h; 0: never): a stage that
  // steps faster than a download would otherwise leave a newcomer one download
  // behind every time.
  double resync_hold_seconds = 2.0;
  // How long a leader whose group holds three members or more waits for a third
  // to hold samples, so the round can clip (enough_contributors).
  double contributors_wait_seconds = 1.0;
  int64_t max_chunk_elements = 1 << 18;
  int max_members = 256;
  // Early parts held (their values and a fixed overhead per part, all senders): from
  // this peer's leader, before its BEGIN arrives.
  int64_t max_early_values = int64_t{1} << 22;
  // The gradient's size: each member's share of early parts holds one whole
  // contribution (a robust round's), whatever max_early_values says. So early
  // parts hold at most max(max_early_values, max_members whole contributions),
  // whatever the registry shows (see StageRounds::early_shares).
  int64_t gradient_values = 0;
  // Attack tests: from this global step on, this peer hands each mate of a robust
  // round a "reduced" part as well as its contribution (-1: never).
  int64_t test_forge_reduced_part_from = -1;

  // The timings checked against each other: a leader must not forget a member
  // between two of its JOINs, nor a record lapse between two of its publications.
  Status validate(double publish_period_seconds) const;
};

// What the protocol needs of a replica; the peer adapts its Replica, tests a stub.
class RoundReplica {
 public:
  virtual ~RoundReplica() = default;
  virtual int64_t step() const = 0;
  virtual uint64_t params_hash() const = 0;
  virtual std::vector<std::pair<int64_t, uint64_t>> recent_hashes() const = 0;
  virtual int64_t pending_samples() const = 0;
  struct Taken {
    std::vector<float> mean;
    int64_t samples = 0;
  };
  // The mean of the gradients accumulated since the last take; they count as "in a round" now.
  virtual Result<Taken> take_gradients() = 0;
  // The averaged gradient, applied for `steps` global steps: step() + steps; the
  // samples in the round are stepped.
  virtual Status apply_step(std::span<const float> averaged, int64_t steps) = 0;
  // The samples taken into rounds that will never step (a re-sync throws them away).
  virtual void lose_round_samples() = 0;
  // A round ended without a step; its gradient stays with the protocol for the
  // next attempt: work that waits for a round's step (Replica::wait_for_round_step) goes on.
  virtual void round_aborted() {}
};

// What happened, for the driver's log, stats and checkpoints.
struct RoundEvent {
  enum class Kind { stepped, aborted, diverged, resync, serving, refused, banned } kind;
  int64_t step = 0;
  uint64_t group = 0;
  bool led = false;  // stepped: this peer led the round
  int members = 0;
  std::string text;
};

struct RoundCounters {
  int64_t rounds_led = 0, rounds_committed = 0, rounds_followed = 0, rounds_aborted = 0;
  int64_t refused_no_begin = 0, refused_not_member = 0, refused_bad_part = 0, refused_full = 0;
  int64_t joins_refused = 0, unvouched_ahead = 0, diverged = 0, benched = 0;
  int64_t banned = 0;  // stage-mates left out for good on their contributions (ban_policy.h)
  int64_t payload_bytes = 0, payload_values = 0;
};

class StageRounds {
 public:
  enum class Mode { looking, serving, resyncing };

  StageRounds(RoundsConfig config, RoundReplica* replica, RoundCodec codec, double now);

  // The stage's progress records as the registry returns them now.
  void observe(const std::vector<ProgressRecord>& records, double now);
  // A message from a stage-mate, checked already by parse_round_message. An error
  // is the refusal the sender gets back (and a counter here).
  Status receive(const RoundMessage& message, double now);
  // A message this peer sent was refused or never arrived.
  void delivery_failed(const Outgoing& sent, const Status& why, double now);
  void tick(double now);
  void set_rate(double samples_per_second) { rate_ = samples_per_second; }

  std::vector<Outgoing> take_outbox() { return std::exchange(outbox_, {}); }
  std::vector<RoundEvent> take_events() { return std::exchange(events_, {}); }
  ProgressRecord progress(double now) const;
  // The record progress() returned was announced at `now`: a leader whose record
  // may have lapsed during its round does not commit it (see commit()).
  void published(double now);
  // When a JOIN that join_on_samples_seconds held back falls due (infinity: none
  // is): the driver ticks then, so a changed sample count never waits for a timer.
  double join_due_at() const;

  Mode mode() const { return mode_; }
  bool serving() const { return mode_ == Mode::serving; }
  bool in_round() const { return group_ != nullptr; }
  const std::string& leader() const { return leader_; }
  // While resyncing: the state to download, vouched by a strict majority.
  const std::optional<VouchedState>& resync_target() const { return resync_target_; }
  // The download of resync_target() ended: loaded (the replica holds its state now) or not.
  void resync_finished(bool loaded, double now);
  // A peer that found the stage verifiably empty serves its own state (a checkpoint, say).
  const std::set<std::string>& membership() const { return membership_; }
  // Whether a strict majority vouches for (step, hash) now: a donor that stepped
  // during a download may still hand over a state the stage holds.
  bool vouched(int64_t step, uint64_t hash) const {
    return is_vouched(view_, membership_, config_.peer_id, step, hash);
  }
  // A downloaded state at `step` hashing to `hash`, the download aimed at
  // resync_target(): load it (the target, or vouched now), wait for the records
  // to vouch for it (a donor that stepped during the download hands over a newer
  // state than the view shows), or refuse it (behind the target, or the stage
  // moved past it before a majority vouched: download again).
  enum class Downloaded { load, wait, refuse };
  Downloaded judge_download(int64_t step, uint64_t hash) const;
  // Whether a stage-mate serves this peer's step: someone to take its samples into a round.
  bool mates_at_step() const;
  const RoundCounters& counters() const { return counters_; }
  // What the parts held for a BEGIN still on its way cost now: their values and a
  // fixed overhead per part.
  int64_t early_held() const { return early_values_; }
  // Stage-mates this peer left out of rounds for good, and why.
  const std::map<std::string, std::string>& bans() const { return bans_.bans(); }

 private:
  struct Joiner {
    std::string address;
    int64_t samples = 0;
    double rate = 0;
    double heard_at = 0;
  };
  struct ActiveGroup {
    explicit ActiveGroup(GroupSpec spec, RoundCodec codec) : round(std::move(spec), codec) {}
    RoundGroup round;
    double started_at = 0;
    bool done_sent = false;
    bool forged_sent = false;  // attack tests: forge_reduced_parts() sent its parts
    double done_at = 0;
    double longest_unpublished = 0;  // the longest time without an announced record since it started
    uint64_t hash_before = 0;
    std::set<std::string> done_from;  // the leader's tally
    std::map<std::string, int64_t> samples_from;  // the samples each member's DONE holds
  };

  struct Bench {
    double until = 0;           // kept out of rounds
    double deposed_until = 0;   // and not followed as leader: it began none (leader_never_begins)
    int offenses = 0;
  };
  bool benched(const std::string& peer_id, double now) const;
  void bench(const std::vector<std::string>& peers, double now);
  bool leader_never_begins(double now) const;
  // What this peer brings to its next round: its pending samples and those of an aborted attempt it holds.
  int64_t offered_samples() const;
  std::set<std::string> round_joiners(double now) const;
  std::optional<VouchedState> committed_without_me(int64_t step) const;
  bool remembers_its_votes() const;
  bool earlier_life_settled(double now) const;
  double voted_round_over_after() const;
  void tick_group(double now);
  void tick_serving(double now);
  bool check_behind(double now);
  bool ready_to_begin(double now);
  bool enough_contributors(const std::vector<ProgressRecord>& records, size_t candidates, double now);
  bool holding_for_resync(double now);
  void begin_round(double now);
  Status enter_group(GroupSpec spec, double now);
  void send_join(double now);
  void after_progress(double now);
  void judge_contributions(double now);
  void exclude(const std::string& id, const std::string& why);
  void ban_if_forged_reduction(const RoundMessage& m);
  void ban_if_forged_reduction(const RoundMessage& m, bool robust, bool from_member, size_t round_size);
  void remember_finished();  // group_'s
  void forge_reduced_parts();
  void commit(double now);
  void apply(bool led, int64_t steps, double now);
  void abort_group(const std::string& why, bool tell_others, double now);
  void drop_held();
  void set_membership(std::set<std::string> members);
  void send(const std::string& to, const std::string& address, RoundMessage m);
  RoundMessage control(RoundOp op) const;
  std::string address_of(const std::string& peer_id) const;
  std::set<std::string> genesis_membership() const;
  std::set<std::string> electing_membership() const;
  const ProgressRecord* committed_at_my_state() const;
  std::set<std::string> heard_lately() const;
  std::set<std::string> present_voters(const StageView& here, const std::set<std::string>& heard) const;

  Status on_join(const RoundMessage& m, double now);
  Status on_begin(const RoundMessage& m, double now);
  Status on_part(const RoundMessage& m, double now);
  int64_t early_shares() const;
  bool early_pooled(const std::string& sender) const;
  Status hold_early(const RoundMessage& m, int64_t share, int64_t bound);
  Status on_done(const RoundMessage& m, double now);
  Status on_commit(const RoundMessage& m, double now);
  Status on_abort(const RoundMessage& m, double now);
  Status on_refuse(const RoundMessage& m, double now);

  const RoundsConfig config_;
  RoundReplica* replica_;
  const RoundCodec codec_;
  Mode mode_ = Mode::looking;
  double started_at_ = 0;
  double rate_ = 0;
  StageView view_;
  std::set<std::string> membership_;  // the last committed group's members; empty: none yet
  uint64_t committed_group_ = 0;
  std::set<std::string> former_members_;  // peers it committed rounds with (outweighed_by_split)
  std::optional<std::pair<int64_t, uint64_t>> yielded_;  // the state it gave up to a split's other side
  double last_published_at_;
  std::optional<VouchedState> resync_target_;

  std::string leader_;
  double last_join_at_ = -1e18;
  int64_t last_join_samples_ = -1;
  std::map<std::string, double> unreachable_;  // peer -> when a message to it failed
  // Members whose messages showed them at this peer's step or past it, and when:
  // present though the registry may not show them (a blind view must not make a
  // live member absent, and a group of one a majority).
  std::map<std::string, double> heard_from_;
  std::map<std::string, Joiner> joiners_;      // as leader, at this step
  std::map<std::string, Bench> bench_;         // peers kept out of rounds for a while (banned: for good)
  BanPolicy bans_;
  ResyncHolds resync_holds_;                   // as leader
  std::optional<double> contributors_wait_since_;  // as leader: waiting for a third contributor
  double following_since_ = 0;                 // when this peer chose its current leader
  double last_round_at_ = 0;                   // when a round it was in last began or ended
  uint64_t rounds_begun_ = 0;
  int64_t sample_credit_ = 0;  // as leader: samples counted by no step yet (or steps ahead of samples)
  std::unique_ptr<ActiveGroup> group_;
  std::optional<RoundReplica::Taken> held_;  // taken for this step, not stepped yet
  std::vector<RoundMessage> early_parts_;
  // Reduced parts that came before their BEGIN: (group, sender), judged when it begins.
  static constexpr size_t kMaxEarlyReductions = 64;
  std::set<std::pair<uint64_t, std::string>> early_reductions_;
  int64_t early_values_ = 0;  // their cost: values and a fixed overhead per part
  std::map<uint64_t, int64_t> voted_groups_;  // groups this peer reported DONE in, and their step
  // A process restarted under its id has forgotten the DONEs it sent: see earlier_life_settled.
  const double born_at_;
  std::set<std::string> out_of_round_since_born_;  // mates whose record since born_at_ showed them in no round
  // Aborted or committed lately: their parts are refused, and a reduced part in
  // one where every member reduced for itself is proof against its sender still.
  struct FinishedGroup {
    uint64_t group = 0;
    bool robust = false;
    std::vector<std::string> members;
  };
  std::deque<FinishedGroup> finished_groups_;

  std::vector<Outgoing> outbox_;
  std::vector<RoundEvent> events_;
  RoundCounters counters_;
};

}  // namespace swarm
