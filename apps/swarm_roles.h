// swarm_roles: the long-running roles of the `swarm` program on a real network:
// a DHT bootstrap node and a peer serving a stage of the model, both until SIGINT
// or SIGTERM.
//
//   swarm bootstrap --port 31337
//   swarm peer --stage 1 --stages 2 --bootstrap 127.0.0.1:31337
#pragma once

#include <cstdint>
#include <string>

#include "apps/compute_options.h"
#include "apps/swarm_access.h"
#include "swarm/api/codec.h"
#include "swarm/core/status.h"

namespace swarm::apps {

// Set by SIGINT/SIGTERM once install_stop_signals() has run.
void install_stop_signals();
bool stop_requested();
// Waits until a stop signal arrives or `seconds` pass; true if a signal arrived.
bool wait_for_stop(double seconds);

// The codecs a role's --codec and --gradient-codec name: activations (and
// all-reduce parts), and the backward's gradients, which an empty
// --gradient-codec sends in the --codec.
struct WireCodecs {
  CodecId activations = CodecId::blockwise8;
  CodecId gradients = CodecId::blockwise8;
};
// The name of the gradients' codec: gradient_codec, or codec when that is empty.
std::string gradient_codec_name(const std::string& codec, const std::string& gradient_codec);
// invalid_argument names the flag and the choices.
Result<WireCodecs> parse_wire_codecs(const std::string& codec, const std::string& gradient_codec);

// A DHT node on HOST:PORT (PORT 0: any free port); with a secret it stores and
// serves only records sealed by members.
int run_bootstrap(const std::string& host, uint16_t port, const std::string& secret);

struct PeerRoleOptions {
  // The model's options as JSON (ModelPlugin::options_json), as `swarm local`
  // passes them; empty: the model's own flags.
  std::string model_options;
  ComputeOptions compute;  // --device, --precision, --attention
  int stage = -1;  // -1: the stage the swarm needs most when it starts
  int num_stages = 2;
  bool peer_to_peer = false;  // --hops p2p: pass pipelines on to the next stage's peers
  double backward_timeout_seconds = 20;  // a pipeline hop: this per stage after this one
  int hop_slots = 64;                    // --hop-slots: pipelines from peers in progress at once
  std::string link;        // RATE,LATENCY: this process's emulated access link; empty: none
  std::string link_board;  // the board the run's processes share; empty: a link of this process alone
  // Seconds between rebalancing checks (jittered); 0: serve one stage for ever.
  double rebalance_period_seconds = 300;
  std::string peer_id;
  std::string bootstrap;  // host:port of a DHT node
  std::string host = "127.0.0.1";  // the DHT node and the servers bind it; others dial it
  std::string bind;                 // ZeroMQ endpoint; empty: tcp://HOST:* (any free port)
  uint64_t seed = 1;
  float learning_rate = 1e-3f;  // the SWARM paper's peak LAMB lr
  int warmup_steps = 20;
  int step_every_samples = 16;
  double round_wait_seconds = 0.25;  // see PeerConfig::compute_waits_for_round_seconds
  double forward_hold_seconds = 0.02;  // see PeerConfig::forward_waits_for_pending_seconds
  int max_batch = 1;
  std::string codec = "8bit";  // activations and all-reduce parts
  std::string gradient_codec;  // the backward's gradients; empty: codec
  double slowdown = 1.0;
  double emulated_seconds_per_sample = 0;
  double announce_period_seconds = 1.0;
  double announce_ttl_seconds = 4.0;
  int threads = 1;
  std::string secret;  // swarm secret (else SWARM_SECRET); empty = plaintext
  MembershipOptions membership;  // a swarm with an owner: its key, this peer's identity and certificate
  // Stage synchronization (0: solo mode, a local step every step_every_samples).
  int64_t global_batch_samples = 0;
  int64_t total_steps = 0;            // lr decay horizon; 0: constant after warm-up
  std::string checkpoint_path;        // the stage's checkpoint (written by one replica); {stage}: its index
  int64_t checkpoint_every_steps = 0;
  std::string resume_from;
  double all_reduce_part_timeout_seconds = 2.0;
  double all_reduce_round_timeout_seconds = 20.0;
  // Fault injection for tests: SIGKILL this process mid-all-reduce after this many
  // parts sent, or after serving this many state chunks (0: never).
  int64_t test_die_in_allreduce_after = 0;
  int64_t test_die_after_state_chunks = 0;
  float test_contribution_scale = 1.0f;
  int64_t test_contribution_scale_from_step = 0;
  int64_t test_forge_reduced_part_from = -1;
};

class ModelPlugin;
int run_peer(const PeerRoleOptions& options, ModelPlugin& model);

}  // namespace swarm::apps
