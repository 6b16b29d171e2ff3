// sync_harness: the peers of one stage running the production round protocol
// (swarm/averaging/round_protocol.h) on a fake clock, a seeded registry and a
// seeded network, single-threaded, so any run replays exactly from its seed.
//
// Each tick (10 ms of simulated time) the harness delivers the messages due,
// lets each live peer publish its record, read the registry (through its own
// delay and faults), feed on the trainers' samples and tick, and sends what the
// peers put in their outboxes through wire::Frames, decode_message and
// parse_round_message, as a transport would. A peer reads the registry as its
// driver does (swarm/peer/stage_sync.h): records merged into what it knew, its
// own left out, the stale forgotten. Checks ride along: no two live replicas ever
// hold different hashes for one step (a lineage whose every holder died may be
// redone, and is counted), every sample counted once (Ledger), and a digest of
// every event so two runs of a seed compare byte for byte.
//
//   Harness h({.seed = 7, .peers = 3});
//   h.run_for(10);
//   h.kill(2); h.view(1).delay = 3; h.run_for(10);
//   CHECK(h.violations().empty());
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "swarm/averaging/round_protocol.h"
#include "swarm/core/random.h"
#include "tests/sync_harness/sim_network.h"
#include "tests/sync_harness/sim_registry.h"
#include "tests/sync_harness/stub_replica.h"

namespace swarm::sync {

struct HarnessOptions {
  uint64_t seed = 1;
  int peers = 3;
  double tick = 0.01;
  double publish_period = 0.2;
  double record_ttl = 6.0;
  double read_period = 0.2;
  double call_timeout = 1.0;
  double net_delay_min = 0.002, net_delay_max = 0.02;  // one way, per message
  double view_delay_max = 0.1;                         // each reader's initial delay is drawn below it
  double samples_per_second = 100;                     // the trainers' feed, stage-wide
  int max_microbatch = 8;                              // samples per microbatch: 1 to this
  double resync_min = 0.02, resync_max = 0.2;          // a download's duration (after 10-50 ms to pick a donor)
  bool log = false;                                    // every event and message to stderr (a replay's diagnosis)
  RoundsConfig rounds = default_rounds();             // peer_id, address and stage set per peer

  static RoundsConfig default_rounds() {
    RoundsConfig c;
    c.global_batch_samples = 128;  // a step about every 1.3 s: longer than the registry's lag, as in a real stage
    return c;
  }
};

// What the harness saw happen, for the tests' assertions.
struct HarnessStats {
  int64_t fed = 0;                // samples the trainers handed to peers
  int64_t delivered = 0, refused = 0, timeouts = 0, dropped = 0, duplicated = 0;
  int64_t injected = 0, injected_refused = 0;
  int64_t steps_applied = 0;      // apply_step calls, all replicas
  int64_t resyncs_loaded = 0, resyncs_failed = 0;
  int64_t lineages_lost = 0;      // steps redone after every replica holding them died
  int64_t kind[6] = {};           // RoundEvent::Kind counts
};

class Harness {
 public:
  explicit Harness(HarnessOptions options);
  ~Harness();

  void run_until(double t);
  void run_for(double seconds) { run_until(now_ + seconds); }
  double now() const { return now_; }

  // ---- peers ----
  int size() const { return static_cast<int>(peers_.size()); }
  const std::string& id(int i) const;
  const StageRounds& rounds(int i) const;
  const StubReplica& replica(int i) const;
  bool alive(int i) const;
  bool active(int i) const;  // alive and not stopped
  void kill(int i);
  void restart(int i);                  // a fresh process: step 0, must re-sync
  void stop(int i, double seconds);     // SIGSTOP: no ticks; its messages wait
  ReaderFaults& view(int i);            // the peer's registry reads
  std::vector<RoundEvent> events(int i) const;  // every event of its current incarnation

  // ---- faults from outside ----
  int add_fault(const FaultRule& rule) { return network_.add_rule(rule); }
  void clear_faults() { network_.clear_rules(); }
  // A message from no peer of the stage (or posing as one) to peer `to`; its reply goes nowhere.
  void inject(int to, const RoundMessage& message, double delay = 0.005);
  // A record republished every publish period by someone other than the peer it names.
  void forge_record(const ProgressRecord& record);
  void stop_forging() { forged_.clear(); }
  // Peer `i` publishes its records through `lie` (a member that lies about its step, say); none: the truth.
  void tamper_records(int i, std::function<void(ProgressRecord&)> lie);

  // ---- observations ----
  int64_t stage_step() const;  // the newest step any replica reached
  const Lineage& lineage() const { return lineage_; }
  const SimRegistry& registry() const { return registry_; }
  // Every way the checks failed so far (lineage, ledger); empty when all held.
  const std::vector<std::string>& violations() const { return violations_; }
  // Samples fed against pending + in round + stepped + lost over every replica,
  // dead ones included, and each live replica's "in round" against what its
  // protocol reports holding; adds a violation on a mismatch.
  void check_ledger();
  uint64_t digest() const { return digest_; }
  const HarnessStats& stats() const { return stats_; }
  // Global steps the stage first reached within [from, to), per simulated second
  // (a round may count for several; a lost lineage's steps count once).
  double step_rate(double from, double to) const;

 private:
  struct Peer;

  void tick_once();
  void publish_due(Peer& p);
  void read_due(Peer& p);
  void feed();
  void drive(Peer& p);
  void drain(Peer& p);
  void maybe_resync(Peer& p);
  void send(int from, Outgoing out);
  void handle(Flight f);
  void deliver(Flight f);
  void notify_failure(const Flight& f, const Status& why);
  int index_of_address(const std::string& address) const;
  void on_step(int i, int64_t step, uint64_t hash);
  void mix(uint64_t v);
  void mix_text(const std::string& s);
  std::unique_ptr<Peer> make_peer(int i);

  HarnessOptions options_;
  SplitMix64 rng_;
  int64_t tick_ = 0;
  double now_ = 0;
  SimRegistry registry_;
  SimNetwork network_;
  std::vector<std::unique_ptr<Peer>> peers_;
  std::vector<std::unique_ptr<StubReplica>> graveyard_;  // replicas of dead incarnations: their samples still count
  std::vector<ProgressRecord> forged_;
  double next_forge_ = 0;
  Lineage lineage_;
  std::vector<std::string> violations_;
  std::vector<std::pair<double, int64_t>> newest_at_;  // (time, the newest step any replica reached by then)
  HarnessStats stats_;
  uint64_t digest_ = 0x243f6a8885a308d3ull;
};

}  // namespace swarm::sync
