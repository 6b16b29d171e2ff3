#include "apps/swarm_roles.h"

#include <signal.h>

#include <atomic>
#include <cmath>
#include <chrono>
#include <optional>
#include <thread>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "apps/access_link_role.h"
#include "apps/compute_options.h"
#include "apps/model_plugin.h"
#include "apps/peer_serving.h"
#include "apps/swarm_access.h"
#include "kernels/cpu/ops.h"
#include "swarm/compression/codecs.h"
#include "swarm/core/log.h"
#include "swarm/peer/peer.h"
#include "swarm/registry/dht_registry.h"
#include "swarm/trainer/trainer.h"
#include "swarm/wiring/stochastic_wiring.h"
#include "transports/netem/netem_transport.h"
#include "transports/zmq/zmq_transport.h"

namespace swarm::apps {
namespace {

std::atomic<bool> g_stop{false};

void on_stop_signal(int) { g_stop = true; }

}  // namespace

void install_stop_signals() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

bool stop_requested() { return g_stop.load(); }

std::string gradient_codec_name(const std::string& codec, const std::string& gradient_codec) {
  return gradient_codec.empty() ? codec : gradient_codec;
}

Result<WireCodecs> parse_wire_codecs(const std::string& codec, const std::string& gradient_codec) {
  const auto parse = [](const char* flag, const std::string& name) -> Result<CodecId> {
    const std::optional<CodecId> id = codec_from_name(name);
    if (!id) return invalid_argument("{} {}: expected {}", flag, name, all_codec_names_text());
    return *id;
  };
  WireCodecs codecs;
  SWARM_ASSIGN_OR_RETURN(codecs.activations, parse("--codec", codec));
  SWARM_ASSIGN_OR_RETURN(codecs.gradients, parse("--gradient-codec", gradient_codec_name(codec, gradient_codec)));
  return codecs;
}

bool wait_for_stop(double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!g_stop && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return g_stop;
}

int run_bootstrap(const std::string& host, uint16_t port, const std::string& secret) {
  install_stop_signals();
  auto access = SwarmAccess::create(host, secret);
  if (!access.is_ok()) {
    fmt::print(stderr, "swarm bootstrap: {}\n", access.status().to_string());
    return 1;
  }
  auto node = DhtRegistry::start(port, {}, access->registry_options());
  if (!node.is_ok()) {
    fmt::print(stderr, "swarm bootstrap: {}\n", node.status().to_string());
    return 1;
  }
  fmt::print("bootstrap node listening on {}:{}{}\n", host, node->port(), access->secured() ? " (sealed records)" : "");
  std::fflush(stdout);
  while (!wait_for_stop(3600)) {
  }
  return 0;
}

namespace {

// A peer without --stage joins where the swarm needs it most. A young DHT node may
// not see the swarm yet: it looks a few times before concluding the swarm is empty.
int choose_stage(DhtRegistry& registry, int num_stages) {
  for (int attempt = 0; attempt < 5 && !stop_requested(); ++attempt) {
    if (!announced_loads(registry, num_stages).empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
  }
  return stage_the_swarm_needs(registry, num_stages);
}

// --model-options (from swarm local), then what the model derives and checks.
Status prepare_model(const PeerRoleOptions& options, ModelPlugin& model) {
  if (!options.model_options.empty()) {
    auto json = nlohmann::json::parse(options.model_options, nullptr, false);
    if (json.is_discarded()) return invalid_argument("--model-options is not JSON");
    SWARM_RETURN_IF_ERROR(model.set_options_json(json));
  }
  return model.prepare(options.num_stages);
}

}  // namespace

namespace {

// Pipelines from trainers a stage-0 peer holds at once, each on a server worker
// while the stages after it run (a peer's pipelines from peers run on workers of
// their own); one more is answered busy. Compute takes one pipeline at a time
// whatever their number, so they only wait. At 16, a trainer with 64 microbatches
// in flight was answered busy some 1,900 times in 12 steps, and the microbatches
// that lost that lottery stalled their steps for up to 4.5 s.
constexpr int kPipelineWorkers = 64;

using HopTrainer =
    Trainer<StochasticWiringRouter, NetemTransport<ZmqTransport>, DhtRegistry, compression::StandardCodecs>;

// The trainer a peer passes pipelines on with: the swarm's routing (stochastic
// wiring over the registry's records), timeouts and retries, under this peer's id.
Result<std::unique_ptr<HopTrainer>> make_hop_trainer(const PeerRoleOptions& options, const PeerConfig& peer,
                                             const SwarmAccess& access, DhtRegistry* registry) {
  TrainerConfig config;
  config.num_stages = options.num_stages;
  config.trainer_id = peer.peer_id;
  config.client = peer.client;
  config.credential = access.credential();
  config.codec = peer.codec;
  config.gradient_codec = peer.gradient_codec;
  config.refresh_period_seconds = 2.0;
  config.backward_timeout_seconds = options.backward_timeout_seconds;
  config.sign_hop = access.sign_hop(peer.peer_id, options.num_stages);
  config.reply_to = peer.peer_id;  // hops answered at once; outcomes come back to this peer
  std::vector<StochasticWiringRouter> routers;
  for (int s = 0; s < options.num_stages; ++s) {
    StochasticWiringConfig wiring;
    wiring.seed = options.seed * 1000 + 500 + s;
    SWARM_ASSIGN_OR_RETURN(auto router, StochasticWiringRouter::create(wiring));
    routers.push_back(std::move(router));
  }
  return std::make_unique<HopTrainer>(config, std::move(routers), registry);
}

}  // namespace

int run_peer(const PeerRoleOptions& options, ModelPlugin& model) {
  install_stop_signals();
  cpu::set_num_threads(options.threads);
  if (options.num_stages < 1) {
    fmt::print(stderr, "swarm peer: --stages {} must be >= 1\n", options.num_stages);
    return 1;
  }
  if (Status prepared = prepare_model(options, model); !prepared.is_ok()) {
    fmt::print(stderr, "swarm peer: {}\n", prepared.to_string());
    return 1;
  }
  if (options.stage < -1 || options.stage >= options.num_stages) {
    fmt::print(stderr, "swarm peer: stage {} does not exist (0..{})\n", options.stage, options.num_stages - 1);
    return 1;
  }
  if (!(options.backward_timeout_seconds > 0) || !std::isfinite(options.backward_timeout_seconds)) {
    fmt::print(stderr, "swarm peer: --backward-timeout {} must be a number of seconds > 0\n",
               options.backward_timeout_seconds);
    return 1;
  }
  if (!(options.rebalance_period_seconds >= 0) || !std::isfinite(options.rebalance_period_seconds)) {
    fmt::print(stderr, "swarm peer: --rebalance-period {} must be a number of seconds >= 0\n",
               options.rebalance_period_seconds);
    return 1;
  }
  const Result<ComputeBackend> backend = parse_compute(options.compute);
  if (!backend.is_ok()) {
    fmt::print(stderr, "swarm peer: {}\n", backend.status().message());
    return 2;
  }
  // Before joining anything: a peer that cannot compute must not announce itself.
  if (Status ready = model.check_device(*backend); !ready.is_ok()) {
    fmt::print(stderr, "swarm peer: {}\n", ready.message());
    return 2;
  }
  auto access = SwarmAccess::create(options.host, options.secret, options.membership);
  if (!access.is_ok()) {
    fmt::print(stderr, "swarm peer: {}\n", access.status().to_string());
    return 1;
  }
  if (access->owned() && !access->certified_peer()) {
    fmt::print(stderr,
               "swarm peer: this swarm has an owner (--owner-key): a peer needs its --identity and the owner's "
               "--certificate for it (role peer), or its records count for nothing\n");
    return 1;
  }
  auto peer_id = access->peer_id(options.peer_id.empty() ? fmt::format("peer-{}", ::getpid()) : options.peer_id);
  if (!peer_id.is_ok()) {
    fmt::print(stderr, "swarm peer: --peer-id: {}\n", peer_id.status().to_string());
    return 1;
  }
  // Before any server binds, so that its address is registered behind the link.
  if (Status linked = join_access_link(options.link, options.link_board, *peer_id); !linked.is_ok()) {
    fmt::print(stderr, "swarm peer: {}\n", linked.to_string());
    return 1;
  }
  std::vector<std::string> bootstrap;
  if (!options.bootstrap.empty()) bootstrap.push_back(options.bootstrap);
  auto registry = DhtRegistry::start(0, bootstrap, access->registry_options());
  if (!registry.is_ok()) {
    fmt::print(stderr, "swarm peer: registry: {}\n", registry.status().to_string());
    return 1;
  }
  const int stage = options.stage >= 0 ? options.stage : choose_stage(*registry, options.num_stages);
  PeerConfig config;
  config.stage_index = stage;
  config.num_stages = options.num_stages;
  config.rebalance_period_seconds = options.num_stages > 1 ? options.rebalance_period_seconds : 0;
  config.rebalance_seed = options.seed;
  config.peer_id = *peer_id;
  config.bind_address = options.bind.empty() ? fmt::format("tcp://{}:*", options.host) : options.bind;
  config.server.security = access->server_security();
  config.client.security = access->client_security();
  config.speaks_for = access->speaks_for();
  config.admit_caller = access->admit_caller();
  config.pipeline_origin = access->pipeline_origin(*peer_id, options.num_stages);
  config.credential = access->credential();
  config.learning_rate = options.learning_rate;
  config.warmup_steps = options.warmup_steps;
  config.step_every_samples = options.step_every_samples;
  config.compute_waits_for_round_seconds = options.round_wait_seconds;
  config.forward_waits_for_pending_seconds = options.forward_hold_seconds;
  config.max_batch = options.max_batch;
  const Result<WireCodecs> codecs = parse_wire_codecs(options.codec, options.gradient_codec);
  if (!codecs.is_ok()) {
    fmt::print(stderr, "swarm peer: {}\n", codecs.status().message());
    return 1;
  }
  config.codec = codecs->activations;
  config.gradient_codec = codecs->gradients;
  config.slowdown = options.slowdown;
  config.emulated_seconds_per_sample = options.emulated_seconds_per_sample;
  config.announce_period_seconds = options.announce_period_seconds;
  config.announce_ttl_seconds = options.announce_ttl_seconds;
  config.global_batch_samples = options.global_batch_samples;
  config.total_steps = options.total_steps;
  config.checkpoint_path = options.checkpoint_path;
  config.checkpoint_every_steps = options.checkpoint_every_steps;
  config.resume_from = options.resume_from;
  config.progress_stale_seconds = options.announce_ttl_seconds;
  config.gather_timeout_seconds = 1.0;
  config.all_reduce.part_timeout_seconds = options.all_reduce_part_timeout_seconds;
  config.all_reduce.round_timeout_seconds = options.all_reduce_round_timeout_seconds;
  config.all_reduce.ping_timeout_seconds = 0.5;
  config.test_die_after_allreduce_sends = options.test_die_in_allreduce_after;
  config.test_die_after_state_chunks = options.test_die_after_state_chunks;
  config.test_contribution_scale = {options.test_contribution_scale, options.test_contribution_scale_from_step};
  config.test_forge_reduced_part_from = options.test_forge_reduced_part_from;
  config.test_die_by_signal = true;
  // Peer to peer: a trainer of this peer's own routes each pipeline on to the next stage.
  std::unique_ptr<HopTrainer> hops;
  if (options.peer_to_peer) {
    auto made = make_hop_trainer(options, config, *access, &*registry);
    if (!made.is_ok()) {
      fmt::print(stderr, "swarm peer: --p2p: {}\n", made.status().to_string());
      return 1;
    }
    hops = std::move(made).value();
    config.pass_pipeline_on = [trainer = hops.get()](const protocol::PipelineHop& hop) {
      return trainer->pass_pipeline_on(hop);
    };
    config.pipeline_workers = kPipelineWorkers;
    config.hop_slots = static_cast<size_t>(options.hop_slots);
    config.return_pipeline = [trainer = hops.get()](int stage, const std::string& peer, uint64_t microbatch,
                                                    uint64_t return_id, const Result<protocol::StageReply>& outcome,
                                                    int64_t deadline_unix_ms) {
      return trainer->return_pipeline_result(stage, peer, microbatch, return_id, outcome, deadline_unix_ms);
    };
    config.deliver_pipeline_result = [trainer = hops.get()](protocol::PipelineResult result) {
      return trainer->deliver_pipeline_result(std::move(result));
    };
    config.stop_returns = [trainer = hops.get()] { trainer->close_hop_returns(); };
  }
  return model.serve(PeerServing{options, config, &*registry, access->secured()});
}

}  // namespace swarm::apps
