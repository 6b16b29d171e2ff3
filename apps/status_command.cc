#include "apps/status_command.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <thread>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "apps/swarm_access.h"
#include "swarm/averaging/averaging_messages.h"
#include "swarm/averaging/progress.h"
#include "swarm/averaging/stage_view.h"
#include "swarm/protocol/records.h"
#include "swarm/registry/dht_registry.h"

namespace swarm::apps {
namespace {

// A progress record published further ahead than this is refused, as peers refuse it.
constexpr double kMaxClockSkewSeconds = 60.0;
// What one refusal's reason may hold (a parser's message can quote a stranger's text).
constexpr size_t kMaxReasonChars = 300;
// Text output: at most this many characters of a stranger's field, and refusals listed.
constexpr size_t kMaxFieldChars = 64;
constexpr size_t kMaxRefusalsListed = 20;
constexpr const char* kTrainersNote = "trainers publish no records in the registry";

// Printable ASCII as is; every other byte as \xNN, so a record cannot drive the terminal.
std::string printable(const std::string& text, size_t max_chars) {
  std::string out;
  for (unsigned char c : text) {
    if (out.size() >= max_chars) {
      out += "...";
      break;
    }
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  return out;
}

std::string bounded(std::string text) {
  if (text.size() > kMaxReasonChars) {
    text.resize(kMaxReasonChars);
    text += "...";
  }
  return text;
}

// A sealed record that this node could not open: a JSON object with a "signature".
bool looks_sealed(const std::string& value) {
  const auto j = nlohmann::json::parse(value, nullptr, false);
  return !j.is_discarded() && j.is_object() && j.contains("signature");
}

using ProgressByPeer = std::map<std::pair<int, std::string>, ProgressRecord>;  // by (stage, peer)

// Each stage's global step as its peers would trust it (observed_stage_step); the
// records ahead of it, which nobody vouches for, leave `progress` and are refused,
// so one forged record can neither be the stage's step nor a peer's.
std::vector<std::optional<int64_t>> vouched_steps(int stages, double now, ProgressByPeer* progress,
                                                  std::vector<RefusedRecord>* refused) {
  std::vector<std::vector<ProgressRecord>> by_stage(static_cast<size_t>(stages));
  for (const auto& [where, p] : *progress) by_stage[static_cast<size_t>(where.first)].push_back(p);
  std::vector<std::optional<int64_t>> steps;
  for (int s = 0; s < stages; ++s) {
    const ObservedStep seen = observed_stage_step(by_stage[s], now, GlobalBatchConfig{}.stale_after_seconds);
    steps.push_back(seen.step);
    for (const ProgressRecord& r : seen.refused) {
      refused->push_back({progress_registry_key(s), r.peer_id,
                          fmt::format("unvouched: step {} is ahead of the stage's vouched step {}", r.step, *seen.step),
                          false});
      progress->erase({s, r.peer_id});
    }
  }
  return steps;
}

}  // namespace

SwarmStatus summarize(const RegistryRead& read) {
  SwarmStatus out;
  out.bootstrap = read.bootstrap;
  out.secured = read.secured;
  out.read_at = read.now;
  out.refused_seals = read.refused_seals;
  out.untimely_records = read.untimely_records;
  const int stages = static_cast<int>(std::max(read.announcements.size(), read.progress.size()));
  auto refuse = [&](const std::string& key, const Record& record, std::string reason) {
    out.refused.push_back({key, record.subkey, bounded(std::move(reason)), looks_sealed(record.value)});
  };

  // Announcements: the newest per peer (a peer that moved may still have one under its old stage).
  struct Announced {
    PeerAnnouncementRecord record;
    double expires_at = 0;
  };
  std::map<std::string, Announced> announced;
  for (int s = 0; s < static_cast<int>(read.announcements.size()); ++s) {
    const std::string key = stage_registry_key(s);
    for (const Record& record : read.announcements[s]) {
      if (record.expires_at < read.now) continue;  // gone, as the registry's own gets would say
      auto parsed = PeerAnnouncementRecord::from_json(record.value);
      if (!parsed.is_ok()) {
        refuse(key, record, parsed.status().message());
        continue;
      }
      if (parsed->stage != s) {
        refuse(key, record, fmt::format("announces stage {} under stage {}'s key", parsed->stage, s));
        continue;
      }
      if (parsed->peer_id != record.subkey) {
        refuse(key, record, "its 'peer' is not the subkey it was announced under");
        continue;
      }
      auto [it, fresh] = announced.try_emplace(parsed->peer_id, Announced{*parsed, record.expires_at});
      if (!fresh && record.expires_at > it->second.expires_at) it->second = Announced{*parsed, record.expires_at};
    }
  }

  // Progress records, per (stage, peer).
  ProgressByPeer progress;
  for (int s = 0; s < static_cast<int>(read.progress.size()); ++s) {
    const std::string key = progress_registry_key(s);
    for (const Record& record : read.progress[s]) {
      if (record.expires_at < read.now) continue;
      auto parsed = ProgressRecord::from_json(record.value);
      if (!parsed.is_ok()) {
        refuse(key, record, parsed.status().message());
        continue;
      }
      if (parsed->stage != s) {
        refuse(key, record, fmt::format("reports stage {} under stage {}'s key", parsed->stage, s));
        continue;
      }
      if (parsed->peer_id != record.subkey) {
        refuse(key, record, "its 'peer' is not the subkey it was announced under");
        continue;
      }
      if (parsed->published_at > read.now + kMaxClockSkewSeconds) {
        refuse(key, record, fmt::format("published {:.0f} s in the future", parsed->published_at - read.now));
        continue;
      }
      auto [it, fresh] = progress.try_emplace({s, parsed->peer_id}, *parsed);
      if (!fresh && parsed->published_at > it->second.published_at) it->second = *parsed;
    }
  }
  const std::vector<std::optional<int64_t>> vouched = vouched_steps(stages, read.now, &progress, &out.refused);

  std::set<std::pair<int, std::string>> matched;
  for (const auto& [id, entry] : announced) {
    const PeerAnnouncementRecord& a = entry.record;
    PeerStatus peer{a.peer_id, a.address, a.stage, a.throughput, a.queue_length, a.serving, a.device,
                    entry.expires_at - read.now, std::nullopt};
    if (auto it = progress.find({a.stage, id}); it != progress.end()) {
      const ProgressRecord& p = it->second;
      peer.progress = PeerProgress{p.step, p.params_hash, p.samples, p.samples_per_second, p.state == ProgressRecord::State::averaging,
                                   std::max(0.0, read.now - p.published_at)};
      matched.insert(it->first);
    }
    out.peers.push_back(std::move(peer));
  }
  for (const auto& [where, p] : progress) {
    if (!matched.count(where) && !p.departed) ++out.unmatched_progress;
  }
  std::sort(out.peers.begin(), out.peers.end(), [](const PeerStatus& a, const PeerStatus& b) {
    return std::tie(a.stage, a.peer_id) < std::tie(b.stage, b.peer_id);
  });

  for (int s = 0; s < stages; ++s) {
    StageStatus stage;
    stage.stage = s;
    for (const PeerStatus& peer : out.peers) {
      if (peer.stage != s) continue;
      ++stage.peers;
      if (peer.serving) {
        ++stage.serving;
        stage.throughput += peer.throughput;
      }
      if (peer.progress) {
        stage.highest_step = std::max(stage.highest_step.value_or(0), peer.progress->step);
        stage.lowest_step = std::min(stage.lowest_step.value_or(peer.progress->step), peer.progress->step);
      }
    }
    stage.global_step = vouched[s];
    if (const auto agreed_at = stage.global_step ? stage.global_step : stage.highest_step) {
      std::set<uint64_t> hashes;
      int at_step = 0;
      for (const PeerStatus& peer : out.peers) {
        if (peer.stage != s || !peer.progress || peer.progress->step != *agreed_at) continue;
        ++at_step;
        hashes.insert(peer.progress->params_hash);
      }
      if (at_step >= 2) stage.hashes_agree = hashes.size() == 1;
    }
    out.stages.push_back(stage);
  }
  return out;
}

std::string status_text(const SwarmStatus& status) {
  int serving = 0;
  for (const PeerStatus& peer : status.peers) serving += peer.serving ? 1 : 0;
  std::string text = fmt::format("swarm via {} ({}): {} stages, {} peers ({} serving)\n", printable(status.bootstrap, 80),
                                 status.secured ? "sealed records" : "plaintext", status.stages.size(),
                                 status.peers.size(), serving);
  size_t id_width = 4, address_width = 7;
  for (const PeerStatus& peer : status.peers) {
    id_width = std::max(id_width, printable(peer.peer_id, kMaxFieldChars).size());
    address_width = std::max(address_width, printable(peer.address, kMaxFieldChars).size());
  }
  for (const StageStatus& stage : status.stages) {
    if (stage.peers == 0) {
      text += fmt::format("stage {}: no peer\n", stage.stage);
      continue;
    }
    std::string step = stage.global_step ? std::to_string(*stage.global_step)
                       : stage.highest_step ? "none vouched"
                                            : "unknown";
    if (stage.lowest_step && (stage.lowest_step != stage.highest_step || stage.highest_step != stage.global_step)) {
      step += stage.lowest_step == stage.highest_step
                  ? fmt::format(" (peers at {})", *stage.highest_step)
                  : fmt::format(" (peers at {} to {})", *stage.lowest_step, *stage.highest_step);
    }
    text += fmt::format("stage {}: {} peer{} ({} serving) | {:.1f} samples/s | global step {}{}\n", stage.stage,
                        stage.peers, stage.peers == 1 ? "" : "s", stage.serving, stage.throughput, step,
                        !stage.hashes_agree      ? ""
                        : *stage.hashes_agree ? " | hashes agree"
                                              : " | HASHES DIFFER");
    text += fmt::format("  {:<{}}  {:<{}}  {:>9}  {:>5}  {:>6}  {:<16}  {}\n", "PEER", id_width, "ADDRESS",
                        address_width, "SAMPLES/S", "QUEUE", "STEP", "HASH", "STATE");
    for (const PeerStatus& peer : status.peers) {
      if (peer.stage != stage.stage) continue;
      std::string state = peer.serving ? "serving" : "syncing";
      if (peer.device != "cpu") state += ", " + printable(peer.device, kMaxFieldChars);
      if (!peer.progress) {
        state += ", no progress record";
      } else {
        if (peer.progress->averaging) state += ", averaging";
        state += fmt::format(", progress {:.1f} s old", peer.progress->age_seconds);
      }
      text += fmt::format("  {:<{}}  {:<{}}  {:>9.1f}  {:>5}  {:>6}  {:<16}  {}\n", printable(peer.peer_id, kMaxFieldChars),
                          id_width, printable(peer.address, kMaxFieldChars), address_width, peer.throughput,
                          peer.queue_length, peer.progress ? std::to_string(peer.progress->step) : "-",
                          peer.progress ? hex64(peer.progress->params_hash) : "-", state);
    }
  }
  text += fmt::format("trainers: not announced in the registry ({})\n", kTrainersNote);
  if (status.unmatched_progress > 0) {
    text += fmt::format("progress records of peers not announced at their stage: {}\n", status.unmatched_progress);
  }
  text += fmt::format("refused records: {}\n", status.refused.size());
  for (size_t i = 0; i < status.refused.size() && i < kMaxRefusalsListed; ++i) {
    const RefusedRecord& r = status.refused[i];
    text += fmt::format("  {} '{}': {}{}\n", r.key, printable(r.subkey, kMaxFieldChars),
                        printable(r.reason, kMaxReasonChars), r.sealed ? " (a sealed record)" : "");
  }
  if (status.refused.size() > kMaxRefusalsListed) {
    text += fmt::format("  ... and {} more\n", status.refused.size() - kMaxRefusalsListed);
  }
  if (status.refused_seals > 0 || status.untimely_records > 0) {
    text += fmt::format("refusals by this DHT node (each lookup counts again): {} seals that did not open, {} "
                        "implausible timestamps\n",
                        status.refused_seals, status.untimely_records);
  }
  return text;
}

// The JSON object (docs/RUNNING.md, "`swarm status`: looking at a running swarm", has the same list):
//   bootstrap, secured, read_at (wall-clock seconds), stages_read;
//   stages: [{stage, peers, serving, throughput, global_step (the newest step a
//     strict majority of the stage's committed membership vouches for, as its peers
//     trust it; null: none), lowest_step and highest_step (of its peers' steps, the
//     refused records' left out; null: no progress record), hashes_agree (null:
//     fewer than two peers at global_step, or without one at highest_step)}];
//   peers: [{peer, stage, address, throughput, queue, serving, device, expires_in,
//     step, hash (16 hex digits), samples, samples_per_s, averaging, progress_age:
//     null when the peer has no progress record}];
//   trainers: {announced: false, note};
//   unmatched_progress; refused: {count, records: [{key, subkey, reason, sealed}]};
//   refused_by_node: {seals, untimely}.
nlohmann::json status_json(const SwarmStatus& status) {
  using nlohmann::json;
  json stages = json::array();
  for (const StageStatus& s : status.stages) {
    stages.push_back({{"stage", s.stage},
                      {"peers", s.peers},
                      {"serving", s.serving},
                      {"throughput", s.throughput},
                      {"global_step", s.global_step ? json(*s.global_step) : json(nullptr)},
                      {"lowest_step", s.lowest_step ? json(*s.lowest_step) : json(nullptr)},
                      {"highest_step", s.highest_step ? json(*s.highest_step) : json(nullptr)},
                      {"hashes_agree", s.hashes_agree ? json(*s.hashes_agree) : json(nullptr)}});
  }
  json peers = json::array();
  for (const PeerStatus& p : status.peers) {
    json peer = {{"peer", p.peer_id},       {"stage", p.stage},   {"address", p.address},
                 {"throughput", p.throughput}, {"queue", p.queue_length}, {"serving", p.serving},
                 {"device", p.device},     {"expires_in", p.expires_in_seconds}};
    const auto& q = p.progress;
    peer["step"] = q ? json(q->step) : json(nullptr);
    peer["hash"] = q ? json(hex64(q->params_hash)) : json(nullptr);
    peer["samples"] = q ? json(q->samples) : json(nullptr);
    peer["samples_per_s"] = q ? json(q->samples_per_second) : json(nullptr);
    peer["averaging"] = q ? json(q->averaging) : json(nullptr);
    peer["progress_age"] = q ? json(q->age_seconds) : json(nullptr);
    peers.push_back(std::move(peer));
  }
  json refused = json::array();
  for (const RefusedRecord& r : status.refused) {
    refused.push_back({{"key", r.key}, {"subkey", r.subkey}, {"reason", r.reason}, {"sealed", r.sealed}});
  }
  return {{"bootstrap", status.bootstrap},
          {"secured", status.secured},
          {"read_at", status.read_at},
          {"stages_read", status.stages.size()},
          {"stages", std::move(stages)},
          {"peers", std::move(peers)},
          {"trainers", {{"announced", false}, {"note", kTrainersNote}}},
          {"unmatched_progress", status.unmatched_progress},
          {"refused", {{"count", status.refused.size()}, {"records", std::move(refused)}}},
          {"refused_by_node", {{"seals", status.refused_seals}, {"untimely", status.untimely_records}}}};
}

std::string status_json_text(const SwarmStatus& status) {
  return status_json(status).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

Status check_readable(const SwarmStatus& status) {
  if (!status.peers.empty()) return Status::ok();
  const bool sealed = std::any_of(status.refused.begin(), status.refused.end(),
                                  [](const RefusedRecord& r) { return r.sealed; });
  if (!status.secured && sealed) {
    return permission_denied("the swarm's records are sealed: pass its --secret (or set SWARM_SECRET)");
  }
  if (status.secured && status.refused_seals > 0) {
    return permission_denied("every record of the swarm failed verification ({} refused): is --secret the swarm's?",
                             status.refused_seals);
  }
  return Status::ok();
}

namespace {

using Clock = std::chrono::steady_clock;

// What the reads so far found: per stage and key, the newest record per subkey. A
// DHT lookup can miss a record that the next one finds, so reads accumulate.
struct Accumulated {
  std::vector<std::map<std::string, Record>> announcements;
  std::vector<std::map<std::string, Record>> progress;

  static void merge(std::map<std::string, Record>* into, std::vector<Record> records) {
    for (Record& r : records) {
      auto it = into->find(r.subkey);
      if (it == into->end()) {
        into->emplace(r.subkey, std::move(r));
      } else if (r.expires_at >= it->second.expires_at) {
        it->second = std::move(r);
      }
    }
  }

  void resize(size_t stages) {
    if (announcements.size() < stages) announcements.resize(stages);
    if (progress.size() < stages) progress.resize(stages);
  }

  bool holds_any(int stage, double now) const {
    for (const auto* records : {&announcements[stage], &progress[stage]}) {
      for (const auto& [subkey, r] : *records) {
        if (r.expires_at >= now) return true;
      }
    }
    return false;
  }
};

// Stages whose two keys one batch looks up at once: a lookup often waits out a
// retransmission (about a second) on a busy loopback DHT, so they go in parallel.
constexpr int kStagesPerBatch = 4;

// Looks up both keys of stages first .. first+count-1 at once and adds what came
// back; false if any lookup failed (timed out, reached no node).
bool read_stages(DhtRegistry& registry, int first, int count, Accumulated* found) {
  found->resize(static_cast<size_t>(first + count));
  std::vector<std::optional<Result<std::vector<Record>>>> results(static_cast<size_t>(2 * count));
  std::vector<std::thread> lookups;
  for (int i = 0; i < 2 * count; ++i) {
    const int s = first + i / 2;
    std::string key = i % 2 == 0 ? stage_registry_key(s) : progress_registry_key(s);
    lookups.emplace_back([&registry, &results, i, key = std::move(key)] { results[i] = registry.get(key); });
  }
  for (std::thread& lookup : lookups) lookup.join();
  bool all_answered = true;
  for (int i = 0; i < 2 * count; ++i) {
    auto& result = *results[i];
    if (!result.is_ok()) {
      all_answered = false;
      continue;
    }
    const int s = first + i / 2;
    Accumulated::merge(i % 2 == 0 ? &found->announcements[s] : &found->progress[s], *std::move(result));
  }
  return all_answered;
}

// One pass over the stage keys (while the deadline allows): 0 .. stages-1, or with
// stages 0 batches from stage 0 on until two stages in a row hold nothing. True if
// it read them all and every lookup answered.
bool read_once(DhtRegistry& registry, int stages, Clock::time_point deadline, Accumulated* found) {
  const int limit = stages > 0 ? stages : kMaxDiscoveredStages;
  bool complete = true;
  for (int first = 0; first < limit; first += kStagesPerBatch) {
    if (Clock::now() >= deadline) return false;
    complete = read_stages(registry, first, std::min(kStagesPerBatch, limit - first), found) && complete;
    if (stages > 0) continue;
    const double now = registry.now();
    const int read = std::min(limit, first + kStagesPerBatch);
    for (int s = 0; s + 1 < read; ++s) {
      if (!found->holds_any(s, now) && !found->holds_any(s + 1, now)) return complete;
    }
  }
  return complete;
}

RegistryRead snapshot(const Accumulated& found, int stages, DhtRegistry& registry, const StatusOptions& o,
                      bool secured) {
  RegistryRead read;
  read.bootstrap = o.bootstrap;
  read.secured = secured;
  read.now = registry.now();
  read.refused_seals = registry.refused_seals();
  read.untimely_records = registry.untimely_records();
  int count = stages;
  if (count == 0) {  // discovered: up to the last stage that holds a record
    for (int s = 0; s < static_cast<int>(found.announcements.size()); ++s) {
      if (found.holds_any(s, read.now)) count = s + 1;
    }
  }
  for (int s = 0; s < count; ++s) {
    read.announcements.emplace_back();
    read.progress.emplace_back();
    if (s >= static_cast<int>(found.announcements.size())) continue;
    for (const auto& [subkey, r] : found.announcements[s]) read.announcements.back().push_back(r);
    for (const auto& [subkey, r] : found.progress[s]) read.progress.back().push_back(r);
  }
  return read;
}

// What a stable view means: the same peers, at the same stages, with and without progress.
std::set<std::string> view_of(const SwarmStatus& status) {
  std::set<std::string> view;
  for (const PeerStatus& p : status.peers) view.insert(fmt::format("{}|{}|{}", p.stage, p.peer_id, p.progress ? 1 : 0));
  return view;
}

Result<SwarmStatus> read_status(const StatusOptions& o) {
  if (o.bootstrap.empty()) return invalid_argument("--bootstrap HOST:PORT is required");
  if (o.stages < 0) return invalid_argument("--stages {}: expected >= 0 (0: discover)", o.stages);
  if (!(o.wait_seconds > 0)) return invalid_argument("--wait must be > 0 seconds");
  SWARM_ASSIGN_OR_RETURN(SwarmAccess access, SwarmAccess::create(o.host, o.secret, {.owner_key = o.owner_key}));
  DhtRegistryOptions options = access.registry_options();
  options.get_timeout = std::chrono::milliseconds(3000);  // room for a retransmission or two
  SWARM_ASSIGN_OR_RETURN(DhtRegistry registry, DhtRegistry::start(0, {o.bootstrap}, options));

  const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(o.wait_seconds));
  const auto deadline = Clock::now() + wait;
  if (!registry.wait_connected(wait).is_ok()) {
    return unavailable("no DHT node answered at {} within {:g} s (is a swarm's bootstrap node or peer there?)",
                       o.bootstrap, o.wait_seconds);
  }
  Accumulated found;
  std::optional<std::set<std::string>> last_view;  // of the last complete read
  while (true) {
    const bool complete = read_once(registry, o.stages, deadline, &found);
    SwarmStatus status = summarize(snapshot(found, o.stages, registry, o, access.secured()));
    const bool out_of_time = Clock::now() >= deadline;
    if (complete || out_of_time) SWARM_RETURN_IF_ERROR(check_readable(status));
    const std::set<std::string> view = view_of(status);
    const bool stable = complete && !view.empty() && last_view == view;
    if (stable || out_of_time) {
      if (status.peers.empty()) {
        return unavailable("the registry at {} answered, but no peer announced itself {} within {:g} s{}", o.bootstrap,
                           o.stages > 0 ? fmt::format("in stages 0-{}", o.stages - 1) : std::string("in any stage"),
                           o.wait_seconds,
                           status.refused.empty() ? std::string()
                                                  : fmt::format(" ({} records refused)", status.refused.size()));
      }
      return status;
    }
    if (complete) {
      last_view = view;
    } else {
      last_view.reset();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

}  // namespace

int run_status(const StatusOptions& options) {
  auto status = read_status(options);
  if (!status.is_ok()) {
    fmt::print(stderr, "swarm status: {}\n", status.status().to_string());
    return 1;
  }
  fmt::print("{}", options.json ? status_json_text(*status) : status_text(*status));
  std::fflush(stdout);
  return 0;
}

void add_status_command(CLI::App& app, int* exit_code) {
  auto options = std::make_shared<StatusOptions>();
  CLI::App* command = app.add_subcommand(
      "status", "Show a running swarm from its registry: stages, peers (address, throughput, queue, global step, "
                "parameter hash), refused records");
  command->add_option("--bootstrap", options->bootstrap, "HOST:PORT of a DHT node of the swarm")->required();
  command->add_option("--host", options->host, "IPv4 address this role binds")
      ->check(CLI::ValidIPV4)
      ->capture_default_str();
  command->add_option("--secret", options->secret,
                      "Swarm secret: CURVE on every connection, sealed registry records (default: $SWARM_SECRET; "
                      "empty: plaintext)");
  command->add_option("--owner-key", options->owner_key,
                      "The swarm owner's public key (hex; default: $SWARM_OWNER_KEY): count only certified peers' "
                      "records");
  command->add_option("--stages", options->stages,
                      "Stage keys to read (0: discover, reading stages 0, 1, ... until two in a row hold no record, "
                      "at most 64)")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  command->add_flag("--json", options->json, "Print one JSON object (fields: see docs/RUNNING.md) instead of text");
  command->add_option("--wait", options->wait_seconds, "Seconds to reach the DHT and see a stable view of the swarm")
      ->check(CLI::Range(0.1, 600.0))
      ->capture_default_str();
  command->callback([options, exit_code] { *exit_code = run_status(*options); });
}

}  // namespace swarm::apps
