// run_report: RUN_DIR/report.html, one self-contained page (inline SVG, no script,
// nothing loaded from the network) that shows a `swarm local` run from what its
// directory holds: config.json, metrics.jsonl and the checkpoints. Plots: loss
// against time and tokens, tokens/s, peers per stage, each stage's global step,
// retries/bans/timeouts/abandoned microbatches, wire bytes per token, with chaos,
// peer and rebalancing events marked on the time axes; tables: the ledger, the
// replicas' hash agreement, the final validation loss, the checkpoints, the config.
//
// It reads whatever the run has written so far: a run still going (the page then
// reloads itself every 15 s), one that crashed before its final records, a
// truncated last line, a resumed run (its later records' clock restarts at 0).
//
//   SWARM_RETURN_IF_ERROR(swarm::apps::write_run_report("swarm-run"));  // swarm-run/report.html
//
// The pure parts, for tests: parse_metrics (text -> records), build_timeline
// (records -> series), render_report_html (records -> page).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "swarm/core/status.h"

namespace swarm::apps {

struct CheckpointFile {
  std::string path;  // as found under RUN_DIR/checkpoints
  int64_t bytes = 0;
};

// What a run directory holds, as read: nothing derived yet.
struct RunRecords {
  std::string run_dir;
  std::string written_at;                   // when the records were read (local time), for the page
  nlohmann::json config;                    // config.json's object; null when it is missing or unreadable
  std::string config_problem;               // why config is null
  std::vector<nlohmann::json> records;      // metrics.jsonl's objects with a string "kind" and a numeric "time"
  int64_t skipped_lines = 0;                // complete lines that were not such an object
  bool last_line_partial = false;           // the file ends inside a line that does not parse (a crash mid-write)
  std::vector<CheckpointFile> checkpoints;  // RUN_DIR/checkpoints/*.ckpt, by name
};

// Appends metrics.jsonl's text to run->records. Never fails: what does not parse is counted.
void parse_metrics(std::string_view text, RunRecords* run);

// RUN_DIR's records; not_found when RUN_DIR or RUN_DIR/metrics.jsonl is missing.
// A missing or malformed config.json is noted in the records, not an error.
Result<RunRecords> read_run_records(const std::string& run_dir);

using ChartPoints = std::vector<std::pair<double, double>>;

// An event record, on the run's time axis.
struct RunEvent {
  double time = 0;
  std::string event;  // as recorded: peer_joined, peer_lost, peer_moved, chaos_kill-peer, banned, ...
  std::string peer;
  int stage = -1;     // peer_moved: the stage it moved to
  int from_stage = -1;  // peer_moved only
  std::string detail;
};

// The series and totals the page shows, derived from the records alone. Times are
// seconds since the run began; a resumed run's later segments follow the earlier
// ones (their clock restarts at 0 in the file), and their cumulative counters
// (samples, retries, abandoned, wire bytes) continue from the earlier totals.
struct RunTimeline {
  int stages = 0;             // config.json's, or one past the highest stage recorded
  int tokens_per_sample = 0;  // config.json's model.max_seq_len; 0: unknown (token axes then count samples)
  // config.json's units: losses are nats per loss_unit, rates count rate_unit per second
  // (a GPT without them: per GPT-2 token with gpt2_tokens, else per byte; tokens).
  std::string loss_unit = "byte";
  std::string rate_unit = "tokens";
  int segments = 0;           // 1 + the times the run was resumed; 0 when nothing was recorded
  double end_time = 0;        // the last record's time
  ChartPoints loss_by_time, loss_by_tokens;  // a step without a completed microbatch (loss null) is NaN
  ChartPoints validation_by_time, validation_by_tokens;
  ChartPoints tokens_per_second;
  std::vector<ChartPoints> peers_per_stage;  // a staircase, from peer_joined, peer_lost and peer_moved events
  std::vector<ChartPoints> global_step;      // per stage, the newest vouched step of its global_step records
  ChartPoints retries, abandoned;            // the step records' ledger totals
  ChartPoints bans, timeouts;                // counts of banned and timed_out events, a staircase
  ChartPoints pipeline_bytes_per_token, allreduce_bytes_per_token;  // cumulative bytes over cumulative tokens
  std::vector<RunEvent> events;
  std::optional<nlohmann::json> last_step;   // the last step record: the final one when the run finished
  bool finished = false;                     // the last step record is the run's final one (with validation_loss)
  // The loss stage's metrics (accuracy, say): each step's, by name, and the final
  // validation's. At most kMaxMetrics names, each a short [a-z0-9_] word.
  std::map<std::string, ChartPoints> metrics_by_time;
  std::map<std::string, double> validation_metrics;
  std::optional<double> validation_loss;     // the last recorded
  int64_t hashed_steps = 0;                  // (stage, global step) pairs with a replica hash
  int64_t shared_steps = 0;                  // of them, those 2+ replicas hashed
  std::vector<std::pair<int, int64_t>> mismatched_steps;  // (stage, step) whose replicas' hashes differ
  std::map<int, nlohmann::json> stage_samples;            // per stage, its last sample ledger record
  std::map<std::pair<std::string, int>, nlohmann::json> peer_samples;  // per (peer, stage), the last one
  std::map<std::string, nlohmann::json> peers;            // per peer, its last peer record
  std::map<std::string, int64_t> unknown_kinds;           // records of kinds the page does not show
};

RunTimeline build_timeline(const RunRecords& run);

// The whole page. Every text from the records is HTML-escaped.
std::string render_report_html(const RunRecords& run);

// RUN_DIR/report.html.
std::string run_report_path(const std::string& run_dir);

// Reads RUN_DIR and writes RUN_DIR/report.html atomically (a temporary file in
// RUN_DIR, then a rename): a browser never sees half a page.
Status write_run_report(const std::string& run_dir);

// `swarm report RUN_DIR`: writes the report and prints its path; 1 with a message on error.
int report_command(const std::string& run_dir);

}  // namespace swarm::apps
