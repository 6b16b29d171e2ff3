#include "apps/program.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "apps/compute_options.h"
#include "apps/live_view.h"
#include "apps/local_swarm.h"
#include "apps/membership_commands.h"
#include "apps/report/run_report.h"
#include "apps/status_command.h"
#include "apps/swarm_roles.h"
#include "swarm/api/codec.h"

namespace swarm::apps {
namespace {

// "8bit", or "4bit activations, 8bit gradients" when the backward's gradients travel in another codec.
std::string wire_codecs_label(const LocalSwarmReport& report) {
  if (report.gradient_codec == report.codec) return report.codec;
  return fmt::format("{} activations, {} gradients", report.codec, report.gradient_codec);
}

// "2.4208 nats/byte", with how many windows and why when validation stopped early.
std::string validation_text(const LocalSwarmReport& report) {
  const std::string& unit = report.loss_unit;
  if (!report.validation_loss) return fmt::format("- (none: {})", report.validation_note);
  std::string text = fmt::format("{:.4f} nats/{}", *report.validation_loss, unit);
  for (const auto& [name, value] : report.validation_metrics) text += fmt::format(", {} {:.4f}", name, value);
  if (report.validation_note.empty()) return text;
  return fmt::format("{} over {} of {} {} ({})", text, report.validation_windows_done, report.validation_windows,
                     report.validation_unit, report.validation_note);
}

int run_swarm(const LocalSwarmOptions& options, const char* name) {
  install_stop_signals();
  // The status block in a terminal, bounded plain lines elsewhere (apps/live_view.h).
  LiveView view({.terminal = ::isatty(STDOUT_FILENO) == 1});
  const auto started = std::chrono::steady_clock::now();
  std::mutex print_mu;  // the training loop and the chaos runner print from their threads
  auto write = [](const std::string& text) {
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
  };
  auto print = [&](std::string_view line, bool transient) {
    std::lock_guard lock(print_mu);
    const double now = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (transient && line.empty()) {
      write(view.finish());
    } else {
      write(transient ? view.status(line, now) : view.event(line, now));
    }
  };
  auto report = run_local_swarm(options, print);
  {
    std::lock_guard lock(print_mu);
    write(view.finish());
  }
  if (!report.is_ok()) {
    fmt::print(stderr, "swarm {}: {}\n", name, report.status().to_string());
    return 1;
  }
  fmt::print("done: {} steps in {:.0f} s, stopped by: {} | train loss {:.4f} -> {:.4f} | validation loss {} | "
             "{:.0f} {}/s\n",
             report->steps, report->seconds, report->stopped_because, report->first_loss, report->last_loss,
             validation_text(*report), report->tokens_per_second, report->rate_unit);
  fmt::print("stages: global steps {} | replicas with differing parameter hashes: {} (stage, step) pairs | "
             "unvouched progress records refused: {}\n",
             fmt::join(report->global_steps, ","), report->replica_mismatches, report->unvouched_records);
  fmt::print("ledger: {} microbatches started, {} completed, {} abandoned, {} retries | {} registry records refused "
             "| run directory: {}\n",
             report->microbatches_started, report->microbatches_completed, report->microbatches_abandoned,
             report->retries, report->bad_records, options.run_dir);
  auto per_value = [](int64_t bytes, int64_t values) { return values > 0 ? double(bytes) / double(values) : 0.0; };
  fmt::print("wire ({}): pipeline {:.4f} bytes/value ({} values) | all-reduce {:.4f} bytes/value ({} values)\n",
             wire_codecs_label(*report), per_value(report->wire_bytes, report->wire_values), report->wire_values,
             per_value(report->allreduce_bytes, report->allreduce_values), report->allreduce_values);
  // Per completed microbatch, validation's included, so hub and peer-to-peer runs compare.
  const double microbatches = static_cast<double>(std::max<int64_t>(report->microbatches_completed, 1));
  for (const auto& link : report->link_bytes) {
    fmt::print("link of {} (--link {}): {:.0f} bytes up, {:.0f} down per completed microbatch\n", link.name,
               options.link, static_cast<double>(link.up) / microbatches, static_cast<double>(link.down) / microbatches);
  }
  // The summary stands either way; a run that could evaluate no validation window failed.
  return report->validation_loss ? 0 : 1;
}

void add_secret_option(CLI::App* command, std::string* secret) {
  command->add_option("--secret", *secret,
                      "Swarm secret: CURVE on every connection, sealed registry records (default: $SWARM_SECRET; "
                      "empty: plaintext)");
}

// How long a peer's compute waits for its stage's rounds (swarm local passes them to every peer).
void add_wait_options(CLI::App* command, double* round_wait, double* forward_hold) {
  command->add_option("--forward-hold", *forward_hold,
                      "With global steps, seconds a forward that arrives while gradients wait for a round here waits for a round to take them, so it runs on the weights that round produces (0: never)")
      ->check(CLI::Range(0.0, 60.0))
      ->capture_default_str();
  command->add_option("--round-wait", *round_wait,
                      "Seconds a forward or backward that arrives during its stage's all-reduce round waits for the round's step, so its gradient is taken at the weights it is applied to (0: never)")
      ->check(CLI::Range(0.0, 60.0))
      ->capture_default_str();
}

// The empty default sends gradients in the --codec.
void add_codec_options(CLI::App* command, std::string* codec, std::string* gradient_codec) {
  command->add_option("--codec", *codec, "Codec of activations and all-reduce parts (and of gradients by default)")
      ->check(CLI::IsMember(swarm::all_codec_names()))
      ->capture_default_str();
  std::vector<std::string> gradient_choices = swarm::all_codec_names();
  gradient_choices.emplace_back();
  command->add_option("--gradient-codec", *gradient_codec,
                      "Codec of the backward's output and input gradients (default: the --codec)")
      ->check(CLI::IsMember(gradient_choices));
}

void add_host_option(CLI::App* command, std::string* host) {
  command->add_option("--host", *host, "IPv4 address this role binds and announces")
      ->check(CLI::ValidIPV4)
      ->capture_default_str();
}

void add_swarm_options(CLI::App* command, LocalSwarmOptions* o) {
  command->add_option("--run-dir", o->run_dir, "Where config.json, metrics.jsonl and peer logs go")
      ->capture_default_str();
  command->add_option("--stages", o->stages, "Pipeline stages")->capture_default_str();
  add_codec_options(command, &o->codec, &o->gradient_codec);
  command->add_option("--trainers", o->trainers, "Trainers (threads of this process)")->capture_default_str();
  command->add_option("--steps", o->steps, "Steps; a step is --microbatches-per-step microbatches per trainer")
      ->capture_default_str();
  command->add_option("--seed", o->seed, "Seed for weights, data order and routing")->capture_default_str();
  command->add_option("--microbatch", o->microbatch, "Sequences per microbatch")->capture_default_str();
  command->add_option("--microbatches-per-step", o->microbatches_per_step, "Microbatches per step and trainer")
      ->capture_default_str();
  command->add_option("--in-flight", o->in_flight, "Microbatches each trainer keeps in flight")
      ->capture_default_str();
  command->add_option("--eval-windows", o->eval_windows,
                      "Validation samples evaluated at the end (a GPT's: windows of --seq-len tokens)")
      ->capture_default_str();
  command->add_option("--eval-every", o->eval_every,
                      "Also validate after every this many steps, training paused meanwhile (\"validation\" "
                      "records in metrics.jsonl); 0: only at the end")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  command->add_option("--forward-timeout", o->forward_timeout_seconds, "Seconds before a forward hop is retried")
      ->capture_default_str();
  command->add_option("--backward-timeout", o->backward_timeout_seconds, "Seconds before a backward hop is retried")
      ->capture_default_str();
  command->add_option("--time-limit", o->time_limit_seconds, "Stop training after this many seconds (0: none)")
      ->capture_default_str();
  command->add_option("--link", o->link,
                      "Put every process behind an emulated link of its own, shared by all its traffic (the trainers "
                      "of one process share one): RATE,LATENCY in tc's units (\"200mbit,50ms\"; 0 for either is "
                      "none)");
  command->add_option("--hop-slots", o->hop_slots,
                      "With --hops p2p: pipelines from peers each peer takes at once (swarm peer --hop-slots)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  command->add_option("--hops", o->hops,
                      "hub: every pipeline message goes through the trainer; p2p: the trainer sends tokens and "
                      "targets to stage 0, and each peer passes the microbatch on to a peer of the next stage "
                      "itself (the peers must run with --p2p; swarm local starts them so)")
      ->capture_default_str();
  add_secret_option(command, &o->secret);
}

}  // namespace

void add_compute_options(CLI::App* command, ComputeOptions* compute) {
  command->add_option("--device", compute->device, "Where the stages compute: cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  command->add_option("--precision", compute->precision,
                      "Activations and compute weights: fp32 or bf16 (masters stay fp32; default: fp32 on cpu, "
                      "bf16 on cuda)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  command->add_option("--attention", compute->attention, "Attention kernel on cuda: flash or cudnn (bf16 only)")
      ->check(CLI::IsMember({"flash", "cudnn"}))
      ->capture_default_str();
}

int run_program(int argc, char** argv, ModelPluginFactory make_model, const std::string& description,
                const ExtraCommands& extra) {
  // Under `bazel run` the program starts in its runfiles tree; relative paths
  // (--run-dir, --data, checkpoints) mean the user's directory.
  if (const char* user_directory = std::getenv("BUILD_WORKING_DIRECTORY")) {
    if (::chdir(user_directory) != 0) fmt::print(stderr, "swarm: cannot enter {}\n", user_directory);
  }
  CLI::App app{description};
  app.require_subcommand(1);
  // One model per command: each command's flags fill its own options.
  const std::unique_ptr<ModelPlugin> local_model = make_model(), trainer_model = make_model(),
                                     peer_model = make_model();

  std::string report_dir;
  CLI::App* report_cmd = app.add_subcommand(
      "report", "Write RUN_DIR/report.html (plots, ledger, config) for a swarm local run directory, also a crashed one");
  report_cmd->add_option("run_dir", report_dir, "A swarm local run directory")->required();

  LocalSwarmOptions local;
  CLI::App* local_cmd = app.add_subcommand(
      "local", "The main job: a whole swarm on this machine (OpenDHT registry, peer processes over ZeroMQ, trainers)");
  add_swarm_options(local_cmd, &local);
  local_model->add_options(*local_cmd);
  local.model = local_model.get();
  add_compute_options(local_cmd, &local.compute);
  local_cmd->add_option("--peers-per-stage", local.peers_per_stage, "Peer processes per stage")->capture_default_str();
  local_cmd->add_flag("--certified", local.certified,
                      "With --secret: the run is the swarm's owner (keys in RUN_DIR/keys) and admits each peer it "
                      "starts; only their records count");
  local_cmd->add_option("--lr", local.learning_rate, "Peak learning rate of the stages' LAMB steps")
      ->capture_default_str();
  local_cmd->add_option("--warmup", local.warmup_steps, "Global steps of lr warm-up")->capture_default_str();
  local_cmd->add_option("--global-batch", local.global_batch,
                        "Samples per global step: peers of a stage average gradients and step together "
                        "(-1: microbatch x microbatches-per-step x trainers; 0: solo mode, no averaging)")
      ->capture_default_str();
  add_wait_options(local_cmd, &local.round_wait_seconds, &local.forward_hold_seconds);
  local_cmd->add_option("--step-every", local.step_every_samples,
                        "Solo mode only (--global-batch 0): samples between a peer's local optimizer steps")
      ->capture_default_str();
  local_cmd->add_option("--checkpoint-every", local.checkpoint_every,
                        "Global steps between stage checkpoints in RUN_DIR/checkpoints (0: none)")
      ->capture_default_str();
  local_cmd->add_option("--resume", local.resume,
                        "Continue the run in this directory from its last checkpoints, up to --steps");
  local_cmd->add_option("--max-batch", local.max_batch, "Peers run up to this many concurrent forwards as one batch")
      ->capture_default_str();
  local_cmd->add_option("--emulated-cost", local.emulated_seconds_per_sample,
                        "Extra seconds per sample on every peer (routing experiments)")
      ->capture_default_str();
  local_cmd->add_option("--rebalance-period", local.rebalance_period_seconds,
                        "Seconds between each peer's checks whether to move to the bottleneck stage (0: never move)")
      ->capture_default_str();
  local_cmd->add_option("--slow-peer", local.slow_peer,
                        "STAGE:FACTOR: the first peer of STAGE runs FACTOR times slower (routing experiments)");
  local_cmd->add_option("--chaos", local.chaos,
                        "Scheduled faults, comma-separated: kill-peer:STAGE:AT_SECONDS, "
                        "stop-peer:STAGE:AT_SECONDS:FOR_SECONDS (SIGSTOP then SIGCONT), restart-peer:STAGE:AT_SECONDS");

  LocalSwarmOptions trainer_options;
  CLI::App* trainer_cmd = app.add_subcommand("trainer", "Train through an existing swarm (found via --bootstrap)");
  add_swarm_options(trainer_cmd, &trainer_options);
  trainer_model->add_options(*trainer_cmd);
  trainer_options.model = trainer_model.get();
  trainer_cmd->add_option("--bootstrap", trainer_options.bootstrap, "HOST:PORT of a DHT node of the swarm")->required();
  add_host_option(trainer_cmd, &trainer_options.host);
  // A swarm with an owner: its key (route only to the peers it certified), and this
  // trainer's identity and trainer certificate (peers serve certified callers only).
  add_membership_options(trainer_cmd, &trainer_options.membership);

  uint16_t bootstrap_port = 0;
  std::string bootstrap_host = "127.0.0.1", bootstrap_secret;
  CLI::App* bootstrap_cmd = app.add_subcommand("bootstrap", "Run a registry (OpenDHT) node that others bootstrap from");
  bootstrap_cmd->add_option("--port", bootstrap_port, "UDP port (0: any free port)")->capture_default_str();
  add_host_option(bootstrap_cmd, &bootstrap_host);
  add_secret_option(bootstrap_cmd, &bootstrap_secret);

  PeerRoleOptions peer;
  CLI::App* peer_cmd = app.add_subcommand("peer", "Serve one stage of the model to the swarm");
  peer_cmd->add_option("--stage", peer.stage, "The stage this peer starts on (default: the one the swarm needs most)");
  peer_cmd->add_option("--rebalance-period", peer.rebalance_period_seconds,
                       "Seconds between checks whether this peer should move to the bottleneck stage (0: never move)")
      ->capture_default_str();
  peer_cmd->add_option("--stages", peer.num_stages, "Stages in the pipeline")->capture_default_str();
  peer_cmd->add_option("--peer-id", peer.peer_id, "Name in the registry (default: stageN-PID)");
  peer_cmd->add_option("--bootstrap", peer.bootstrap, "HOST:PORT of a DHT node")->required();
  add_host_option(peer_cmd, &peer.host);
  peer_cmd->add_option("--bind", peer.bind, "ZeroMQ endpoint to serve on (default: tcp://HOST:*)");
  peer_cmd->add_flag("--p2p", peer.peer_to_peer,
                     "Pass pipeline requests on to a peer of the next stage (trainers with --hops p2p send them)");
  peer_cmd->add_option("--backward-timeout", peer.backward_timeout_seconds,
                       "With --p2p: seconds a pipeline passed on may take per stage after this one before it is "
                       "retried at another peer")
      ->capture_default_str();
  peer_cmd->add_option("--hop-slots", peer.hop_slots,
                       "With --p2p: pipelines from peers of the stage before in progress here at once; one more is "
                       "answered busy at once and its sender tries a stage-mate")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  peer_cmd->add_option("--link", peer.link,
                       "Put this peer behind an emulated link of its own, shared by all its traffic: RATE,LATENCY "
                       "in tc's units (\"200mbit,50ms\"; 0 for either is none)");
  peer_cmd->add_option("--link-board", peer.link_board,
                       "The file the emulated links of one run share (swarm local passes it); default: this "
                       "peer's link alone");
  peer_model->add_options(*peer_cmd);
  peer_cmd->add_option("--model-options", peer.model_options,
                       "The model's options as JSON, as swarm local passes them (they override its flags)");
  add_compute_options(peer_cmd, &peer.compute);
  peer_cmd->add_option("--seed", peer.seed, "Seed of the initial weights (same for a stage's peers)")
      ->capture_default_str();
  peer_cmd->add_option("--lr", peer.learning_rate, "Learning rate")->capture_default_str();
  peer_cmd->add_option("--warmup", peer.warmup_steps, "Warm-up optimizer steps")->capture_default_str();
  add_wait_options(peer_cmd, &peer.round_wait_seconds, &peer.forward_hold_seconds);
  peer_cmd->add_option("--step-every", peer.step_every_samples, "Samples between optimizer steps")
      ->capture_default_str();
  peer_cmd->add_option("--max-batch", peer.max_batch, "Run up to this many concurrent forwards as one batch")
      ->capture_default_str();
  add_codec_options(peer_cmd, &peer.codec, &peer.gradient_codec);
  peer_cmd->add_option("--slowdown", peer.slowdown, "Emulate a slower machine (2 = twice as slow)")
      ->capture_default_str();
  peer_cmd->add_option("--emulated-cost", peer.emulated_seconds_per_sample,
                       "Extra seconds per sample of work (emulated compute)")
      ->capture_default_str();
  peer_cmd->add_option("--threads", peer.threads, "CPU threads")->capture_default_str();
  add_secret_option(peer_cmd, &peer.secret);
  add_membership_options(peer_cmd, &peer.membership);
  peer_cmd->add_option("--global-batch", peer.global_batch_samples,
                       "Samples per global step of the stage: peers average gradients and take one LAMB step "
                       "together (0: solo mode, a local AdamW step every --step-every samples)")
      ->capture_default_str();
  peer_cmd->add_option("--total-steps", peer.total_steps, "Global steps of the lr decay (0: constant after warm-up)")
      ->capture_default_str();
  peer_cmd->add_option("--checkpoint", peer.checkpoint_path,
                       "Stage checkpoint file (written by one replica); {stage} in it becomes the stage's index");
  peer_cmd->add_option("--checkpoint-every", peer.checkpoint_every_steps, "Global steps between checkpoints")
      ->capture_default_str();
  peer_cmd->add_option("--resume-from", peer.resume_from, "Start from this stage checkpoint");
  peer_cmd->add_option("--allreduce-part-timeout", peer.all_reduce_part_timeout_seconds,
                       "Seconds to wait for each phase's parts of an all-reduce")
      ->capture_default_str();
  peer_cmd->add_option("--allreduce-round-timeout", peer.all_reduce_round_timeout_seconds,
                       "Seconds an all-reduce round may take, all attempts together")
      ->capture_default_str();
  peer_cmd->add_option("--test-die-in-allreduce", peer.test_die_in_allreduce_after,
                       "Test hook: SIGKILL this process after sending this many all-reduce parts");
  peer_cmd->add_option("--test-die-after-state-chunks", peer.test_die_after_state_chunks,
                       "Test hook: SIGKILL this process after serving this many state chunks");
  peer_cmd->add_option("--test-contribution-scale", peer.test_contribution_scale,
                       "Attack tests: this peer plays a Byzantine stage-mate, its gradient contributions to rounds "
                       "multiplied by this (100 scales them up, -1 flips their sign)");
  peer_cmd->add_option("--test-contribution-scale-from", peer.test_contribution_scale_from_step,
                       "Attack tests: the global step from which --test-contribution-scale applies")
      ->capture_default_str();
  peer_cmd->add_option("--test-forge-reduced-part-from", peer.test_forge_reduced_part_from,
                       "Attack tests: from this global step on, this peer also hands each mate of a round of three or "
                       "more a forged reduced part");

  int status_exit_code = 0;
  add_status_command(app, &status_exit_code);
  int keygen_exit_code = 0;
  add_keygen_command(app, &keygen_exit_code);
  int admit_exit_code = 0;
  add_admit_command(app, &admit_exit_code);
  if (extra.add) extra.add(app);

  CLI11_PARSE(app, argc, argv);
  if (app.got_subcommand("status")) return status_exit_code;
  if (app.got_subcommand("keygen")) return keygen_exit_code;
  if (app.got_subcommand("admit")) return admit_exit_code;
  if (*local_cmd) return run_swarm(local, "local");
  if (*trainer_cmd) return run_swarm(trainer_options, "trainer");
  if (*bootstrap_cmd) return run_bootstrap(bootstrap_host, bootstrap_port, bootstrap_secret);
  if (*peer_cmd) return run_peer(peer, *peer_model);
  if (*report_cmd) return report_command(report_dir);
  if (extra.run) {
    if (std::optional<int> status = extra.run(app)) return *status;
  }
  return 1;
}

}  // namespace swarm::apps
