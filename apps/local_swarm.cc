#include "apps/local_swarm.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <cstdio>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "apps/chaos.h"
#include "apps/child_process.h"
#include "swarm/averaging/averaging_messages.h"
#include "swarm/averaging/progress.h"
#include "swarm/checkpoint/checkpoint.h"
#include "swarm/data/batch_sampler.h"
#include "swarm/data/split.h"
#include "swarm/data/token_dataset.h"
#include "swarm/registry/dht_registry.h"
#include "swarm/trainer/trainer.h"
#include "swarm/wiring/stochastic_wiring.h"
#include "transports/zmq/zmq_transport.h"

namespace swarm::apps {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using SwarmTrainer = Trainer<StochasticWiringRouter, ZmqTransport, DhtRegistry>;

// Appends JSON lines; every record gets "time" (seconds since the run began).
class MetricsWriter {
 public:
  MetricsWriter(const std::string& path, Clock::time_point start) : out_(path, std::ios::app), start_(start) {}
  bool ok() const { return static_cast<bool>(out_); }
  void write(nlohmann::json record) {
    std::lock_guard lock(mu_);
    record["time"] = std::chrono::duration<double>(Clock::now() - start_).count();
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

std::string stage_checkpoint_path(const std::string& run_dir, int stage) {
  return (fs::path(run_dir) / "checkpoints" / fmt::format("stage-{}.ckpt", stage)).string();
}

int64_t global_batch_of(const LocalSwarmOptions& o) {
  return o.global_batch >= 0 ? o.global_batch : int64_t{o.microbatch} * o.microbatches_per_step * o.trainers;
}

// The lr decays over the global steps the run will take: its samples over the global batch.
int64_t expected_global_steps(const LocalSwarmOptions& o) {
  const int64_t batch = std::max<int64_t>(1, global_batch_of(o));
  return std::max<int64_t>(1, int64_t{o.steps} * o.microbatch * o.microbatches_per_step * o.trainers / batch);
}

std::vector<std::string> peer_args(const LocalSwarmOptions& o, int stage, const std::string& id, uint16_t port,
                                   double slowdown, bool resume) {
  std::vector<std::string> sync = {"--global-batch", std::to_string(global_batch_of(o)),
                                   "--total-steps", std::to_string(expected_global_steps(o)),
                                   "--checkpoint", stage_checkpoint_path(o.run_dir, stage),
                                   "--checkpoint-every", std::to_string(o.checkpoint_every)};
  if (resume) {
    sync.push_back("--resume-from");
    sync.push_back(stage_checkpoint_path(o.run_dir, stage));
  }
  std::vector<std::string> args = {"peer",          "--slowdown",    fmt::format("{}", slowdown),
          "--emulated-cost", fmt::format("{}", o.emulated_seconds_per_sample),          "--stage",       std::to_string(stage),
          "--stages",      std::to_string(o.stages),
          "--peer-id",     id,
          "--bootstrap",   fmt::format("127.0.0.1:{}", port),
          "--d-model",     std::to_string(o.model.d_model),
          "--layers",      std::to_string(o.model.n_layers),
          "--heads",       std::to_string(o.model.n_heads),
          "--seq-len",     std::to_string(o.model.max_seq_len),
          "--layer-repeat", std::to_string(o.model.layer_repeat),
          "--vocab",       std::to_string(o.model.vocab_size),
          "--seed",        std::to_string(o.seed),
          "--lr",          fmt::format("{}", o.learning_rate),
          "--warmup",      std::to_string(o.warmup_steps),
          "--step-every",  std::to_string(o.step_every_samples),
          "--max-batch",   std::to_string(o.max_batch),
          "--threads",     "1"};
  args.insert(args.end(), sync.begin(), sync.end());
  return args;
}

// Every (peer, step) parameter hash the stages' progress records show, once each.
class ReplicaHashLog {
 public:
  void poll(DhtRegistry& registry, int stages, const std::function<void(nlohmann::json)>& write) {
    for (int s = 0; s < stages; ++s) {
      auto records = registry.get(progress_registry_key(s));
      if (!records.is_ok()) continue;
      for (const auto& record : *records) {
        auto progress = ProgressRecord::from_json(record.value);
        if (!progress.is_ok()) continue;
        for (const auto& [step, hash] : progress->recent_hashes) {
          if (!seen_.insert({progress->peer_id, step}).second) continue;
          write({{"kind", "replica"}, {"peer", progress->peer_id}, {"stage", s}, {"step", step},
                 {"hash", hex64(hash)}});
          auto& stage_hashes = hashes_[{s, step}];
          stage_hashes.insert(hash);
          if (stage_hashes.size() > 1) mismatched_.insert({s, step});
        }
        if (progress->step > newest_[s]) newest_[s] = progress->step;
      }
    }
  }
  // Highest global step seen per stage.
  std::vector<int64_t> newest(int stages) const {
    std::vector<int64_t> out(stages, 0);
    for (const auto& [s, step] : newest_) {
      if (s < stages) out[s] = step;
    }
    return out;
  }
  size_t mismatched() const { return mismatched_.size(); }

 private:
  std::set<std::pair<std::string, int64_t>> seen_;
  std::map<std::pair<int, int64_t>, std::set<uint64_t>> hashes_;
  std::set<std::pair<int, int64_t>> mismatched_;
  std::map<int, int64_t> newest_;
};

std::map<std::string, PeerAnnouncementRecord> read_peers(DhtRegistry& registry, int stages) {
  std::map<std::string, PeerAnnouncementRecord> peers;
  for (int s = 0; s < stages; ++s) {
    auto records = registry.get(stage_registry_key(s));
    if (!records.is_ok()) continue;
    for (const auto& record : *records) {
      auto announcement = PeerAnnouncementRecord::from_json(record.value);
      if (announcement.is_ok()) peers[announcement->peer_id] = *announcement;
    }
  }
  return peers;
}

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

Tensor window_batch(const std::vector<TokenWindow>& windows, size_t begin, size_t count, bool targets, int seq) {
  Tensor out = *Tensor::empty(Shape{static_cast<int64_t>(count), seq}, DType::i32);
  for (size_t i = 0; i < count; ++i) {
    const auto& source = targets ? windows[begin + i].targets : windows[begin + i].inputs;
    std::copy(source.begin(), source.end(), out.data<int32_t>() + i * seq);
  }
  return out;
}

}  // namespace

// `--resume DIR`: the run's own config.json and the step of its stage checkpoints.
Status restore_run(LocalSwarmOptions* o, int64_t* start_step) {
  const fs::path dir = o->resume;
  std::ifstream in(dir / "config.json");
  if (!in) return not_found("--resume {}: no config.json there (is it a swarm local run directory?)", dir.string());
  auto config = nlohmann::json::parse(in, nullptr, false);
  if (config.is_discarded() || !config.is_object()) return invalid_argument("{}/config.json is not JSON", dir.string());
  try {
    SWARM_ASSIGN_OR_RETURN(o->model, gpt::GptConfig::from_json(config.at("model").dump()));
    o->stages = config.at("stages");
    o->peers_per_stage = config.at("peers_per_stage");
    o->trainers = config.at("trainers");
    o->microbatch = config.at("microbatch");
    o->microbatches_per_step = config.at("microbatches_per_step");
    o->in_flight = config.at("in_flight");
    o->seed = config.at("seed");
    o->data_path = config.at("data");
    o->learning_rate = config.at("learning_rate");
    o->warmup_steps = config.at("warmup_steps");
    o->global_batch = config.value("global_batch", int64_t{-1});
    o->checkpoint_every = config.value("checkpoint_every", o->checkpoint_every);
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
  const auto started = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - started).count(); };
  const bool spawn = o.bootstrap.empty();
  if (o.stages < 1 || o.peers_per_stage < 1 || o.trainers < 1 || o.steps < 1 || o.microbatch < 1 ||
      o.microbatches_per_step < 1 || o.in_flight < 1) {
    return invalid_argument("stages, peers per stage, trainers, steps, microbatch sizes and in-flight counts must be >= 1");
  }
  gpt::GptConfig model = o.model;
  SWARM_RETURN_IF_ERROR(model.validate());
  SWARM_RETURN_IF_ERROR(gpt::partition_layers(model, o.stages).status());
  SWARM_ASSIGN_OR_RETURN(auto chaos, parse_chaos(o.chaos, o.stages));
  if (!chaos.empty() && !spawn) return invalid_argument("--chaos needs the peers that swarm local starts");

  // Data first: a bad path should fail before any process starts.
  const std::string data_path = o.data_path.empty() ? std::string(kDefaultCorpus) : o.data_path;
  SWARM_ASSIGN_OR_RETURN(TokenDataset dataset, load_text_bytes(data_path));
  if (dataset.vocab_size != model.vocab_size) {
    return invalid_argument("the data has vocabulary {}, the model {}", dataset.vocab_size, model.vocab_size);
  }
  const int seq = model.max_seq_len;
  SWARM_ASSIGN_OR_RETURN(DataSplit split, split_train_validation(dataset, 0.05, int64_t{16} * (seq + 1), o.seed));
  SWARM_ASSIGN_OR_RETURN(auto windows, validation_windows(split.validation, seq, o.eval_windows));

  std::error_code error;
  fs::create_directories(fs::path(o.run_dir) / "peers", error);
  if (!error) fs::create_directories(fs::path(o.run_dir) / "checkpoints", error);
  if (error) return permission_denied("cannot create run directory {}: {}", o.run_dir, error.message());
  if (o.resume.empty()) {
    nlohmann::json config = {
        {"model", nlohmann::json::parse(model.to_json())},
        {"stages", o.stages},
        {"peers_per_stage", o.peers_per_stage},
        {"trainers", o.trainers},
        {"steps", o.steps},
        {"microbatch", o.microbatch},
        {"microbatches_per_step", o.microbatches_per_step},
        {"in_flight", o.in_flight},
        {"seed", o.seed},
        {"chaos", o.chaos},
        {"data", data_path},
        {"learning_rate", o.learning_rate},
        {"warmup_steps", o.warmup_steps},
        {"step_every_samples", o.step_every_samples},
        {"global_batch", o.global_batch},
        {"global_batch_samples", global_batch_of(o)},
        {"checkpoint_every", o.checkpoint_every},
        {"transport", "zmq"},
        {"registry", "opendht"},
        {"router", "stochastic_wiring"},
    };
    std::ofstream out(fs::path(o.run_dir) / "config.json");
    out << config.dump(2) << '\n';
    if (!out) return permission_denied("cannot write {}/config.json", o.run_dir);
  }
  MetricsWriter metrics((fs::path(o.run_dir) / "metrics.jsonl").string(), started);
  if (!metrics.ok()) return permission_denied("cannot write {}/metrics.jsonl", o.run_dir);

  // The registry: an embedded bootstrap node, or the given one.
  std::optional<DhtRegistry> bootstrap_node;
  std::vector<std::string> bootstrap;
  if (spawn) {
    SWARM_ASSIGN_OR_RETURN(DhtRegistry node, DhtRegistry::start(0, {}));
    bootstrap_node.emplace(std::move(node));
    bootstrap.push_back(fmt::format("127.0.0.1:{}", bootstrap_node->port()));
  } else {
    bootstrap.push_back(o.bootstrap);
  }
  SWARM_ASSIGN_OR_RETURN(DhtRegistry registry, DhtRegistry::start(0, bootstrap));
  print(fmt::format("registry: OpenDHT via {}", bootstrap[0]), false);

  int slow_stage = -1;
  double slow_factor = 1.0;
  if (!o.slow_peer.empty()) {
    if (std::sscanf(o.slow_peer.c_str(), "%d:%lf", &slow_stage, &slow_factor) != 2 || slow_stage < 0 ||
        slow_stage >= o.stages || !(slow_factor >= 1.0)) {
      return invalid_argument("--slow-peer \"{}\": expected STAGE:FACTOR with a stage in 0..{} and FACTOR >= 1",
                              o.slow_peer, o.stages - 1);
    }
  }
  std::mutex peers_mu;
  std::vector<PeerProcess> processes;
  int spawned = 0;
  std::set<int> slowed;
  auto spawn_peer = [&](int stage) -> Status {
    const std::string id = fmt::format("s{}p{}", stage, spawned++);
    double slowdown = 1.0;
    if (stage == slow_stage && slowed.insert(stage).second) slowdown = slow_factor;
    SWARM_ASSIGN_OR_RETURN(ChildProcess child,
                           ChildProcess::spawn(peer_args(o, stage, id, bootstrap_node->port(), slowdown, !o.resume.empty()),
                                               (fs::path(o.run_dir) / "peers" / (id + ".log")).string(),
                                               kPeerEnvironment));
    std::lock_guard lock(peers_mu);
    processes.push_back({id, stage, child});
    return Status::ok();
  };
  auto shutdown_peers = [&] {
    std::lock_guard lock(peers_mu);
    for (auto& peer : processes) peer.process.terminate(5.0);
  };
  struct PeersGuard {
    std::function<void()> stop;
    ~PeersGuard() { stop(); }
  } guard{shutdown_peers};

  if (spawn) {
    for (int s = 0; s < o.stages; ++s) {
      for (int p = 0; p < o.peers_per_stage; ++p) SWARM_RETURN_IF_ERROR(spawn_peer(s));
    }
    print(fmt::format("started {} peer processes ({} stages x {}), logs in {}/peers", o.stages * o.peers_per_stage,
                      o.stages, o.peers_per_stage, o.run_dir),
          false);
  }
  // Wait until every stage is served.
  const auto ready_deadline = Clock::now() + std::chrono::seconds(90);
  std::map<std::string, PeerAnnouncementRecord> known;
  while (true) {
    known = read_peers(registry, o.stages);
    auto counts = peers_per_stage(known, o.stages);
    const int want = spawn ? o.peers_per_stage : 1;
    // Stage-mates must see each other's progress before the first global step.
    auto synced = peers_seeing_their_stage(registry, o.stages, want);
    if (global_batch_of(o) == 0) synced = counts;
    if (std::all_of(counts.begin(), counts.end(), [&](int c) { return c >= want; }) &&
        std::all_of(synced.begin(), synced.end(), [&](int c) { return c >= want; })) {
      break;
    }
    {
      // A peer that exits at start-up (a bad flag, a port in use) will never announce.
      std::lock_guard lock(peers_mu);
      for (auto& peer : processes) {
        if (peer.process.exited()) {
          std::ifstream log(fs::path(o.run_dir) / "peers" / (peer.id + ".log"));
          std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
          return unavailable("peer {} exited at start-up: {}", peer.id, text.substr(0, 400));
        }
      }
    }
    if (Clock::now() > ready_deadline) {
      return unavailable("peers did not announce within 90 s (have {} per stage); see {}/peers/*.log",
                         fmt::join(counts, ","), o.run_dir);
    }
    if (stop_requested()) return cancelled("interrupted");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  for (const auto& [id, peer] : known) {
    metrics.write({{"kind", "event"}, {"event", "peer_joined"}, {"peer", id}, {"stage", peer.stage}});
  }
  print(fmt::format("all {} stages served after {:.1f} s; training", o.stages, elapsed()), false);

  // Trainers share the registry node; each has its own routers and ledger.
  TrainerConfig trainer_config;
  trainer_config.num_stages = o.stages;
  trainer_config.forward_timeout_seconds = o.forward_timeout_seconds;
  trainer_config.backward_timeout_seconds = o.backward_timeout_seconds;
  trainer_config.refresh_period_seconds = 2.0;
  std::vector<std::unique_ptr<SwarmTrainer>> trainers;
  for (int t = 0; t < o.trainers; ++t) {
    auto config = trainer_config;
    config.trainer_id = fmt::format("trainer{}", t);
    std::vector<StochasticWiringRouter> routers;
    for (int s = 0; s < o.stages; ++s) {
      StochasticWiringConfig wiring;
      wiring.seed = o.seed * 1000 + t * 10 + s;
      SWARM_ASSIGN_OR_RETURN(auto router, StochasticWiringRouter::create(wiring));
      routers.push_back(std::move(router));
    }
    trainers.push_back(std::make_unique<SwarmTrainer>(config, std::move(routers), &registry));
  }

  // Before the chaos thread starts: nothing may return early while it runs.
  std::vector<BatchSampler> samplers;
  for (int t = 0; t < o.trainers; ++t) {
    SWARM_ASSIGN_OR_RETURN(BatchSampler sampler,
                           BatchSampler::create(&split.train, o.microbatch, seq,
                                                o.seed * 7919 + t + static_cast<uint64_t>(start_step) * 104729));
    samplers.push_back(std::move(sampler));
  }

  // Chaos runs on its own thread against the training clock.
  std::atomic<bool> training_done{false};
  const auto training_started = Clock::now();
  std::thread chaos_thread([&] {
    std::map<int, pid_t> stopped_groups;
    for (const ChaosAction& action : chaos) {
      while (!training_done &&
             std::chrono::duration<double>(Clock::now() - training_started).count() < action.at_seconds) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (training_done) return;
      std::lock_guard lock(peers_mu);
      auto live_peer = [&]() -> PeerProcess* {
        for (auto& p : processes) {
          if (p.stage == action.stage && !p.killed && !p.stopped && !p.process.exited()) return &p;
        }
        return nullptr;
      };
      std::string target;
      if (action.kind == ChaosAction::Kind::kill_peer) {
        if (PeerProcess* p = live_peer()) {
          (void)p->process.signal(SIGKILL);
          p->killed = true;
          target = p->id;
        }
      } else if (action.kind == ChaosAction::Kind::stop_peer) {
        if (PeerProcess* p = live_peer()) {
          (void)p->process.signal(SIGSTOP);
          p->stopped = true;
          stopped_groups[action.group] = p->process.pid();
          target = p->id;
        }
      } else if (action.kind == ChaosAction::Kind::continue_peer) {
        for (auto& p : processes) {
          if (stopped_groups.count(action.group) && p.process.pid() == stopped_groups[action.group]) {
            (void)p.process.signal(SIGCONT);
            p.stopped = false;
            target = p.id;
          }
        }
      } else {
        const std::string id = fmt::format("s{}p{}", action.stage, spawned++);
        auto child = ChildProcess::spawn(peer_args(o, action.stage, id, bootstrap_node->port(), 1.0, false),
                                         (fs::path(o.run_dir) / "peers" / (id + ".log")).string(), kPeerEnvironment);
        if (child.is_ok()) {
          processes.push_back({id, action.stage, *child});
          target = id;
        }
      }
      metrics.write({{"kind", "event"}, {"event", fmt::format("chaos_{}", chaos_kind_name(action.kind))},
                     {"peer", target}, {"stage", action.stage}});
      print(fmt::format("chaos: {} stage {} -> {}", chaos_kind_name(action.kind), action.stage,
                        target.empty() ? "no live peer" : target),
            false);
    }
  });

  LocalSwarmReport report;
  std::vector<std::mutex> sampler_mu(o.trainers);
  int64_t tokens_done = 0;
  double window_start = elapsed();
  int64_t window_tokens = 0;
  auto last_peer_poll = Clock::now() - std::chrono::seconds(10);
  ReplicaHashLog replicas;
  auto write_metric = [&](nlohmann::json record) { metrics.write(std::move(record)); };
  auto last_replica_poll = Clock::now() - std::chrono::seconds(10);
  if (start_step > 0) {
    metrics.write({{"kind", "event"}, {"event", "resumed"}, {"peer", ""}, {"step", start_step}});
    print(fmt::format("resumed {} at global step {}", o.run_dir, start_step), false);
  }
  for (int step = static_cast<int>(start_step) + 1; step <= o.steps && !stop_requested(); ++step) {
    if (o.time_limit_seconds > 0 &&
        std::chrono::duration<double>(Clock::now() - training_started).count() > o.time_limit_seconds) {
      print(fmt::format("time limit of {:.0f} s reached after {} steps", o.time_limit_seconds, step - 1), false);
      break;
    }
    std::atomic<int> next{0};
    std::mutex loss_mu;
    double loss_sum = 0;
    int loss_count = 0;
    const int per_trainer = o.microbatches_per_step;
    std::vector<std::thread> workers;
    for (int t = 0; t < o.trainers; ++t) {
      for (int w = 0; w < o.in_flight; ++w) {
        workers.emplace_back([&, t] {
          while (true) {
            const int index = next.fetch_add(1);
            if (index >= per_trainer * o.trainers) return;
            Tensor tokens = *Tensor::empty(Shape{o.microbatch, seq}, DType::i32);
            Tensor targets = *Tensor::empty(Shape{o.microbatch, seq}, DType::i32);
            {
              std::lock_guard lock(sampler_mu[t]);
              samplers[t].next(tokens.data<int32_t>(), targets.data<int32_t>());
            }
            MicrobatchOutcome outcome = trainers[t]->run_microbatch(tokens, targets);
            if (outcome.completed) {
              std::lock_guard lock(loss_mu);
              loss_sum += outcome.loss;
              ++loss_count;
            } else {
              log_warn("microbatch abandoned: {}", outcome.abandon_reason);
            }
          }
        });
      }
    }
    for (auto& worker : workers) worker.join();
    const int64_t step_tokens = int64_t{loss_count} * o.microbatch * seq;
    tokens_done += step_tokens;
    window_tokens += step_tokens;
    const double loss = loss_count > 0 ? loss_sum / loss_count : 0;
    if (step == start_step + 1) report.first_loss = loss;
    report.last_loss = loss;
    const double now = elapsed();
    const double tokens_per_s = window_tokens / std::max(1e-9, now - window_start);
    if (now - window_start > 10) {
      window_start = now;
      window_tokens = 0;
    }
    Ledger totals;
    for (auto& trainer : trainers) {
      Ledger ledger = trainer->ledger();
      totals.started += ledger.started;
      totals.completed += ledger.completed;
      totals.abandoned += ledger.abandoned;
      totals.retries += ledger.retries;
    }
    for (auto& trainer : trainers) {
      for (const TrainerEvent& e : trainer->take_events()) {
        metrics.write({{"kind", "event"}, {"event", e.event}, {"peer", e.peer}, {"stage", e.stage},
                       {"detail", e.detail}});
      }
    }
    metrics.write({{"kind", "step"}, {"step", step}, {"loss", loss}, {"tokens_per_s", tokens_per_s},
                   {"microbatches_completed", totals.completed}, {"microbatches_abandoned", totals.abandoned},
                   {"retries", totals.retries}});
    // Peer records and joins/losses, from the registry, every couple of seconds.
    if (Clock::now() - last_peer_poll > std::chrono::seconds(2) || step == o.steps) {
      last_peer_poll = Clock::now();
      auto current = read_peers(registry, o.stages);
      std::map<std::string, ServedCounts> served;
      for (auto& trainer : trainers) {
        for (auto& [id, counts] : trainer->served()) {
          served[id].forward += counts.forward;
          served[id].backward += counts.backward;
          served[id].failures += counts.failures;
        }
      }
      for (const auto& [id, peer] : current) {
        if (!known.count(id)) {
          metrics.write({{"kind", "event"}, {"event", "peer_joined"}, {"peer", id}, {"stage", peer.stage}});
        }
        metrics.write({{"kind", "peer"}, {"peer", id}, {"stage", peer.stage}, {"forward", served[id].forward},
                       {"backward", served[id].backward}, {"failures", served[id].failures},
                       {"throughput", peer.throughput}});
      }
      for (const auto& [id, peer] : known) {
        if (!current.count(id)) {
          metrics.write({{"kind", "event"}, {"event", "peer_lost"}, {"peer", id}, {"stage", peer.stage}});
        }
      }
      known = current;
    }
    if (Clock::now() - last_replica_poll > std::chrono::milliseconds(500) || step == o.steps) {
      last_replica_poll = Clock::now();
      replicas.poll(registry, o.stages, write_metric);
    }
    auto counts = peers_per_stage(known, o.stages);
    print(fmt::format("step {:4d}/{} | loss {:.4f} | {:6.0f} tok/s | peers/stage {} | global steps {} | retries {} "
                      "| abandoned {} | {:.0f} s",
                      step, o.steps, loss, tokens_per_s, fmt::join(counts, ","),
                      fmt::join(replicas.newest(o.stages), ","), totals.retries, totals.abandoned, now),
          true);
    report.steps = step;
    report.microbatches_started = totals.started;
    report.microbatches_completed = totals.completed;
    report.microbatches_abandoned = totals.abandoned;
    report.retries = totals.retries;
  }
  training_done = true;
  chaos_thread.join();
  replicas.poll(registry, o.stages, write_metric);
  report.replica_mismatches = static_cast<int64_t>(replicas.mismatched());
  report.global_steps = replicas.newest(o.stages);
  const double train_seconds = std::chrono::duration<double>(Clock::now() - training_started).count();
  report.tokens_per_second = tokens_done / std::max(1e-9, train_seconds);

  // Validation: forward only, through the swarm.
  double val_sum = 0;
  int val_count = 0;
  for (size_t begin = 0; begin < windows.size(); begin += 8) {
    const size_t count = std::min<size_t>(8, windows.size() - begin);
    Tensor tokens = window_batch(windows, begin, count, false, seq);
    Tensor targets = window_batch(windows, begin, count, true, seq);
    MicrobatchOutcome outcome = trainers[0]->evaluate(tokens, targets);
    if (!outcome.completed) return unavailable("validation failed: {}", outcome.abandon_reason);
    val_sum += outcome.loss * count;
    val_count += static_cast<int>(count);
  }
  report.validation_loss = val_count > 0 ? val_sum / val_count : 0;
  report.seconds = elapsed();
  metrics.write({{"kind", "step"}, {"step", report.steps}, {"loss", report.last_loss},
                 {"validation_loss", report.validation_loss}, {"tokens_per_s", report.tokens_per_second},
                 {"microbatches_completed", report.microbatches_completed},
                 {"microbatches_abandoned", report.microbatches_abandoned}, {"retries", report.retries}});
  return report;
}

}  // namespace swarm::apps
