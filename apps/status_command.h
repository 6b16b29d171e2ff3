// status_command: `swarm status --bootstrap HOST:PORT`, a look at a running swarm
// from outside. It joins the swarm's DHT as one more node (announcing nothing),
// reads every stage's peer announcements and progress records, and prints the
// stages, the peers (address, throughput, queue, global step, parameter hash) and
// what it refused; `--json` prints the same as one JSON object.
//
// Two parts: summarize() and the renderers are pure (records in, text out), so
// they are tested without a network; run_status() is the DHT part.
//
//   RegistryRead read;                      // raw records, per stage key
//   SwarmStatus status = summarize(read);   // every record checked; refusals counted
//   fmt::print("{}", status_text(status));
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "swarm/api/registry.h"
#include "swarm/core/status.h"

namespace swarm::apps {

// What was read from the registry: the records under each stage's two keys,
// stage_registry_key(s) and progress_registry_key(s), for s = 0 .. size-1.
struct RegistryRead {
  std::string bootstrap;  // as given, for the report
  bool secured = false;   // read with the swarm's secret (records opened by the DHT node)
  double now = 0;         // the registry's clock when read (wall-clock seconds)
  std::vector<std::vector<Record>> announcements;  // [stage]
  std::vector<std::vector<Record>> progress;       // [stage]
  // Counted by the DHT node itself, which neither stores nor returns these.
  uint64_t refused_seals = 0;
  uint64_t untimely_records = 0;
};

// A peer's progress record: where its replica's parameters are.
struct PeerProgress {
  int64_t step = 0;           // global steps applied
  uint64_t params_hash = 0;   // content hash of its parameters at `step`
  int64_t samples = 0;        // accumulated toward step + 1
  double samples_per_second = 0;
  bool averaging = false;     // in the all-reduce round that ends `step`
  double age_seconds = 0;     // since it was published
};

struct PeerStatus {
  std::string peer_id;
  std::string address;
  int stage = 0;
  double throughput = 0;  // samples/s, as announced
  int64_t queue_length = 0;
  bool serving = true;    // false while it downloads its stage's state
  std::string device;
  double expires_in_seconds = 0;          // its announcement, unless refreshed
  std::optional<PeerProgress> progress;   // none: no (valid) progress record at its stage
};

struct StageStatus {
  int stage = 0;
  int peers = 0;
  int serving = 0;
  double throughput = 0;               // announced, summed over its serving peers
  // The newest step its peers would trust (observed_stage_step): vouched by a strict
  // majority of its committed membership. None when no step is vouched.
  std::optional<int64_t> global_step;
  std::optional<int64_t> lowest_step;   // of its peers' steps: a replica left behind shows here
  std::optional<int64_t> highest_step;  // of its peers' steps, refused records left out
  // Whether the peers at global_step (without one, at highest_step) published one
  // parameter hash; none when fewer than two peers are at it.
  std::optional<bool> hashes_agree;
};

// A record that failed its checks: the key it sat under, its subkey, and why.
struct RefusedRecord {
  std::string key;
  std::string subkey;
  std::string reason;
  bool sealed = false;  // it looks like a sealed record that this node could not open
};

struct SwarmStatus {
  std::string bootstrap;
  bool secured = false;
  double read_at = 0;
  std::vector<StageStatus> stages;  // 0 .. stages-1, empty stages included
  std::vector<PeerStatus> peers;    // by stage, then id
  // Valid progress records of no peer announced at that stage (and not marked
  // departed): a peer whose announcement expired or has not arrived yet.
  int64_t unmatched_progress = 0;
  std::vector<RefusedRecord> refused;
  uint64_t refused_seals = 0;
  uint64_t untimely_records = 0;
};

// Every record checked with the shared parsers (PeerAnnouncementRecord::from_json,
// ProgressRecord::from_json) and more: its body must name the peer its subkey
// names and the stage its key names, and a progress record must not be from more
// than 60 s in the future, nor ahead of the step its stage's committed membership
// vouches for (refused as "unvouched", as peers refuse it). Expired records are
// dropped (neither shown nor refused); of several announcements of one peer (it
// moved) the newest counts.
SwarmStatus summarize(const RegistryRead& read);

// Readable lines; text from records is printed with control bytes escaped.
std::string status_text(const SwarmStatus& status);
// One JSON object; its fields are documented in status_command.cc and docs/RUNNING.md.
nlohmann::json status_json(const SwarmStatus& status);
// status_json as text, invalid UTF-8 (possible in subkeys) replaced.
std::string status_json_text(const SwarmStatus& status);

// Why the swarm's records could not be read, like `swarm trainer` says it: sealed
// records read without the secret, or every record refused with it. Ok otherwise.
Status check_readable(const SwarmStatus& status);

struct StatusOptions {
  std::string bootstrap;           // HOST:PORT of any DHT node of the swarm
  std::string host = "127.0.0.1";  // the address this node binds
  std::string secret;              // empty: $SWARM_SECRET, then plaintext
  std::string owner_key;           // empty: $SWARM_OWNER_KEY, then none
  int stages = 0;                  // stage keys to read; 0: discover
  bool json = false;
  double wait_seconds = 10;        // to reach the DHT and see the swarm
};

// Stage discovery without --stages: keys 0, 1, ... are read (four stages at a
// time) until two stages in a row hold no record at all, at most this many. The
// stages shown end at the last one holding a record; an emptied stage between
// served ones shows as "no peer" (two in a row hide the stages after them: pass
// --stages). No record carries the number of stages.
inline constexpr int kMaxDiscoveredStages = 64;

// Joins the DHT, reads until the view is stable (two complete reads in a row, every
// lookup answered, show the same peers at the same stages, with and without
// progress records) or the wait is over, prints, and returns the exit code: 0
// with at least one peer, 1 with an error on stderr (a malformed or unreachable
// bootstrap, no peer within the wait, records that cannot be opened).
int run_status(const StatusOptions& options);

// Adds the `status` subcommand; when it runs, *exit_code receives run_status's result.
void add_status_command(CLI::App& app, int* exit_code);

}  // namespace swarm::apps
