#include "apps/local_swarm.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <cstdio>
#include <thread>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "apps/access_link_role.h"
#include "apps/chaos.h"
#include "apps/child_process.h"
#include "apps/local_owner.h"
#include "apps/report/run_report.h"
#include "apps/swarm_access.h"
#include "swarm/compression/codecs.h"
#include "swarm/averaging/averaging_messages.h"
#include "swarm/averaging/progress.h"
#include "swarm/averaging/stage_view.h"
#include "swarm/checkpoint/checkpoint.h"
#include "swarm/peer/periodic_task.h"
#include "swarm/data/any_data_source.h"
#include "swarm/registry/dht_registry.h"
#include "swarm/trainer/trainer.h"
#include "swarm/trainer/train_loss_span.h"
#include "swarm/trainer/training_loop.h"
#include "swarm/wiring/stochastic_wiring.h"
#include "transports/netem/access_links.h"
#include "transports/netem/link_model.h"
#include "transports/netem/netem_transport.h"
#include "transports/zmq/zmq_transport.h"

namespace swarm::apps {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
// Behind the process's emulated access link where --link names one, else straight over ZeroMQ.
using SwarmTrainer =
    Trainer<StochasticWiringRouter, NetemTransport<ZmqTransport>, DhtRegistry, compression::StandardCodecs>;

// Appends JSON lines; every record gets "time" (seconds since the run began).
class MetricsWriter {
 public:
  MetricsWriter(const std::string& path, Clock::time_point start) : out_(path, std::ios::app), start_(start) {}
  bool ok() const { return static_cast<bool>(out_); }
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  void write(nlohmann::json record) {
    std::lock_guard lock(mu_);
    record["time"] = seconds();
    out_ << record.dump() << '\n';
    out_.flush();
  }

 private:
  std::mutex mu_;
  std::ofstream out_;
  Clock::time_point start_;
};

// Peers share the cores: one OpenMP thread each, and no spinning while idle,
// so a waiting peer does not steal the core another one is computing on.
const std::vector<std::string> kPeerEnvironment = {"OMP_NUM_THREADS=1", "OMP_WAIT_POLICY=passive"};

struct PeerProcess {
  std::string id;
  int stage = 0;
  ChildProcess process;
  bool killed = false;
  bool stopped = false;
};

// stage -1: the pattern peers take, "{stage}" standing for the stage they serve (they may move).
std::string stage_checkpoint_path(const std::string& run_dir, int stage) {
  const std::string name = stage < 0 ? std::string("stage-{stage}.ckpt") : fmt::format("stage-{}.ckpt", stage);
  return (fs::path(run_dir) / "checkpoints" / name).string();
}

int64_t global_batch_of(const LocalSwarmOptions& o) {
  return o.global_batch >= 0 ? o.global_batch : int64_t{o.microbatch} * o.microbatches_per_step * o.trainers;
}

// The lr decays over the global steps the run will take: its samples over the global batch.
int64_t expected_global_steps(const LocalSwarmOptions& o) {
  const int64_t batch = std::max<int64_t>(1, global_batch_of(o));
  return std::max<int64_t>(1, int64_t{o.steps} * o.microbatch * o.microbatches_per_step * o.trainers / batch);
}

std::string link_board_path(const LocalSwarmOptions& o) { return (fs::path(o.run_dir) / "links.board").string(); }

// The process's access link lasts as long as the run that set it.
struct ProcessLinkScope {
  ~ProcessLinkScope() { netem::set_process_access_link(std::nullopt); }
};

// What each process's link carried, from the board this process shares with them.
std::vector<LocalSwarmReport::LinkBytes> link_bytes() {
  const std::optional<netem::AccessLink> link = netem::process_access_link();
  if (!link) return {};
  using Direction = netem::AccessLinkBoard::Direction;
  std::vector<LocalSwarmReport::LinkBytes> carried;
  for (int slot : link->board()->joined()) {
    carried.push_back({link->board()->name_of(slot), link->board()->bytes_carried(slot, Direction::up),
                       link->board()->bytes_carried(slot, Direction::down)});
  }
  return carried;
}

nlohmann::json link_bytes_json(const std::vector<LocalSwarmReport::LinkBytes>& carried) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& link : carried) out[link.name] = {{"up", link.up}, {"down", link.down}};
  return out;
}

std::vector<std::string> peer_args(const LocalSwarmOptions& o, int stage, const std::string& id, uint16_t port,
                                   double slowdown, bool resume) {
  std::vector<std::string> sync = {"--global-batch", std::to_string(global_batch_of(o)),
                                   "--total-steps", std::to_string(expected_global_steps(o)),
                                   "--checkpoint", stage_checkpoint_path(o.run_dir, -1),
                                   "--checkpoint-every", std::to_string(o.checkpoint_every)};
  if (resume) {
    sync.push_back("--resume-from");
    sync.push_back(stage_checkpoint_path(o.run_dir, stage));
  }
  std::vector<std::string> args = {"peer",          "--slowdown",    fmt::format("{}", slowdown),
          "--emulated-cost", fmt::format("{}", o.emulated_seconds_per_sample),
          "--rebalance-period", fmt::format("{}", o.rebalance_period_seconds),
          "--stage",       std::to_string(stage),
          "--stages",      std::to_string(o.stages),
          "--peer-id",     id,
          "--bootstrap",   fmt::format("127.0.0.1:{}", port),
          "--model-options", o.model->options_json().dump(),
          "--seed",        std::to_string(o.seed),
          "--lr",          fmt::format("{}", o.learning_rate),
          "--warmup",      std::to_string(o.warmup_steps),
          "--step-every",  std::to_string(o.step_every_samples),
          "--round-wait",  fmt::format("{}", o.round_wait_seconds),
          "--forward-hold", fmt::format("{}", o.forward_hold_seconds),
          "--max-batch",   std::to_string(o.max_batch),
          "--codec",       o.codec,
          "--gradient-codec", gradient_codec_name(o.codec, o.gradient_codec),
          "--threads",     "1"};
  const std::vector<std::string> compute = compute_flags(o.compute);
  args.insert(args.end(), compute.begin(), compute.end());
  args.insert(args.end(), sync.begin(), sync.end());
  if (!o.link.empty()) args.insert(args.end(), {"--link", o.link, "--link-board", link_board_path(o)});
  if (o.hops == "p2p") {
    args.insert(args.end(), {"--p2p", "--backward-timeout", fmt::format("{}", o.backward_timeout_seconds),
                             "--hop-slots", std::to_string(o.hop_slots)});
  }
  return args;
}

// Every (peer, step) parameter hash the stages' progress records show, once each,
// and each stage's global step: only what its peers would trust (observed_stage_step),
// so one forged record far ahead shows in no display. A hash is logged once its
// step is vouched; records ahead that nobody vouches for are counted as refused.
class ReplicaHashLog {
 public:
  void poll(DhtRegistry& registry, int stages, const std::function<void(nlohmann::json)>& write) {
    for (int s = 0; s < stages; ++s) {
      auto records = registry.get(progress_registry_key(s));
      if (!records.is_ok()) continue;
      std::vector<ProgressRecord> progress;
      for (const auto& record : *records) {
        auto parsed = ProgressRecord::from_json(record.value);
        if (parsed.is_ok()) progress.push_back(*std::move(parsed));
      }
      observe(s, observed_stage_step(progress, registry.now(), GlobalBatchConfig{}.stale_after_seconds), write);
      for (const auto& p : progress) log_hashes(s, p, write);
    }
  }
  // Per stage, the newest global step its committed membership vouched for.
  std::vector<int64_t> newest(int stages) const {
    std::vector<int64_t> out(stages, 0);
    for (const auto& [s, step] : newest_) {
      if (s < stages) out[s] = step;
    }
    return out;
  }
  // (stage, peer, step) records ahead of their stage that no majority vouched for, then or since.
  int64_t refused_records() const {
    return std::count_if(refused_.begin(), refused_.end(), [&](const auto& r) {
      const auto newest = newest_.find(std::get<0>(r));
      return newest == newest_.end() || std::get<2>(r) > newest->second;
    });
  }
  size_t mismatched() const { return mismatched_.size(); }
  // All-reduce payload (bytes, values) every peer seen has sent, dead ones included.
  std::pair<int64_t, int64_t> allreduce_volume() const {
    std::pair<int64_t, int64_t> total{0, 0};
    for (const auto& [peer, sent] : allreduce_) {
      total.first += sent.first;
      total.second += sent.second;
    }
    return total;
  }

 private:
  std::map<std::string, std::pair<int64_t, int64_t>> allreduce_;
  std::set<std::pair<std::string, int64_t>> seen_;
  std::map<std::pair<int, int64_t>, std::set<uint64_t>> hashes_;
  std::set<std::pair<int, int64_t>> mismatched_;
  std::map<int, int64_t> newest_;
  std::set<std::tuple<int, std::string, int64_t>> refused_;

  void observe(int stage, const ObservedStep& seen, const std::function<void(nlohmann::json)>& write) {
    for (const auto& r : seen.refused) refused_.insert({stage, r.peer_id, r.step});
    if (!seen.step) return;
    auto [newest, first] = newest_.try_emplace(stage, *seen.step);
    if (!first && *seen.step <= newest->second) return;
    newest->second = *seen.step;
    write({{"kind", "global_step"}, {"stage", stage}, {"step", *seen.step}});
  }

  // Hashes at steps not vouched yet wait for a later poll (a replica keeps 16).
  void log_hashes(int stage, const ProgressRecord& p, const std::function<void(nlohmann::json)>& write) {
    const auto newest = newest_.find(stage);
    for (const auto& [step, hash] : p.recent_hashes) {
      if (newest == newest_.end() || step > newest->second) continue;
      if (!seen_.insert({p.peer_id, step}).second) continue;
      write({{"kind", "replica"}, {"peer", p.peer_id}, {"stage", stage}, {"step", step}, {"hash", hex64(hash)}});
      auto& stage_hashes = hashes_[{stage, step}];
      stage_hashes.insert(hash);
      if (stage_hashes.size() > 1) mismatched_.insert({stage, step});
    }
    auto& sent = allreduce_[p.peer_id];  // cumulative per peer: keep the largest seen
    sent.first = std::max(sent.first, p.allreduce_bytes);
    sent.second = std::max(sent.second, p.allreduce_values);
  }
};


// Per stage, the peers whose progress records show they see all their stage-mates.
std::vector<int> peers_seeing_their_stage(DhtRegistry& registry, int stages, int peers_per_stage) {
  std::vector<int> counts(stages, 0);
  for (int s = 0; s < stages; ++s) {
    auto records = registry.get(progress_registry_key(s));
    if (!records.is_ok()) continue;
    for (const auto& record : *records) {
      auto progress = ProgressRecord::from_json(record.value);
      if (progress.is_ok() && progress->stage_mates_seen >= peers_per_stage - 1) ++counts[s];
    }
  }
  return counts;
}

std::vector<int> peers_per_stage(const std::map<std::string, PeerAnnouncementRecord>& peers, int stages) {
  std::vector<int> counts(stages, 0);
  for (const auto& [id, peer] : peers) {
    if (peer.stage >= 0 && peer.stage < stages) ++counts[peer.stage];
  }
  return counts;
}

// The peer processes swarm local starts, at start-up and by chaos; they are
// terminated when the fleet goes, on every way out of the run.
class PeerFleet {
 public:
  PeerFleet(const LocalSwarmOptions& o, uint16_t bootstrap_port, const LocalOwner* owner)
      : o_(o), port_(bootstrap_port), owner_(owner) {}
  PeerFleet(const PeerFleet&) = delete;
  PeerFleet& operator=(const PeerFleet&) = delete;
  ~PeerFleet() {
    std::lock_guard lock(mu_);
    for (auto& peer : processes_) peer.process.terminate(5.0);
  }

  // Returns the new peer's id.
  Result<std::string> spawn(int stage, double slowdown, bool resume) {
    std::lock_guard lock(mu_);
    const std::string id = fmt::format("s{}p{}", stage, spawned_++);
    std::vector<std::string> args = peer_args(o_, stage, id, port_, slowdown, resume);
    if (owner_ != nullptr) {
      SWARM_ASSIGN_OR_RETURN(MembershipOptions admitted, owner_->admit(id, security::MemberRole::peer));
      args.insert(args.end(), {"--owner-key", admitted.owner_key, "--identity", admitted.identity, "--certificate",
                               admitted.certificate});
    }
    SWARM_ASSIGN_OR_RETURN(ChildProcess child, ChildProcess::spawn(args, log_path(id), kPeerEnvironment));
    processes_.push_back({id, stage, child});
    return id;
  }

  // A peer that exits at start-up (a bad flag, a port in use) will never announce.
  Status check_none_exited() {
    std::lock_guard lock(mu_);
    for (auto& peer : processes_) {
      if (!peer.process.exited()) continue;
      std::ifstream log(log_path(peer.id));
      std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
      return unavailable("peer {} exited at start-up: {}", peer.id, text.substr(0, 400));
    }
    return Status::ok();
  }

  // Returns the peer the action hit; empty if the stage had none to hit. Peers
  // serve the stage the registry shows them in (they move); `announced` says which.
  std::string apply(const ChaosAction& action, const std::map<std::string, PeerAnnouncementRecord>& announced) {
    if (action.kind == ChaosAction::Kind::restart_peer) return spawn(action.stage, 1.0, false).value_or("");
    std::lock_guard lock(mu_);
    if (action.kind == ChaosAction::Kind::continue_peer) return continue_group(action.group);
    for (auto& p : processes_) {
      if (auto it = announced.find(p.id); it != announced.end()) p.stage = it->second.stage;
    }
    PeerProcess* peer = live_peer(action.stage);
    if (peer == nullptr) return "";
    if (action.kind == ChaosAction::Kind::kill_peer) {
      (void)peer->process.signal(SIGKILL);
      peer->killed = true;
    } else {
      (void)peer->process.signal(SIGSTOP);
      peer->stopped = true;
      stopped_groups_[action.group] = peer->process.pid();
    }
    return peer->id;
  }

 private:
  std::string log_path(const std::string& id) const {
    return (fs::path(o_.run_dir) / "peers" / (id + ".log")).string();
  }

  PeerProcess* live_peer(int stage) {
    for (auto& p : processes_) {
      if (p.stage == stage && !p.killed && !p.stopped && !p.process.exited()) return &p;
    }
    return nullptr;
  }

  // The process its stop-peer stopped: the same one, whatever else changed since.
  std::string continue_group(int group) {
    auto it = stopped_groups_.find(group);
    if (it == stopped_groups_.end()) return "";
    for (auto& p : processes_) {
      if (p.process.pid() != it->second) continue;
      (void)p.process.signal(SIGCONT);
      p.stopped = false;
      return p.id;
    }
    return "";
  }

  const LocalSwarmOptions& o_;
  const uint16_t port_;
  const LocalOwner* owner_;  // null unless --certified
  std::mutex mu_;  // guards everything below; chaos acts from its own thread
  std::vector<PeerProcess> processes_;
  int spawned_ = 0;
  std::map<int, pid_t> stopped_groups_;
};

// Runs the chaos plan on its own thread, against the training clock, until the
// plan ends or the runner goes.
class ChaosRunner {
 public:
  ChaosRunner(std::vector<ChaosAction> plan, PeerFleet* fleet, DhtRegistry* registry, int stages,
              MetricsWriter* metrics, const LineSink& print)
      : registry_(registry), stages_(stages),
        thread_([this, plan = std::move(plan), fleet, metrics, &print] { run(plan, fleet, metrics, print); }) {}
  ~ChaosRunner() {
    end_plan();
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    done_cv_.notify_all();
    thread_.join();
  }

  // Training is over: no further action fires. The thread lives on until the
  // runner goes, and with it the peers it restarted, so that the run's last
  // records and sample ledgers still reach them.
  void end_plan() {
    {
      std::lock_guard lock(mu_);
      plan_over_ = true;
    }
    done_cv_.notify_all();
  }

 private:
  void run(const std::vector<ChaosAction>& plan, PeerFleet* fleet, MetricsWriter* metrics, const LineSink& print) {
    const auto start = Clock::now();
    for (const ChaosAction& action : plan) {
      {
        std::unique_lock lock(mu_);
        const auto at =
            start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(action.at_seconds));
        if (done_cv_.wait_until(lock, at, [&] { return plan_over_; })) break;
      }
      const std::string target = fleet->apply(action, read_stage_announcements(*registry_, stages_));
      metrics->write({{"kind", "event"}, {"event", fmt::format("chaos_{}", chaos_kind_name(action.kind))},
                      {"peer", target}, {"stage", action.stage}});
      print(fmt::format("chaos: {} stage {} -> {}", chaos_kind_name(action.kind), action.stage,
                        target.empty() ? "no live peer" : target),
            false);
    }
    // Peers this thread restarted die with it (PR_SET_PDEATHSIG follows the thread
    // that forked them), so it lives until the run ends, not until the plan does.
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return done_; });
  }

  DhtRegistry* registry_;
  const int stages_;
  std::mutex mu_;
  std::condition_variable done_cv_;
  bool plan_over_ = false;
  bool done_ = false;
  std::thread thread_;  // last: it uses the members above
};

std::string format_loss(const std::optional<double>& loss) { return loss ? fmt::format("{:.4f}", *loss) : "   -  "; }

// {"accuracy": 0.97}: a loss stage's metrics by the names its spec gave them.
nlohmann::json named_metrics(const std::vector<std::string>& names, const std::vector<double>& values) {
  nlohmann::json out = nlohmann::json::object();
  for (size_t i = 0; i < names.size() && i < values.size(); ++i) out[names[i]] = values[i];
  return out;
}

// What the run records while it trains, from the training loop's step reports:
// step records and the progress line, the trainers' events, peer records and
// joins/losses, and every replica's parameter hashes.
class RunRecorder {
 public:
  RunRecorder(const LocalSwarmOptions& o, DhtRegistry* registry,
              const std::vector<std::unique_ptr<SwarmTrainer>>* trainers, MetricsWriter* metrics,
              const LineSink& print, std::map<std::string, PeerAnnouncementRecord> known, std::string rate_unit,
              std::vector<std::string> metric_names)
      : o_(o),
        registry_(registry),
        trainers_(trainers),
        metrics_(metrics),
        print_(print),
        known_(std::move(known)),
        rate_unit_(std::move(rate_unit)),
        metric_names_(std::move(metric_names)) {
    for (const auto& [id, peer] : known_) {
      ever_known_[{id, peer.stage}] = peer;
      last_stage_[id] = peer.stage;
    }
    // Losses and moves are recorded when they happen, also while no step completes.
    poller_.start(2.0, [this] {
      std::lock_guard lock(mu_);
      write_trainer_events();
      poll_peers();
    });
  }
  ~RunRecorder() { poller_.stop(); }

  void on_step(const StepReport& report) {
    const WireVolume wire = wire_volume();
    const auto allreduce = replicas_.allreduce_volume();
    nlohmann::json record = {{"kind", "step"}, {"step", report.step},
                             {"loss", report.loss ? nlohmann::json(*report.loss) : nlohmann::json(nullptr)},
                             {"tokens_per_s", report.tokens_per_second},
                             {"microbatches_completed", report.ledger.completed},
                             {"microbatches_abandoned", report.ledger.abandoned}, {"retries", report.ledger.retries},
                             {"samples_completed", samples_completed()},
                             {"wire_bytes", wire.bytes}, {"wire_values", wire.values},
                             {"allreduce_bytes", allreduce.first}, {"allreduce_values", allreduce.second}};
    if (report.metrics.size() == metric_names_.size() && !report.metrics.empty()) {
      record["metrics"] = named_metrics(metric_names_, report.metrics);
    }
    metrics_->write(record);
    std::lock_guard lock(mu_);
    write_trainer_events();
    if (Clock::now() - last_peer_poll_ > std::chrono::seconds(2)) poll_peers();
    if (Clock::now() - last_replica_poll_ > std::chrono::milliseconds(500)) poll_replicas();
    if (Clock::now() - last_report_ > std::chrono::seconds(10)) refresh_report();
    print_progress(report);
    losses_.add(report);
  }

  // After the last step: the final peer records, hashes and sample ledgers.
  void finish() {
    poller_.stop();
    std::lock_guard lock(mu_);
    write_trainer_events();
    poll_peers();
    poll_replicas();
    write_sample_ledgers();
  }

  int64_t samples_completed() const {
    int64_t total = 0;
    for (auto& trainer : *trainers_) total += trainer->ledger().samples_completed;
    return total;
  }

  double first_loss() const { return losses_.first().value_or(0); }
  WireVolume pipeline_volume() const { return wire_volume(); }
  double last_loss() const { return losses_.last().value_or(0); }
  const ReplicaHashLog& replicas() const { return replicas_; }

 private:
  void write_trainer_events() {
    for (auto& trainer : *trainers_) {
      for (const TrainerEvent& e : trainer->take_events()) {
        metrics_->write({{"kind", "event"}, {"event", e.event}, {"peer", e.peer}, {"stage", e.stage},
                         {"detail", e.detail}});
        if (e.event == "banned") ++bans_;
      }
    }
  }

  WireVolume wire_volume() const {
    WireVolume total;
    for (auto& trainer : *trainers_) {
      const WireVolume v = trainer->wire_volume();
      total.values += v.values;
      total.bytes += v.bytes;
    }
    return total;
  }

  std::map<std::string, ServedCounts> served() const {
    std::map<std::string, ServedCounts> out;
    for (auto& trainer : *trainers_) {
      for (auto& [id, counts] : trainer->served()) {
        out[id].forward += counts.forward;
        out[id].backward += counts.backward;
        out[id].failures += counts.failures;
      }
    }
    return out;
  }

  // Peer records, and joins and losses, from the registry.
  void poll_peers() {
    last_peer_poll_ = Clock::now();
    auto current = read_stage_announcements(*registry_, o_.stages);
    auto counts = served();
    for (const auto& [id, peer] : current) {
      ever_known_[{id, peer.stage}] = peer;
      // The stage it was last seen on, even if a poll between missed it.
      const auto last = last_stage_.find(id);
      if (last != last_stage_.end() && last->second != peer.stage) {
        metrics_->write({{"kind", "event"}, {"event", "peer_moved"}, {"peer", id}, {"from_stage", last->second},
                         {"to_stage", peer.stage}});
        print_(fmt::format("rebalancing: peer {} moved from stage {} to stage {}", id, last->second, peer.stage), false);
      } else if (!known_.count(id)) {
        write_peer_event("peer_joined", id, peer.stage);
      }
      last_stage_[id] = peer.stage;
      metrics_->write({{"kind", "peer"}, {"peer", id}, {"stage", peer.stage}, {"forward", counts[id].forward},
                       {"backward", counts[id].backward}, {"failures", counts[id].failures},
                       {"throughput", peer.throughput}});
    }
    for (const auto& [id, peer] : known_) {
      if (!current.count(id)) write_peer_event("peer_lost", id, peer.stage);
    }
    known_ = std::move(current);
  }

  // Every peer ever seen is asked for its ledger (a killed one cannot answer); each
  // stage's sum should hold every completed sample exactly once. Asked once the
  // trainers are done: a late backward of theirs is past its deadline by then and
  // can no longer be accumulated.
  void write_sample_ledgers() {
    std::vector<std::tuple<std::string, int, std::string>> peers;
    for (const auto& [key, peer] : ever_known_) peers.emplace_back(key.first, key.second, peer.address);
    std::vector<protocol::SampleLedger> stages(o_.stages);
    std::vector<int> answered(o_.stages, 0);
    std::vector<int> silent(o_.stages, 0);
    for (const PeerInfoReport& report : trainers_->front()->peer_infos(peers, 5.0)) {
      if (report.stage < 0 || report.stage >= o_.stages) continue;
      nlohmann::json record = {{"kind", "peer_samples"}, {"peer", report.peer}, {"stage", report.stage}};
      if (!report.info.is_ok() || !report.info->samples) {
        ++silent[report.stage];
        record["error"] = report.info.is_ok() ? "no sample ledger in its info" : report.info.status().to_string();
        metrics_->write(std::move(record));
        continue;
      }
      ++answered[report.stage];
      record["refusals"] = report.info->refusals;
      for (const auto& [name, field] : protocol::kSampleLedgerFields) {
        record[std::string(name)] = (*report.info->samples).*field;
        stages[report.stage].*field += (*report.info->samples).*field;
      }
      metrics_->write(std::move(record));
    }
    const int64_t completed = samples_completed();
    for (int s = 0; s < o_.stages; ++s) {
      nlohmann::json record = {{"kind", "stage_samples"},       {"stage", s},
                               {"peers_answered", answered[s]}, {"peers_silent", silent[s]},
                               {"samples_completed", completed}};
      for (const auto& [name, field] : protocol::kSampleLedgerFields) record[std::string(name)] = stages[s].*field;
      metrics_->write(std::move(record));
      const auto& l = stages[s];
      print_(fmt::format("stage {}: {} samples accumulated of {} completed ({} peers, {} silent); lost: {} re-sync, {} "
                         "non-finite, {} failed rounds, {} moved; refused: {} duplicates, {} expired",
                         s, l.samples_accumulated_total, completed, answered[s], silent[s], l.samples_lost_resync,
                         l.samples_lost_nonfinite, l.samples_lost_failed_round, l.samples_lost_moved, l.backward_duplicates_refused,
                         l.expired_dropped),
             false);
    }
  }

  // RUN_DIR/report.html as the run stands (about 20 ms for a 600-step run).
  void refresh_report() {
    last_report_ = Clock::now();
    if (Status written = write_run_report(o_.run_dir); !written.is_ok()) {
      log_warn("report.html not refreshed: {}", written.to_string());
    }
  }

  void write_peer_event(const char* event, const std::string& id, int stage) {
    metrics_->write({{"kind", "event"}, {"event", event}, {"peer", id}, {"stage", stage}});
    const bool lost = std::string_view(event) == "peer_lost";
    print_(fmt::format("{:.0f} s: peer {} {} stage {}", metrics_->seconds(), id, lost ? "lost from" : "joined", stage),
           false);
  }

  void poll_replicas() {
    last_replica_poll_ = Clock::now();
    replicas_.poll(*registry_, o_.stages, [&](nlohmann::json record) { metrics_->write(std::move(record)); });
  }

  // Three lines: progress, the stages, the faults (one line, " | "-joined, in a log).
  void print_progress(const StepReport& report) {
    const double elapsed = metrics_->seconds();
    if (!first_step_at_) first_step_at_ = std::make_pair(report.step, elapsed);
    const int64_t steps_done = report.step - first_step_at_->first;
    std::string eta = "-";
    if (steps_done > 0 && report.step < o_.steps) {
      const double per_step = (elapsed - first_step_at_->second) / static_cast<double>(steps_done);
      eta = fmt::format("{:.0f} s", per_step * static_cast<double>(o_.steps - report.step));
    }
    const std::vector<int> peers = peers_per_stage(known_, o_.stages);
    const std::vector<int64_t> steps = replicas_.newest(o_.stages);
    std::string stages;
    for (int s = 0; s < o_.stages; ++s) {
      stages += fmt::format("{}stage {}: {} peer{}, global step {}", s ? " | " : "", s, peers[s], peers[s] == 1 ? "" : "s",
                            s < static_cast<int>(steps.size()) ? steps[s] : 0);
    }
    print_(fmt::format("step {:4d}/{} | loss {} | {:6.0f} {}/s | ETA {} | {:.0f} s\n{}\nretries {} | bans {} | "
                       "abandoned {}",
                       report.step, o_.steps, format_loss(report.loss), report.tokens_per_second, rate_unit_, eta, elapsed,
                       stages, report.ledger.retries, bans_, report.ledger.abandoned),
           true);
  }

  const LocalSwarmOptions& o_;
  DhtRegistry* registry_;
  const std::vector<std::unique_ptr<SwarmTrainer>>* trainers_;
  MetricsWriter* metrics_;
  const LineSink& print_;
  std::map<std::string, PeerAnnouncementRecord> known_;
  std::string rate_unit_;  // the live line's "samples/s" (a GPT's: tokens)
  std::vector<std::string> metric_names_;  // the loss stage's: each step record's "metrics"
  // By (peer, stage): lost ones too, and every stage a peer served, for their ledgers.
  std::map<std::pair<std::string, int>, PeerAnnouncementRecord> ever_known_;
  std::map<std::string, int> last_stage_;
  ReplicaHashLog replicas_;
  Clock::time_point last_peer_poll_ = Clock::now() - std::chrono::seconds(10);
  Clock::time_point last_replica_poll_ = Clock::now() - std::chrono::seconds(10);
  TrainLossSpan losses_{o_.microbatches_per_step * o_.trainers};
  std::optional<std::pair<int64_t, double>> first_step_at_;  // (step, seconds): the ETA's base
  int64_t bans_ = 0;                                         // routers' bans of peers so far
  Clock::time_point last_report_ = Clock::now();
  std::mutex mu_;        // the poller's thread and the training loop's share the members above
  PeriodicTask poller_;  // last: it uses the members above
};

}  // namespace

// `--resume DIR`: the run's own config.json and the step of its stage checkpoints.
Status restore_run(LocalSwarmOptions* o, int64_t* start_step) {
  const fs::path dir = o->resume;
  std::ifstream in(dir / "config.json");
  if (!in) return not_found("--resume {}: no config.json there (is it a swarm local run directory?)", dir.string());
  auto config = nlohmann::json::parse(in, nullptr, false);
  if (config.is_discarded() || !config.is_object()) return invalid_argument("{}/config.json is not JSON", dir.string());
  try {
    SWARM_RETURN_IF_ERROR(o->model->set_options_json(config.at("model_options")));
    o->stages = config.at("stages");
    o->peers_per_stage = config.at("peers_per_stage");
    o->trainers = config.at("trainers");
    o->microbatch = config.at("microbatch");
    o->microbatches_per_step = config.at("microbatches_per_step");
    o->in_flight = config.at("in_flight");
    o->seed = config.at("seed");
    o->learning_rate = config.at("learning_rate");
    o->warmup_steps = config.at("warmup_steps");
    o->global_batch = config.value("global_batch", int64_t{-1});
    o->checkpoint_every = config.value("checkpoint_every", o->checkpoint_every);
    o->codec = config.value("codec", o->codec);
    // A run from before gradients had their own codec sent them in its codec.
    o->gradient_codec = config.value("gradient_codec", o->codec);
    o->rebalance_period_seconds = config.value("rebalance_period_seconds", o->rebalance_period_seconds);
    o->certified = config.value("certified", false);  // the same owner: its key is in RUN_DIR/keys
    // Not --device, --precision or --attention: they say where this machine
    // computes, and the stage checkpoints load on any of them.
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument("{}/config.json: {}", dir.string(), e.what());
  }
  o->run_dir = dir.string();
  *start_step = -1;
  for (int s = 0; s < o->stages; ++s) {
    const std::string path = stage_checkpoint_path(o->run_dir, s);
    auto checkpoint = load_checkpoint(path);
    if (!checkpoint.is_ok()) {
      return not_found("--resume {}: stage {} has no usable checkpoint ({}); runs write one every --checkpoint-every "
                       "global steps",
                       dir.string(), s, checkpoint.status().message());
    }
    *start_step = *start_step < 0 ? checkpoint->step : std::min(*start_step, checkpoint->step);
  }
  // Checkpoints count global steps; the run counts steps of microbatch x microbatches_per_step x trainers samples.
  const int64_t samples_per_step = int64_t{o->microbatch} * o->microbatches_per_step * o->trainers;
  if (global_batch_of(*o) > 0 && samples_per_step > 0) *start_step = *start_step * global_batch_of(*o) / samples_per_step;
  return Status::ok();
}

namespace {

// What can be checked before any process starts, so a bad flag fails first.
Status check_options(const LocalSwarmOptions& o) {
  if (o.stages < 1 || o.peers_per_stage < 1 || o.trainers < 1 || o.steps < 1 || o.microbatch < 1 ||
      o.microbatches_per_step < 1 || o.in_flight < 1) {
    return invalid_argument("stages, peers per stage, trainers, steps, microbatch sizes and in-flight counts must be >= 1");
  }
  if (!(o.rebalance_period_seconds >= 0) || !std::isfinite(o.rebalance_period_seconds)) {
    return invalid_argument("--rebalance-period {} must be a number of seconds >= 0", o.rebalance_period_seconds);
  }
  SWARM_RETURN_IF_ERROR(parse_wire_codecs(o.codec, o.gradient_codec).status());
  if (!o.link.empty()) SWARM_RETURN_IF_ERROR(netem::parse_link(o.link).status().with_context("--link"));
  if (o.hops != "hub" && o.hops != "p2p") return invalid_argument("--hops is hub or p2p, not '{}'", o.hops);
  if (o.eval_every < 0) return invalid_argument("--eval-every {} must be >= 0", o.eval_every);
  SWARM_RETURN_IF_ERROR(o.model->prepare(o.stages));
  // The peers would each fail the same way; say it once, before any starts.
  SWARM_ASSIGN_OR_RETURN(ComputeBackend backend, parse_compute(o.compute));
  return o.bootstrap.empty() ? o.model->check_device(backend) : Status::ok();
}

// --slow-peer STAGE:FACTOR; stage -1 when not given.
Result<std::pair<int, double>> parse_slow_peer(const LocalSwarmOptions& o) {
  int stage = -1;
  double factor = 1.0;
  if (o.slow_peer.empty()) return std::make_pair(stage, factor);
  if (std::sscanf(o.slow_peer.c_str(), "%d:%lf", &stage, &factor) != 2 || stage < 0 || stage >= o.stages ||
      !(factor >= 1.0)) {
    return invalid_argument("--slow-peer \"{}\": expected STAGE:FACTOR with a stage in 0..{} and FACTOR >= 1",
                            o.slow_peer, o.stages - 1);
  }
  return std::make_pair(stage, factor);
}

Result<ModelData> load_run_data(const LocalSwarmOptions& o, int64_t start_step) {
  DataPlan plan;
  plan.trainers = o.trainers;
  plan.microbatch = o.microbatch;
  plan.seed = o.seed;
  plan.start_step = start_step;
  plan.validation_samples = o.eval_windows;
  SWARM_ASSIGN_OR_RETURN(ModelData data, o.model->load_data(plan));
  if (data.validation.empty()) return invalid_argument("model {} gave no validation microbatches", o.model->name());
  return data;
}

// The run directory, and its config.json unless the run resumes (it has one).
Status create_run_dir(const LocalSwarmOptions& o, const ModelData& data) {
  std::error_code error;
  fs::create_directories(fs::path(o.run_dir) / "peers", error);
  if (!error) fs::create_directories(fs::path(o.run_dir) / "checkpoints", error);
  if (error) return permission_denied("cannot create run directory {}: {}", o.run_dir, error.message());
  if (!o.resume.empty()) return Status::ok();
  nlohmann::json config = {
      {"model_name", o.model->name()},
      {"model_options", o.model->options_json()},
      {"stages", o.stages},
      {"peers_per_stage", o.peers_per_stage},
      {"trainers", o.trainers},
      {"steps", o.steps},
      {"microbatch", o.microbatch},
      {"microbatches_per_step", o.microbatches_per_step},
      {"in_flight", o.in_flight},
      {"seed", o.seed},
      {"chaos", o.chaos},
      {"learning_rate", o.learning_rate},
      {"warmup_steps", o.warmup_steps},
      {"step_every_samples", o.step_every_samples},
      {"round_wait_seconds", o.round_wait_seconds},
      {"forward_hold_seconds", o.forward_hold_seconds},
      {"global_batch", o.global_batch},
      {"global_batch_samples", global_batch_of(o)},
      {"checkpoint_every", o.checkpoint_every},
      {"rebalance_period_seconds", o.rebalance_period_seconds},
      {"emulated_seconds_per_sample", o.emulated_seconds_per_sample},
      {"transport", "zmq"},
      {"link", o.link},
      {"hops", o.hops},
      {"codec", o.codec},
      {"gradient_codec", gradient_codec_name(o.codec, o.gradient_codec)},
      {"device", o.compute.device},
      {"precision", o.compute.precision},
      {"attention", o.compute.attention},
      {"registry", "opendht"},
      {"certified", o.certified},
      {"router", "stochastic_wiring"},
      {"units", {{"loss", data.loss_unit}, {"rate", data.rate_unit}, {"validation", data.validation_unit}}},
  };
  const nlohmann::json described = o.model->describe();
  for (const auto& [key, value] : described.items()) config[key] = value;
  std::ofstream out(fs::path(o.run_dir) / "config.json");
  out << config.dump(2) << '\n';
  if (!out) return permission_denied("cannot write {}/config.json", o.run_dir);
  return Status::ok();
}

// The registry node: an embedded bootstrap node beside it for swarm local, or
// the given one for swarm trainer.
Result<DhtRegistry> join_registry(const LocalSwarmOptions& o, const SwarmAccess& access,
                                  std::optional<DhtRegistry>* bootstrap_node, const LineSink& print) {
  std::string bootstrap = o.bootstrap;
  if (bootstrap.empty()) {
    SWARM_ASSIGN_OR_RETURN(DhtRegistry node, DhtRegistry::start(0, {}, access.registry_options()));
    bootstrap_node->emplace(std::move(node));
    bootstrap = fmt::format("{}:{}", access.host(), (*bootstrap_node)->port());
  }
  SWARM_ASSIGN_OR_RETURN(DhtRegistry registry, DhtRegistry::start(0, {bootstrap}, access.registry_options()));
  print(fmt::format("registry: OpenDHT via {}{}", bootstrap, access.secured() ? ", sealed records, CURVE" : ""),
        false);
  return registry;
}

// A trainer that cannot read the swarm's records should say why at once rather
// than wait out the start-up deadline: wrong secret, or none for a secured swarm.
Status check_records_readable(DhtRegistry& registry, const SwarmAccess& access, int stages) {
  for (int s = 0; s < stages; ++s) {
    auto records = registry.get(stage_registry_key(s));
    if (!records.is_ok()) continue;
    for (const auto& record : *records) {
      if (PeerAnnouncementRecord::from_json(record.value).is_ok()) return Status::ok();
      if (!access.secured() && record.value.find("\"signature\"") != std::string::npos) {
        return permission_denied("the swarm's records are sealed: pass its --secret (or set SWARM_SECRET)");
      }
    }
  }
  if (access.secured() && registry.refused_seals() > 0) {
    return permission_denied("every record of the swarm failed verification ({} refused): is --secret the swarm's?",
                             registry.refused_seals());
  }
  return Status::ok();
}

Status spawn_peers(const LocalSwarmOptions& o, PeerFleet& fleet, const LineSink& print) {
  SWARM_ASSIGN_OR_RETURN(auto slow, parse_slow_peer(o));
  for (int s = 0; s < o.stages; ++s) {
    for (int p = 0; p < o.peers_per_stage; ++p) {
      const double slowdown = s == slow.first && p == 0 ? slow.second : 1.0;
      SWARM_RETURN_IF_ERROR(fleet.spawn(s, slowdown, !o.resume.empty()).status());
    }
  }
  print(fmt::format("started {} peer processes ({} stages x {}), logs in {}/peers", o.stages * o.peers_per_stage,
                    o.stages, o.peers_per_stage, o.run_dir),
        false);
  return Status::ok();
}

// Until every stage is served and, before the first global step, stage-mates
// see each other's progress. Returns the peers announced by then.
Result<std::map<std::string, PeerAnnouncementRecord>> wait_until_served(DhtRegistry& registry,
                                                                        const SwarmAccess& access,
                                                                        const LocalSwarmOptions& o, PeerFleet* fleet) {
  const int want = fleet ? o.peers_per_stage : 1;
  auto enough = [&](const std::vector<int>& counts) {
    return std::all_of(counts.begin(), counts.end(), [&](int c) { return c >= want; });
  };
  const auto deadline = Clock::now() + std::chrono::seconds(90);
  while (true) {
    auto known = read_stage_announcements(registry, o.stages);
    std::erase_if(known, [](const auto& entry) { return !entry.second.serving; });  // trainers route to these only
    auto counts = peers_per_stage(known, o.stages);
    // A joining trainer cannot know whether the swarm's peers average (that is
    // their --global-batch), so it waits for announcements only.
    auto synced = global_batch_of(o) == 0 || !fleet ? counts : peers_seeing_their_stage(registry, o.stages, want);
    if (enough(counts) && enough(synced)) return known;
    if (fleet) SWARM_RETURN_IF_ERROR(fleet->check_none_exited());
    if (!fleet && counts == std::vector<int>(o.stages, 0)) {
      SWARM_RETURN_IF_ERROR(check_records_readable(registry, access, o.stages));
    }
    if (Clock::now() > deadline) {
      return unavailable("peers did not announce within 90 s (have {} per stage); see {}/peers/*.log",
                         fmt::join(counts, ","), o.run_dir);
    }
    if (stop_requested()) return cancelled("interrupted");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the registry has no change notification
  }
}

// Trainers share the registry node; each has its own routers and ledger.
Result<std::vector<std::unique_ptr<SwarmTrainer>>> make_trainers(const LocalSwarmOptions& o, DhtRegistry* registry,
                                                                 const SwarmAccess& access) {
  TrainerConfig config;
  config.client.security = access.client_security();
  config.credential = access.credential();
  config.num_stages = o.stages;
  config.forward_timeout_seconds = o.forward_timeout_seconds;
  config.backward_timeout_seconds = o.backward_timeout_seconds;
  config.refresh_period_seconds = 2.0;
  SWARM_ASSIGN_OR_RETURN(const WireCodecs codecs, parse_wire_codecs(o.codec, o.gradient_codec));
  config.codec = codecs.activations;
  config.gradient_codec = codecs.gradients;
  config.peer_to_peer = o.hops == "p2p";
  std::vector<std::unique_ptr<SwarmTrainer>> trainers;
  for (int t = 0; t < o.trainers; ++t) {
    config.trainer_id = fmt::format("trainer{}", t);
    if (config.peer_to_peer) {
      SWARM_ASSIGN_OR_RETURN(const std::string bound_id, access.peer_id(config.trainer_id));
      config.sign_hop = access.sign_hop(bound_id, o.stages);
    }
    std::vector<StochasticWiringRouter> routers;
    for (int s = 0; s < o.stages; ++s) {
      StochasticWiringConfig wiring;
      wiring.seed = o.seed * 1000 + t * 10 + s;
      SWARM_ASSIGN_OR_RETURN(auto router, StochasticWiringRouter::create(wiring));
      routers.push_back(std::move(router));
    }
    trainers.push_back(std::make_unique<SwarmTrainer>(config, std::move(routers), registry));
  }
  return trainers;
}

TrainingLoopOptions loop_options(const LocalSwarmOptions& o, int64_t start_step,
                                 const std::vector<std::string>& metric_names) {
  TrainingLoopOptions loop;
  loop.first_step = start_step + 1;
  loop.last_step = o.steps;
  loop.microbatches_per_step = o.microbatches_per_step * o.trainers;
  loop.in_flight = o.in_flight;
  loop.time_limit_seconds = o.time_limit_seconds;
  loop.stop_requested = [] { return stop_requested(); };
  loop.metrics = metric_names.size();
  return loop;
}

// Everything a run holds once its peers serve every stage.
struct SwarmRun {
  const LocalSwarmOptions& o;
  int64_t start_step = 0;
  ModelData& data;
  MetricsWriter& metrics;
  DhtRegistry& registry;
  const SwarmAccess& access;
  PeerFleet* fleet;  // null when joining a swarm
  std::vector<ChaosAction> chaos;
  std::map<std::string, PeerAnnouncementRecord> known;
};

std::string stop_reason_text(StopReason reason) {
  switch (reason) {
    case StopReason::finished: return "all steps done";
    case StopReason::time_limit: return "time limit";
    case StopReason::stop_requested: return "interrupted";
  }
  return "unknown";
}

LocalSwarmReport make_report(const LocalSwarmOptions& o, const ModelData& data, const TrainingSummary& summary, const RunRecorder& recorder,
                             const std::vector<std::unique_ptr<SwarmTrainer>>& trainers,
                             const ValidationResult& validation) {
  LocalSwarmReport report;
  report.steps = static_cast<int>(summary.last_step);
  report.first_loss = recorder.first_loss();
  report.last_loss = recorder.last_loss();
  report.validation_loss = validation.loss;
  report.validation_windows_done = validation.windows_done;
  report.validation_windows = validation.windows;
  report.validation_note = validation.stopped_early.is_ok() ? "" : validation.stopped_early.message();
  report.stopped_because = stop_reason_text(summary.stopped_by);
  report.loss_unit = data.loss_unit;
  report.validation_unit = data.validation_unit;
  report.rate_unit = data.rate_unit;
  report.tokens_per_second = static_cast<double>(summary.tokens) / std::max(1e-9, summary.seconds);
  report.microbatches_started = summary.ledger.started;
  report.microbatches_completed = summary.ledger.completed;
  report.microbatches_abandoned = summary.ledger.abandoned;
  report.retries = summary.ledger.retries;
  for (const auto& trainer : trainers) report.bad_records += trainer->bad_records();
  report.global_steps = recorder.replicas().newest(o.stages);
  const WireVolume wire = recorder.pipeline_volume();
  report.wire_bytes = wire.bytes;
  report.wire_values = wire.values;
  std::tie(report.allreduce_bytes, report.allreduce_values) = recorder.replicas().allreduce_volume();
  report.replica_mismatches = static_cast<int64_t>(recorder.replicas().mismatched());
  report.unvouched_records = recorder.replicas().refused_records();
  report.codec = o.codec;
  report.gradient_codec = gradient_codec_name(o.codec, o.gradient_codec);
  return report;
}

using SwarmLoop = TrainingLoop<SwarmTrainer, AnyDataSource>;

// To --steps; with --eval-every, in segments of that many steps with `evaluate`
// after each one but the last (the run's own validation follows it). The
// microbatches in flight end before each evaluation, so it sees the weights of
// the segment's last global step (or the one before, while its round finishes).
Result<TrainingSummary> train_in_segments(SwarmLoop& loop, const LocalSwarmOptions& o, int64_t start_step,
                                          const std::function<void(int64_t step)>& evaluate) {
  if (o.eval_every <= 0) return loop.run();
  const auto started = Clock::now();
  TrainingSummary total;
  total.last_step = start_step;
  for (int64_t first = start_step + 1; first <= o.steps;) {
    const int64_t last = std::min<int64_t>(o.steps, (first - 1) / o.eval_every * o.eval_every + o.eval_every);
    const double elapsed = std::chrono::duration<double>(Clock::now() - started).count();
    double limit = 0;
    if (o.time_limit_seconds > 0) {
      limit = o.time_limit_seconds - elapsed;
      if (limit <= 0) {
        total.stopped_by = StopReason::time_limit;
        break;
      }
    }
    SWARM_ASSIGN_OR_RETURN(TrainingSummary part, loop.run_steps(first, last, limit));
    total.last_step = part.last_step;
    total.steps_reported += part.steps_reported;
    total.tokens += part.tokens;
    total.ledger = part.ledger;
    total.stopped_by = part.stopped_by;
    if (part.stopped_by != StopReason::finished || part.last_step < last) break;
    if (last < o.steps) evaluate(last);
    first = last + 1;
  }
  total.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  return total;
}

// A validation between segments: a "validation" record and a line.
void evaluate_at(int64_t step, SwarmTrainer& trainer, const ModelData& data, size_t metrics_count,
                 std::optional<Clock::time_point> deadline, MetricsWriter& metrics, const LineSink& print) {
  const auto started = Clock::now();
  const ValidationResult validation = validate_until(trainer, data.validation, deadline, metrics_count);
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  metrics.write({{"kind", "validation"},
                 {"step", step},
                 {"validation_loss", validation.loss ? nlohmann::json(*validation.loss) : nlohmann::json()},
                 {"validation_windows", validation.windows_done},
                 {"seconds", seconds}});
  print(validation.loss ? fmt::format("validation at step {}: loss {:.4f} over {} {} ({:.1f} s)", step,
                                      *validation.loss, validation.windows_done, data.validation_unit, seconds)
                        : fmt::format("validation at step {}: none ({})", step, validation.stopped_early.message()),
        false);
}

// Trains through the loop while chaos runs, then validates through the swarm.
Result<LocalSwarmReport> train_and_validate(SwarmRun& run, const LineSink& print) {
  const LocalSwarmOptions& o = run.o;
  SWARM_ASSIGN_OR_RETURN(auto trainers, make_trainers(o, &run.registry, run.access));
  SWARM_RETURN_IF_ERROR(trainers.front()->check_stages());
  // The metrics the loss stage reports besides its loss, as its peers declare them.
  SWARM_ASSIGN_OR_RETURN(protocol::StageSpec loss_stage, trainers.front()->stage_spec(o.stages - 1));
  const std::vector<std::string> metric_names = loss_stage.io.metrics;
  if (run.start_step > 0) {
    run.metrics.write({{"kind", "event"}, {"event", "resumed"}, {"peer", ""}, {"step", run.start_step}});
    print(fmt::format("resumed {} at global step {}", o.run_dir, run.start_step), false);
  }
  RunRecorder recorder(o, &run.registry, &trainers, &run.metrics, print, std::move(run.known), run.data.rate_unit,
                       metric_names);
  std::vector<SwarmTrainer*> pointers;
  for (auto& trainer : trainers) pointers.push_back(trainer.get());
  SwarmLoop loop(std::move(pointers), std::move(run.data.sources), loop_options(o, run.start_step, metric_names),
                 [&](const StepReport& report) { recorder.on_step(report); });
  // --time-limit bounds the whole of training: the loop stops taking steps at
  // the limit, and draining the microbatches in flight and validation end
  // within kTimeLimitGraceSeconds after it.
  std::optional<Clock::time_point> deadline;
  if (o.time_limit_seconds > 0) {
    deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(o.time_limit_seconds + kTimeLimitGraceSeconds));
    for (auto& trainer : trainers) trainer->give_up_waiting_after(*deadline);
  }
  ChaosRunner chaos(std::move(run.chaos), run.fleet, &run.registry, o.stages, &run.metrics, print);
  Result<TrainingSummary> summary = train_in_segments(loop, o, run.start_step, [&](int64_t step) {
    evaluate_at(step, *trainers[0], run.data, metric_names.size(), deadline, run.metrics, print);
  });
  chaos.end_plan();  // the peers it restarted live on: the final records and ledgers ask them too
  print("", true);  // the live status ends: what follows are the run's final lines
  SWARM_RETURN_IF_ERROR(summary.status());
  if (summary->stopped_by == StopReason::time_limit) {
    print(fmt::format("time limit of {:.0f} s reached after {} steps", o.time_limit_seconds, summary->last_step),
          false);
  }
  recorder.finish();
  const ValidationResult validation = validate_until(*trainers[0], run.data.validation, deadline, metric_names.size());
  LocalSwarmReport report = make_report(o, run.data, *summary, recorder, trainers, validation);
  for (size_t i = 0; i < validation.metrics.size() && i < metric_names.size(); ++i) {
    report.validation_metrics.emplace_back(metric_names[i], validation.metrics[i]);
  }
  report.bad_records += static_cast<int64_t>(run.registry.refused_seals());
  return report;
}

}  // namespace

namespace {

nlohmann::json validation_metrics_json(const LocalSwarmReport& report) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, value] : report.validation_metrics) out[name] = value;
  return out;
}

}  // namespace

Result<LocalSwarmReport> run_local_swarm(const LocalSwarmOptions& options, const LineSink& print) {
  LocalSwarmOptions o = options;
  int64_t start_step = 0;
  if (!o.resume.empty()) {
    if (!o.bootstrap.empty()) return invalid_argument("--resume restarts a swarm local run; it cannot join one");
    SWARM_RETURN_IF_ERROR(restore_run(&o, &start_step));
    if (start_step >= o.steps) {
      return invalid_argument("{} is already at step {}; pass --steps beyond it to train on", o.run_dir, start_step);
    }
  }
  if (o.model == nullptr) return invalid_argument("a swarm needs a model");
  const auto started = Clock::now();
  const bool spawn = o.bootstrap.empty();
  SWARM_RETURN_IF_ERROR(check_options(o));
  SWARM_RETURN_IF_ERROR(parse_slow_peer(o).status());
  SWARM_ASSIGN_OR_RETURN(auto chaos, parse_chaos(o.chaos, o.stages));
  if (!chaos.empty() && !spawn) return invalid_argument("--chaos needs the peers that swarm local starts");
  // A bad path fails before any process starts.
  SWARM_ASSIGN_OR_RETURN(ModelData data, load_run_data(o, start_step));
  SWARM_RETURN_IF_ERROR(create_run_dir(o, data));
  MetricsWriter metrics((fs::path(o.run_dir) / "metrics.jsonl").string(), started);
  if (!metrics.ok()) return permission_denied("cannot write {}/metrics.jsonl", o.run_dir);

  std::optional<LocalOwner> owner;
  if (o.certified && o.secret.empty() && std::getenv("SWARM_SECRET") == nullptr) {
    return invalid_argument("--certified needs the swarm's --secret (or SWARM_SECRET)");
  }
  if (o.certified) {
    SWARM_ASSIGN_OR_RETURN(owner, LocalOwner::create((fs::path(o.run_dir) / "keys").string()));
    // This process is the run's trainer: admitted as one, so the peers serve it.
    SWARM_ASSIGN_OR_RETURN(o.membership, owner->admit("trainer", security::MemberRole::trainer));
  }
  SWARM_ASSIGN_OR_RETURN(SwarmAccess access, SwarmAccess::create(o.host, o.secret, o.membership));
  if (access.owned() && access.credential().empty()) {
    return permission_denied("this swarm has an owner, and its peers serve certified callers only: give this trainer "
                             "--identity and --certificate (swarm admit --role trainer)");
  }
  // Peer processes inherit the secret through the environment: argv is world-readable.
  if (access.secured() && ::setenv("SWARM_SECRET", access.secret().c_str(), 1) != 0) {
    return internal("cannot pass the secret to the peers");
  }
  // This process (its trainers) behind an emulated link of its own, and each peer it starts behind one too.
  if (spawn && !o.link.empty()) fs::remove(link_board_path(o));
  SWARM_RETURN_IF_ERROR(join_access_link(o.link, spawn && !o.link.empty() ? link_board_path(o) : "", "trainers"));
  const ProcessLinkScope link_scope;
  std::optional<DhtRegistry> bootstrap_node;
  SWARM_ASSIGN_OR_RETURN(DhtRegistry registry, join_registry(o, access, &bootstrap_node, print));
  std::optional<PeerFleet> fleet;
  if (spawn) {
    fleet.emplace(o, bootstrap_node->port(), owner ? &*owner : nullptr);
    SWARM_RETURN_IF_ERROR(spawn_peers(o, *fleet, print));
  }
  PeerFleet* peers = fleet ? &*fleet : nullptr;
  SWARM_ASSIGN_OR_RETURN(auto known, wait_until_served(registry, access, o, peers));
  for (const auto& [id, peer] : known) {
    metrics.write({{"kind", "event"}, {"event", "peer_joined"}, {"peer", id}, {"stage", peer.stage}});
  }
  print(fmt::format("all {} stages served after {:.1f} s; training", o.stages, metrics.seconds()), false);
  SwarmRun run{o, start_step, data, metrics, registry, access, peers, std::move(chaos), std::move(known)};
  SWARM_ASSIGN_OR_RETURN(LocalSwarmReport report, train_and_validate(run, print));
  report.seconds = metrics.seconds();
  report.link_bytes = link_bytes();
  metrics.write({{"kind", "step"}, {"step", report.steps}, {"loss", report.last_loss},
                 {"validation_loss", report.validation_loss ? nlohmann::json(*report.validation_loss)
                                                            : nlohmann::json(nullptr)},
                 {"validation_windows", report.validation_windows_done},
                 {"validation_metrics", validation_metrics_json(report)},
                 {"validation_note", report.validation_note}, {"stopped_because", report.stopped_because},
                 {"tokens_per_s", report.tokens_per_second},
                 {"microbatches_completed", report.microbatches_completed},
                 {"microbatches_abandoned", report.microbatches_abandoned}, {"retries", report.retries},
                 {"wire_bytes", report.wire_bytes}, {"wire_values", report.wire_values},
                 {"allreduce_bytes", report.allreduce_bytes}, {"allreduce_values", report.allreduce_values},
                 {"refused_records", report.unvouched_records},
                 {"link_bytes", link_bytes_json(report.link_bytes)}});
  if (Status written = write_run_report(o.run_dir); written.is_ok()) {
    print(fmt::format("report: {}/report.html", o.run_dir), false);
  } else {
    print(fmt::format("report.html not written: {}", written.to_string()), false);
  }
  return report;
}

}  // namespace swarm::apps
