// local_swarm: `swarm local` and `swarm trainer`. Trains a model with SWARM
// parallelism: S stages x P peer processes over ZeroMQ on loopback, found
// through an OpenDHT registry, driven by trainers that route every hop with
// stochastic wiring. Writes a run directory (config.json, metrics.jsonl, peer
// logs) and shows a live progress line.
//
//   swarm::apps::LocalSwarmOptions options;   // 2 stages x 2 peers
//   options.model = &plugin;                   // the model (apps/model_plugin.h), its options parsed
//   auto report = swarm::apps::run_local_swarm(options, print_line);
#pragma once

#include "apps/compute_options.h"

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "apps/swarm_roles.h"
#include "apps/model_plugin.h"
#include "swarm/core/status.h"

namespace swarm::apps {

struct LocalSwarmOptions {
  std::string run_dir = "swarm-run";
  // The model: its options, data and stages. Not owned; --resume sets its options.
  ModelPlugin* model = nullptr;
  int stages = 2;
  int peers_per_stage = 2;  // every run averages: a stage of one never runs a round
  int trainers = 1;
  int steps = 600;
  int microbatch = 8;             // sequences per microbatch
  int microbatches_per_step = 4;  // a step: this many microbatches per trainer
  // Microbatches each trainer keeps in flight. With no per-step barrier every one in
  // flight is a step of staleness risk: 2 keeps both stages busy on 2 cores, and
  // 4 (32 samples, two global batches in flight) measured 2.53 against 2.42
  // validation loss in the main job, and was no faster.
  int in_flight = 2;
  uint64_t seed = 1;
  std::string chaos;              // see apps/chaos.h
  // The run is its swarm's owner and admits each peer it starts (local_owner.h);
  // needs a secret.
  bool certified = false;
  // LAMB moves each tensor by about lr times its own norm per step; this small model
  // trains fastest well above the paper's 1e-3 (measured: 1e-2 beats 2e-3 and 2e-2).
  float learning_rate = 1e-2f;    // peak lr of the stages' LAMB steps
  int warmup_steps = 10;          // global steps of linear warm-up
  // Samples per global step of every stage: -1 = one step's worth (microbatch x
  // microbatches_per_step x trainers); 0 = solo mode (each peer a local AdamW step
  // every step_every_samples, no averaging). 16 = two global steps per step here.
  int64_t global_batch = 16;
  int step_every_samples = 16;
  double round_wait_seconds = 0.25;  // see PeerConfig::compute_waits_for_round_seconds
  double forward_hold_seconds = 0.02;  // see PeerConfig::forward_waits_for_pending_seconds
  int checkpoint_every = 25;      // global steps between stage checkpoints (0: none)
  // Continue the run in this directory from its last checkpoints (its config.json
  // gives the model and swarm; --steps says where to stop).
  std::string resume;
  int max_batch = 1;              // peers batch up to this many concurrent forwards
  ComputeOptions compute;         // every peer's --device, --precision, --attention
  std::string codec = "8bit";     // activations and all-reduce parts: 8bit|4bit|fp16|bf16|none
  std::string gradient_codec;     // the backward's gradients; empty: codec
  // "RATE,LATENCY" (netem's "200mbit,50ms"): the trainers' link to every peer,
  // emulated each way; empty: the network as it is.
  std::string link;
  // "hub": every pipeline message goes through the trainer; "p2p": the trainer sends
  // tokens and targets to stage 0 and the peers pass each microbatch on themselves.
  std::string hops = "hub";
  int eval_windows = 32;          // validation samples (a GPT's: windows) evaluated at the end
  // > 0: training pauses after every this many steps for a validation through the
  // swarm ("validation" records in metrics.jsonl): the run's held-out loss curve.
  int eval_every = 0;
  double forward_timeout_seconds = 10;
  double backward_timeout_seconds = 20;
  int hop_slots = 64;  // --hops p2p: each peer's --hop-slots
  // Stop training after this many seconds even if steps remain (0: no limit).
  double time_limit_seconds = 0;
  // "STAGE:FACTOR": the first peer of STAGE runs FACTOR times slower (an
  // emulated slow machine, for routing experiments).
  std::string slow_peer;
  // Adds this many seconds per sample to every peer's work (x2.5 for backward),
  // so routing experiments measure the emulated speeds rather than CPU noise.
  double emulated_seconds_per_sample = 0;
  // Seconds between each peer's rebalancing checks (jittered): a peer may move to
  // the bottleneck stage, and an emptied stage is refilled. 0: peers never move.
  double rebalance_period_seconds = 10;
  // `swarm trainer`: join an existing swarm through this DHT node instead of
  // starting one.
  std::string bootstrap;
  // The address this process's DHT node binds (swarm local: loopback).
  std::string host = "127.0.0.1";
  // Swarm secret: CURVE for every connection and sealed registry records; the
  // peers swarm local starts get it through their environment. Empty: plaintext.
  std::string secret;
  // `swarm trainer` in a swarm with an owner: the owner's key (a trainer reads the
  // peers' records; it announces none).
  MembershipOptions membership;
};

// With --time-limit, training stops taking steps at the limit; the microbatches
// then in flight and the validation get this much longer (plus, at worst, one
// call's --forward-timeout or --backward-timeout already under way).
inline constexpr double kTimeLimitGraceSeconds = 20.0;

struct LocalSwarmReport {
  std::string loss_unit = "sample";          // losses are nats per this (a GPT: byte or token)
  std::string validation_unit = "samples";   // what validation_windows counts (a GPT: windows)
  std::string rate_unit = "samples";         // what tokens_per_second counts (a GPT: tokens)
  int steps = 0;
  double seconds = 0;
  double first_loss = 0;
  double last_loss = 0;
  // Over validation_windows_done of validation_windows windows; none when no
  // window could be evaluated. validation_note says why it stopped early.
  std::optional<double> validation_loss;
  size_t validation_windows_done = 0;
  size_t validation_windows = 0;
  std::string validation_note;
  // The loss stage's metrics over the same validation (name, mean); empty if it reports none.
  std::vector<std::pair<std::string, double>> validation_metrics;
  // Why training stopped: "all steps done", "time limit", "interrupted".
  std::string stopped_because;
  double tokens_per_second = 0;
  int64_t microbatches_started = 0;
  int64_t microbatches_completed = 0;
  int64_t microbatches_abandoned = 0;
  int64_t retries = 0;
  // Registry records refused: those the trainers refused (malformed, out of range,
  // another stage) and those the registry node refused to open (unsealed, forged, or
  // in a swarm with an owner uncertified).
  int64_t bad_records = 0;
  std::vector<int64_t> global_steps;  // per stage, the newest its committed membership vouched for
  int64_t replica_mismatches = 0;     // (stage, step) pairs whose replicas' hashes differed
  // (stage, peer, step) progress records ahead of their stage's vouched step that no
  // majority vouched for: shown nowhere, counted here.
  int64_t unvouched_records = 0;
  // Pipeline payloads (all four transfers) and all-reduce payloads: bytes and values.
  int64_t wire_bytes = 0;
  int64_t wire_values = 0;
  int64_t allreduce_bytes = 0;
  int64_t allreduce_values = 0;
  // With --link: bytes each process's emulated link carried (every message,
  // headers included), up and down, by the name it joined under ("trainers", peer ids).
  struct LinkBytes {
    std::string name;
    uint64_t up = 0;
    uint64_t down = 0;
  };
  std::vector<LinkBytes> link_bytes;
  // The codecs the run used (a resumed run: those of its config.json), gradients resolved.
  std::string codec;
  std::string gradient_codec;
};

// Lines for the user: `transient` ones are the live status (apps/live_view.h),
// which an empty transient line ends; the others are events and results.
using LineSink = std::function<void(std::string_view line, bool transient)>;

Result<LocalSwarmReport> run_local_swarm(const LocalSwarmOptions& options, const LineSink& print);

}  // namespace swarm::apps
