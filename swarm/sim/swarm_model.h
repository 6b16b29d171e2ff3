// swarm_model: the simulated swarm's state and event handlers (internal to swarm/sim;
// simulator.h is the interface). One class, its handlers split by concern over
// simulator.cc (loop, setup, metrics), traffic.cc (microbatches and tasks),
// peer_to_peer.cc (paths from peer to peer), membership.cc (churn, joins, moves),
// averaging.cc (global steps) and rounds.cc (joined rounds and the waits they cause).
#pragma once

#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "swarm/api/router.h"
#include "swarm/core/random.h"
#include "swarm/rebalance/rebalancer.h"
#include "swarm/sim/event_queue.h"
#include "swarm/sim/router_set.h"
#include "swarm/sim/scenario.h"
#include "swarm/sim/simulator.h"

namespace swarm::sim::detail {

// Fixed precision for every double written out, so the bytes do not hang on the last bits.
inline double fixed(double x) { return std::round(x * 1e6) / 1e6; }

enum class EventKind : uint8_t {
  tick,             // housekeeping each announce period: lapse records, progress, global batches
  announce,         // one peer refreshes its registry record (each at its own phase)
  refresh,          // one trainer hands its routers the registry's records (each at its own phase)
  sample,           // one time-series record
  task_arrives,     // a request reached its peer
  task_done,        // a peer finished computing a task
  reply_ok,         // a result reached its trainer
  reply_error,      // a peer refused the task (it serves another stage now)
  attempt_timeout,  // a trainer's deadline for one attempt
  rebalance_check,  // a peer runs its Rebalancer
  download_done,    // a joining or moving peer holds its new stage's state
  round_done,       // a stage's all-reduce finished
  round_begins,     // --rounds joins: the leader's BEGIN, its members take their gradients
  parts_reduced,    // --rounds joins: every member holds its averaged part
  resume_serving,   // a peer's held or round-blocked task waited long enough
  departure,        // --churn
  join,             // --join-rate
  preemption,       // --preempt-rate
  rejoin,           // a preempted peer is back
  scheduled,        // an entry of --schedule
};

struct Event {
  EventKind kind;
  int32_t a = 0;       // peer, microbatch or stage
  int32_t b = 0;       // microbatch or peer
  uint32_t life = 0;   // the peer's life (generation) or check token it was scheduled for
  uint64_t token = 0;  // the attempt or round it belongs to
};

enum class PeerState : uint8_t { serving, draining, downloading, dead };

// One process's link, each way, as `swarm local --link` emulates it: a message waits for
// its sender's up link, then its receiver's down link, then the larger latency. An
// unlimited link (infinite bytes/s) never queues.
struct Link {
  double bytes_per_second = std::numeric_limits<double>::infinity();
  double latency = 0;  // seconds, one way
  double up_free_at = 0;
  double down_free_at = 0;
};

struct QueuedTask {
  int32_t microbatch;
  int32_t hop;
  uint64_t attempt;
  double deadline;
  double service_seconds = 0;  // drawn when it starts
  bool held = false;           // it waited once for a round to take the gradients (--forward-hold)
  bool waited_round = false;   // it waited once for a round's step (--round-wait)
};

struct Peer {
  PeerId id;
  double throughput = 0;        // forward samples per second
  Link link;
  PeerState state = PeerState::serving;
  int stage = 0;                // the stage it serves, drains, or downloads for
  int move_to = -1;             // while draining
  uint32_t life = 0;            // bumps on death: events of an earlier life are stale
  uint32_t check_token = 0;     // bumps per scheduled rebalance check
  std::deque<QueuedTask> queue;
  std::optional<QueuedTask> current;
  bool waiting = false;         // its queue's front task waits (hold or round) until resume_serving
  uint32_t wait_token = 0;      // bumps per wait: an earlier wait's resume is stale
  bool in_round = false;        // it took its gradients for a round that has not stepped yet
  std::optional<rebalance::Rebalancer> rebalancer;
  double measured_throughput = 0;  // EMA in forward units, as StageService measures it

  // Its registry record, as last announced, and where it sits in its stage's view.
  double announce_phase = 0;       // in [0, announce_period)
  uint32_t announcing_life = ~0u;  // the life whose announce chain is running
  int view_stage = -1;
  int view_slot = -1;
  bool withdrawn = false;
  double announced_at = -std::numeric_limits<double>::infinity();
  int announced_stage = 0;
  int64_t announced_queue = 0;
  double announced_throughput = 0;

  // Progress toward the stage's next global step, and its last published record.
  int64_t step = 0;
  int64_t accumulated = 0;            // toward the next step; resets when a round takes it
  int64_t accepted = 0;               // all samples ever credited, for the rate
  int64_t accepted_at_last_tick = 0;
  double rate = 0;  // samples/s accepted, smoothed
  ProgressRecord published;
  bool has_published = false;
};

struct Microbatch {
  int trainer = 0;
  int hop = 0;
  bool active = false;
  uint64_t attempt = 0;  // the current attempt; replies and timeouts of others are stale
  int peer = -1;
  double sent_at = 0;
  double hop_started_at = 0;
  std::vector<PeerId> tried;
  // Peer to peer: who sent the current hop (-1: the trainer), the peer that ran each
  // stage's forward (its backward runs there, on the activations it kept), and the
  // stages that accumulated this microbatch, which count it once across a retried path.
  int sender = -1;
  std::vector<int> path;
  std::vector<bool> credited;
};

struct Hop {
  int stage;
  TaskKind kind;
  double cost;  // forward units per sample
  int64_t request_bytes;
  int64_t reply_bytes;
  double timeout;
};

struct StageState {
  int64_t step = 0;
  bool averaging = false;
  uint64_t round = 0;
  std::vector<int> round_members;
  int64_t round_samples = 0;
  bool round_pending = false;  // --rounds joins: the batch is in, the BEGIN on its way
  int64_t step_credit = 0;     // steps_for_samples' carry between joined rounds
  double round_ends_at = 0;
  // The registry's records for this stage (a dead peer's until it lapses), and whose.
  std::vector<PeerAnnouncement> view;
  std::vector<int> view_peer;
};

class Simulation {
 public:
  Simulation(const Scenario& resolved, std::ostream& out, const ProgressFn& progress);
  Summary run();

 private:
  // simulator.cc: setup, the loop, metrics and output.
  void create_initial_peers();
  int add_peer(int stage, PeerState state);
  void create_trainers();
  void schedule_first_events();
  void dispatch(const Event& e);
  void advance_clock(double t);
  void recompute_bounds();
  void on_sample();
  void on_tick();
  void seed_phases();
  double next_phase_time(double phase, double period) const;

  // registry.cc: records, views and the trainers' refreshes.
  void announce(int peer);
  void start_announcing(int peer);
  void on_announce(const Event& e);
  void withdraw(int peer);
  void drop_from_view(int peer);
  void lapse_records();
  void rebuild_loads_view();
  void on_refresh(const Event& e);
  void refresh_trainer(int trainer);
  void emit(const nlohmann::ordered_json& record);
  nlohmann::ordered_json stage_counts() const;
  Summary summarize();
  void report_progress();

  // traffic.cc: microbatches, hops and the peers' queues.
  Hop hop_of(int hop) const;
  void start_microbatch(int trainer);
  void begin_hop(int mb);
  void attempt_hop(int mb);
  void retry_waiting();
  void on_task_arrives(const Event& e);
  void serve_next(int peer);
  void on_task_done(const Event& e);
  void on_reply(const Event& e, bool ok);
  void on_attempt_timeout(const Event& e);
  void credit_samples(int peer, int stage, int mb);
  // The stage counts a backward where it is computed (the replica's accumulate) in
  // peer-to-peer mode and with joined rounds; the records model counts it when its
  // trainer has the reply.
  bool credits_at_compute() const { return s_.hops == HopMode::peer_to_peer || s_.rounds == RoundTrigger::joins; }
  void end_microbatch(int mb, bool completed);
  double cross(Link& from, Link& to, int64_t bytes, double at);
  Link& sender_link(const Microbatch& m);
  void send_task(int mb, int peer, int64_t bytes);
  void after_forward(int peer, const QueuedTask& task);
  void after_backward(int peer, const QueuedTask& task);
  void restart_path(int mb);
  bool must_wait(int peer, QueuedTask& task);
  void on_resume_serving(const Event& e);
  double measured_rate(const Hop& hop, double seconds) const;

  // membership.cc: churn, joins, moves and rebalancing.
  double poisson_rate(EventKind kind) const;
  void schedule_poisson(EventKind kind);
  void on_departure();
  void on_join();
  void on_preemption();
  void on_rejoin(int peer);
  void on_scheduled(int index);
  int random_alive_peer(int stage);
  void kill(int peer, const char* reason);
  void enter_swarm(int peer, const char* reason);
  void schedule_check(int peer);
  void on_rebalance_check(const Event& e);
  void start_move(int peer, int to_stage);
  void begin_download(int peer);
  void on_download_done(const Event& e);
  double download_seconds(const Peer& p) const;
  void mark_alive(int peer, bool alive);

  // averaging.cc: progress records and global steps.
  void publish_progress();
  void check_global_batches();
  void take_round_members(int stage);
  void start_round(int stage);
  void on_round_done(const Event& e);
  void check_joined_batch(int stage, int credited_peer);
  void on_round_begins(const Event& e);
  void start_joined_round(int stage);
  void on_parts_reduced(const Event& e);
  void on_all_gathered(int stage, double gathered);
  void wake_held(int peer);

  bool serves(const Peer& p) const { return p.state == PeerState::serving || p.state == PeerState::draining; }
  void push(double t, Event e) { queue_.push(t, e); }

  Scenario s_;
  std::ostream& out_;
  ProgressFn progress_;
  std::vector<double> stage_costs_;

  // One generator per purpose, each seeded from --seed (see the constructor).
  SplitMix64 hardware_rng_;
  SplitMix64 churn_rng_;
  SplitMix64 router_seed_rng_;
  SplitMix64 phase_rng_;
  SplitMix64 compute_rng_;
  uint64_t rebalance_seed_;

  EventQueue<Event> queue_;
  double now_ = 0;
  std::vector<Peer> peers_;
  std::vector<int> alive_;           // alive peers, for uniform picks
  std::vector<int> alive_position_;  // peer -> index in alive_, or -1
  std::vector<std::vector<AnyRouter>> routers_;  // [trainer][stage]
  std::vector<Link> trainer_links_;
  std::vector<Microbatch> microbatches_;
  std::vector<int> free_microbatches_;
  std::vector<int> waiting_;         // microbatches whose hop found no usable peer
  std::vector<StageState> stages_;
  std::vector<rebalance::PeerLoad> loads_view_;  // the registry's records, all stages
  uint64_t next_attempt_ = 0;
  int64_t tick_index_ = 0;
  int64_t sample_index_ = 0;
  std::vector<double> refresh_phase_;  // per trainer
  int progress_tenths_ = 0;

  // Metrics: time integrals of the bounds since the start, and this window's counts.
  bool bounds_dirty_ = true;
  double oracle_now_ = 0, assignment_now_ = 0;
  double oracle_integral_ = 0, assignment_integral_ = 0, integrated_to_ = 0;
  double window_start_ = 0, window_oracle_start_ = 0, window_assignment_start_ = 0;
  int64_t window_completed_samples_ = 0;
  // Sums over windows, so memory does not grow with the run: all, the first tenth after
  // the first window, the last tenth (the window count is known from the start).
  int64_t windows_expected_ = 0, tenth_ = 1;
  double throughput_sum_ = 0, oracle_sum_ = 0, assignment_sum_ = 0, efficiency_sum_ = 0;
  double start_sum_ = 0, end_sum_ = 0;
  int64_t efficiency_windows_ = 0, start_windows_ = 0, end_windows_ = 0;
  Summary summary_;
};

}  // namespace swarm::sim::detail
