// `swarm local` end to end with real processes, ZeroMQ, OpenDHT and signals:
// a killed peer, a restarted one and a stopped-then-continued one cost
// retries, never a microbatch; and stochastic wiring gives a 2x faster peer
// process at least about half the stage's work. Reads the run's metrics.jsonl.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <doctest/doctest.h>

#include "swarm/data/token_dataset.h"
#include "tests/apps/swarm_process.h"

namespace {

namespace fs = std::filesystem;
using namespace swarm::test_apps;  // Run, run_swarm, run_command, read_metrics, of_kind, temp_dir

// The tiny model these tests train: fast enough for many microbatches.
const char* kTinyModel =
    "--d-model 32 --layers 2 --heads 2 --seq-len 32 --microbatch 4 --microbatches-per-step 4 "
    "--eval-windows 8 --steps 100000";

TEST_CASE("killed, restarted and stopped peers cost retries but no microbatch, and the loss keeps falling") {
  const fs::path dir = temp_dir("faults");
  // Rebalancing is off: this case is about faults. With it on, a peer that moves into
  // stage 1 while its peers there re-sync loads its old checkpoint and steps on its own
  // lineage for a while (1 run in 4 showed differing hashes). That bug is open; see
  // docs/RUNNING.md, Rebalancing. //tests/apps:rebalance_swarm_test covers moves.
  Run run = run_swarm(fmt::format("{} --rebalance-period 0 --in-flight 4 --stages 2 --peers-per-stage 2 --time-limit 24 --forward-timeout 1.5 "
                                  "--backward-timeout 2.5 --chaos kill-peer:1:4,restart-peer:1:8,stop-peer:0:12:4",
                                  kTinyModel),
                      dir);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(fs::exists(dir / "config.json"));
  auto steps = of_kind(run, "step");
  REQUIRE(steps.size() > 20);
  const auto& last = steps.back();
  CHECK(last["microbatches_abandoned"] == 0);
  CHECK(last.contains("validation_loss"));
  // The ledger: every microbatch started was completed.
  auto ledger_at = run.output.find("ledger: ");
  REQUIRE(ledger_at != std::string::npos);
  long started = 0, completed = 0, abandoned = -1;
  std::sscanf(run.output.c_str() + ledger_at, "ledger: %ld microbatches started, %ld completed, %ld abandoned",
              &started, &completed, &abandoned);
  CHECK(started > 0);
  CHECK(completed == started);
  CHECK(abandoned == 0);
  // Loss falls across the faults.
  CHECK(steps.back()["loss"].get<double>() < steps.front()["loss"].get<double>() - 0.5);

  std::map<std::string, std::string> chaos_target;
  double continue_time = 0;
  for (const auto& e : of_kind(run, "event")) {
    const std::string event = e["event"];
    if (event.starts_with("chaos_")) chaos_target[event] = e["peer"];
    if (event == "chaos_continue-peer") continue_time = e["time"];
  }
  REQUIRE(chaos_target.count("chaos_kill-peer"));
  REQUIRE(chaos_target.count("chaos_restart-peer"));
  REQUIRE(chaos_target.count("chaos_stop-peer"));
  REQUIRE(chaos_target.count("chaos_continue-peer"));
  CHECK_FALSE(chaos_target["chaos_kill-peer"].empty());
  const std::string restarted = chaos_target["chaos_restart-peer"];
  const std::string stopped = chaos_target["chaos_stop-peer"];
  CHECK(chaos_target["chaos_continue-peer"] == stopped);
  // The retries show the faults were felt, and the events name who failed.
  CHECK(last["retries"].get<int>() > 0);
  int failure_events = 0;
  for (const auto& e : of_kind(run, "event")) {
    if (e["event"] == "banned" || e["event"] == "timed_out") ++failure_events;
  }
  CHECK(failure_events > 0);

  // The restarted peer joined and served; the stopped one served again after SIGCONT.
  int64_t restarted_served = 0, stopped_at_continue = -1, stopped_final = 0;
  for (const auto& p : of_kind(run, "peer")) {
    const int64_t served = p["forward"].get<int64_t>() + p["backward"].get<int64_t>();
    if (p["peer"] == restarted) restarted_served = std::max(restarted_served, served);
    if (p["peer"] == stopped) {
      if (p["time"].get<double>() <= continue_time) stopped_at_continue = served;
      stopped_final = std::max(stopped_final, served);
    }
  }
  CHECK(restarted_served > 0);
  // It outlives the chaos plan: nothing but the end of the run stops it (a peer
  // restarted from the chaos thread once died with that thread, as PR_SET_PDEATHSIG
  // follows the forking thread).
  for (const auto& e : of_kind(run, "event")) {
    CHECK_FALSE((e["event"] == "peer_lost" && e["peer"] == restarted));
  }
  CHECK(stopped_at_continue >= 0);
  CHECK(stopped_final > stopped_at_continue);

  // Stage synchronization through all of it: every replica's parameter hash at
  // every global step equals its stage-mates' (a joiner's included).
  std::map<std::pair<int, int64_t>, std::set<std::string>> hashes;
  std::map<std::pair<int, int64_t>, std::set<std::string>> holders;
  for (const auto& r : of_kind(run, "replica")) {
    const auto key = std::make_pair(r["stage"].get<int>(), r["step"].get<int64_t>());
    hashes[key].insert(r["hash"].get<std::string>());
    holders[key].insert(r["peer"].get<std::string>());
  }
  int shared_steps = 0;
  for (const auto& [key, set] : hashes) {
    INFO("stage " << key.first << " step " << key.second);
    CHECK(set.size() == 1);
    if (holders[key].size() >= 2) ++shared_steps;
  }
  MESSAGE(hashes.size() << " (stage, step) hashes logged, " << shared_steps << " held by 2+ replicas, all equal");
  CHECK(shared_steps > 20);
  CHECK(run.output.find("replicas with differing parameter hashes: 0") != std::string::npos);
}

TEST_CASE("a stage emptied by two kills: the run still ends with its summary and ledger, within the time limit") {
  const fs::path dir = temp_dir("emptied");
  // Rebalancing off, so stage 1 stays empty: no microbatch and no validation window can finish.
  const auto start = std::chrono::steady_clock::now();
  Run run = run_swarm(fmt::format("{} --peers-per-stage 2 --rebalance-period 0 --time-limit 15 "
                                  "--chaos kill-peer:1:4,kill-peer:1:5",
                                  kTinyModel),
                      dir);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(run.output);
  // Training stops at 15 s; draining and validation get the 20 s grace, and a call
  // already sent its --backward-timeout (20 s) at most; start-up is a few seconds.
  CHECK(seconds < 15 + 20 + 20 + 15);
  MESSAGE("the emptied run took " << seconds << " s in all");
  CHECK(run.exit_code == 1);  // no validation window could be evaluated
  CHECK(run.output.find("stopped by: time limit") != std::string::npos);
  CHECK(run.output.find("validation loss - (none: ") != std::string::npos);
  CHECK(run.output.find("ledger: ") != std::string::npos);
  CHECK(run.output.find("stage 1: ") != std::string::npos);  // each stage's sample ledger
  CHECK(run.output.find("unavailable: validation failed") == std::string::npos);
  const auto steps = of_kind(run, "step");
  REQUIRE_FALSE(steps.empty());
  CHECK(steps.back()["validation_loss"].is_null());
  CHECK(steps.back()["stopped_because"] == "time limit");
  // A step whose microbatches were all abandoned has a null loss, never a 0.
  for (const auto& step : steps) {
    if (!step["loss"].is_null()) CHECK(step["loss"].get<double>() > 0.0);
  }
}

TEST_CASE("a stopped run resumes from its checkpoints: the loss continues where it was") {
  const fs::path dir = temp_dir("resume");
  const std::string model =
      "--d-model 32 --layers 2 --heads 2 --seq-len 32 --microbatch 4 --microbatches-per-step 4 --eval-windows 8 "
      "--global-batch 16 --checkpoint-every 10 --lr 1e-2";
  // Gradients in a codec of their own: the resumed run must read it back and pass it to its peers.
  // One peer per stage: this checks resuming and generating, and a stage of one
  // steps on every global batch at once, so 150 steps reach the loss the text check needs.
  Run first = run_swarm(fmt::format("{} --steps 150 --gradient-codec fp16 --peers-per-stage 1", model), dir);
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  CHECK(first.output.find("wire (8bit activations, fp16 gradients)") != std::string::npos);
  const auto config = nlohmann::json::parse(read_all(dir / "config.json"));
  CHECK(config.at("codec") == "8bit");
  CHECK(config.at("gradient_codec") == "fp16");
  auto before = of_kind(first, "step");
  REQUIRE(before.size() >= 150);
  const double initial_loss = before.front()["loss"].get<double>();
  double late_loss = 0;
  for (size_t i = before.size() - 11; i + 1 < before.size(); ++i) late_loss += before[i]["loss"].get<double>() / 10;
  CHECK(fs::exists(dir / "checkpoints" / "stage-0.ckpt"));
  CHECK(fs::exists(dir / "checkpoints" / "stage-1.ckpt"));

  // --resume reads the model and swarm from the run's config.json; --steps says where to stop.
  const std::string command =
      fmt::format("apps/swarm local --resume {} --steps 170 2>&1", dir.string());
  Run second = run_command(command);
  INFO(second.output);
  REQUIRE(second.exit_code == 0);
  REQUIRE(second.output.find("resumed") != std::string::npos);
  CHECK(second.output.find("wire (8bit activations, fp16 gradients)") != std::string::npos);
  std::vector<nlohmann::json> resumed_steps;
  bool after_resume = false;
  int64_t resumed_at = -1;
  for (const auto& r : read_metrics(dir)) {
    if (r["kind"] == "event" && r["event"] == "resumed") {
      after_resume = true;
      resumed_at = r["step"].get<int64_t>();
    }
    if (after_resume && r["kind"] == "step" && !r.contains("validation_loss")) resumed_steps.push_back(r);
  }
  // A checkpoint every 10 global steps (here one global step per step of 16 samples),
  // from stages that may lag the trainer by some steps.
  REQUIRE(resumed_at >= 30);
  REQUIRE(resumed_steps.size() >= 5);
  const double first_resumed = resumed_steps.front()["loss"].get<double>();
  MESSAGE("loss: first " << initial_loss << ", last 10 before the stop " << late_loss << ", first after resuming "
                         << first_resumed << " (resumed at global step " << resumed_at << ")");
  // Continues near where it was, far from the untrained start.
  CHECK(first_resumed < late_loss + 0.3);
  CHECK(first_resumed < initial_loss - 0.8);  // measured: 5.55 at the start
  CHECK(resumed_steps.front()["step"].get<int64_t>() == resumed_at + 1);

  // The run's stage checkpoints, assembled into the whole model, write text: the
  // fortunes' bytes (printable, with spaces between words), not noise. This tiny
  // model ends at 3.6 to 4.4 nats/byte (a loaded machine makes rounds late, and a
  // stage of one steps several global batches at once): at temperature 0.5 one run
  // at 4.33 wrote 249 printable bytes of 305, so it samples at 0.3.
  Run text = run_command(
      fmt::format("apps/swarm generate --run {} --prompt 'The ' --length 300 --temperature 0.3 2>&1", dir.string()));
  INFO(text.output);
  REQUIRE(text.exit_code == 0);
  CHECK(text.output.find("2 stages of " + dir.string() + " at global steps") != std::string::npos);
  // stderr's line first (unbuffered), then the prompt and the sample.
  const std::string sample = text.output.substr(text.output.find('\n', text.output.find("at global steps")) + 1);
  CHECK(sample.starts_with("The "));
  REQUIRE(sample.size() >= 300);
  int printable = 0, spaces = 0;
  for (char c : sample) {
    printable += (c == '\n' || (c >= 32 && c < 127)) ? 1 : 0;
    spaces += c == ' ' ? 1 : 0;
  }
  CHECK(printable >= static_cast<int>(sample.size() * 0.9));
  CHECK(spaces >= static_cast<int>(sample.size() / 20));  // uniform bytes would give 1 in 256

  // A run missing a stage's checkpoint is named, not sampled.
  fs::remove(dir / "checkpoints" / "stage-1.ckpt");
  Run missing = run_command(fmt::format("apps/swarm generate --run {} 2>&1", dir.string()));
  CHECK(missing.exit_code == 1);
  CHECK(missing.output.find("stage 1 of " + dir.string() + " has no usable checkpoint") != std::string::npos);
}

TEST_CASE("swarm local --secret trains with CURVE everywhere, and writes the secret nowhere") {
  const fs::path dir = temp_dir("secret");
  const std::string secret = "local-swarm-test-secret";
  Run run = run_swarm(fmt::format("{} --stages 2 --peers-per-stage 2 --time-limit 15 --secret {}", kTinyModel, secret),
                      dir);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(run.output.find("sealed records, CURVE") != std::string::npos);
  CHECK(run.output.find(" 0 abandoned") != std::string::npos);
  CHECK(run.output.find("differing parameter hashes: 0 ") != std::string::npos);
  int curve_peers = 0;
  for (const auto& log : fs::directory_iterator(dir / "peers")) {
    const std::string text = read_all(log.path());
    curve_peers += text.find("(CURVE)") != std::string::npos ? 1 : 0;
    CHECK(text.find(secret) == std::string::npos);
  }
  CHECK(curve_peers == 4);
  CHECK(read_all(dir / "config.json").find(secret) == std::string::npos);
  // Peer ids are bound to each process's key: NAME.FINGERPRINT (32 hex digits).
  const auto events = of_kind(run, "event");
  bool bound_id = false;
  for (const auto& e : events) {
    const std::string peer = e.value("peer", "");
    bound_id |= peer.size() > 33 && peer[peer.size() - 33] == '.';
  }
  CHECK(bound_id);
}

TEST_CASE("an unknown --gradient-codec is refused on the command line, before anything starts") {
  const fs::path dir = temp_dir("bogus-gradient-codec");
  const Run run = run_swarm("--gradient-codec bogus", dir);
  CHECK(run.exit_code != 0);
  CHECK(run.output.find("--gradient-codec") != std::string::npos);
  CHECK(run.output.find("bogus") != std::string::npos);
  CHECK_FALSE(fs::exists(dir));
}

// A GPT-2 token shard in llm.c's layout (256 little-endian int32 of header, then
// uint16 ids): a repeating 64-token phrase of ids spread over the whole
// vocabulary, so the loss has something to learn and every embedding row range is used.
void write_gpt2_shard(const fs::path& path, size_t tokens) {
  std::string bytes;
  auto le32 = [&](uint32_t v) {
    for (int shift = 0; shift < 32; shift += 8) bytes.push_back(static_cast<char>(v >> shift));
  };
  le32(static_cast<uint32_t>(swarm::kGpt2BinMagic));
  le32(static_cast<uint32_t>(swarm::kGpt2BinVersion));
  le32(static_cast<uint32_t>(tokens));
  while (bytes.size() < 4 * swarm::kGpt2BinHeaderInts) le32(0);
  for (size_t i = 0; i < tokens; ++i) {
    const auto id = static_cast<uint16_t>((i % 64) * 781 % swarm::kGpt2VocabSize);
    bytes.push_back(static_cast<char>(id & 0xff));
    bytes.push_back(static_cast<char>(id >> 8));
  }
  std::ofstream(path, std::ios::binary) << bytes;
}

TEST_CASE("swarm local --gpt2-tokens trains on an llm.c token file with the 50257-token vocabulary") {
  const fs::path dir = temp_dir("gpt2-tokens");
  const fs::path shard = temp_dir("gpt2-shard.bin");
  write_gpt2_shard(shard, 40000);
  Run run = run_swarm(fmt::format("--d-model 32 --layers 2 --heads 2 --seq-len 32 --microbatch 4 "
                                  "--microbatches-per-step 2 --eval-windows 4 --steps 30 --data {} --gpt2-tokens",
                                  shard.string()),
                      dir);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(run.output.find(" 0 abandoned") != std::string::npos);
  const auto config = nlohmann::json::parse(read_all(dir / "config.json"));
  CHECK(config["model"]["vocab_size"] == swarm::kGpt2VocabSize);
  CHECK(config["gpt2_tokens"] == true);
  const auto steps = of_kind(run, "step");
  REQUIRE(steps.size() >= 10);
  const double first = steps.front()["loss"].get<double>();
  const double last = steps.back()["validation_loss"].get<double>();
  MESSAGE("loss: first step " << first << " (ln 50257 = 10.82), validation at the end " << last);
  CHECK(first > 10.0);  // an untrained model spreads over the whole vocabulary
  CHECK(last < first - 0.3);  // measured: 10.84 -> 10.24 in these 30 steps
  CHECK(run.output.find("nats/token") != std::string::npos);

  const Run missing = run_swarm("--gpt2-tokens", temp_dir("gpt2-no-data"));
  CHECK(missing.exit_code != 0);
  CHECK(missing.output.find("--gpt2-tokens needs --data") != std::string::npos);
}

TEST_CASE("--eval-every validates through the swarm between segments: the held-out loss falls, no sample is lost") {
  const fs::path dir = temp_dir("eval-every");
  Run run = run_swarm("--d-model 32 --layers 2 --heads 2 --seq-len 32 --microbatch 4 --microbatches-per-step 4 "
                      "--eval-windows 8 --steps 30 --eval-every 10",
                      dir);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  const auto validations = of_kind(run, "validation");
  REQUIRE(validations.size() == 2);  // after steps 10 and 20; the run's own validation ends it
  CHECK(validations[0]["step"] == 10);
  CHECK(validations[1]["step"] == 20);
  CHECK(validations[0]["validation_windows"] == 8);
  const double at_10 = validations[0]["validation_loss"].get<double>();
  const double at_20 = validations[1]["validation_loss"].get<double>();
  const auto steps = of_kind(run, "step");
  REQUIRE(!steps.empty());
  const double at_30 = steps.back()["validation_loss"].get<double>();
  MESSAGE("validation loss at steps 10, 20, 30: " << at_10 << ", " << at_20 << ", " << at_30);
  CHECK(at_20 < at_10);
  CHECK(at_30 < at_10);
  CHECK(run.output.find("validation at step 10: loss") != std::string::npos);
  CHECK(steps.back()["microbatches_completed"] == 120);  // 30 steps x 4, every one across the pauses
  CHECK(steps.back()["microbatches_abandoned"] == 0);
  for (const auto& stage : of_kind(run, "stage_samples")) {
    CHECK(stage["samples_accumulated_total"] == stage["samples_completed"]);
  }
}

TEST_CASE("--emulated-device paces every stage by its FLOPs, and the swarm still accounts every sample") {
  // Stage 0 of this model is 1 block of d_model 32 over 32 tokens: 24·32² + 4·32·32 = 28672
  // FLOPs per token forward, 3 times that with the backward, so a microbatch of 4 x 32 tokens
  // costs 1.1e7 FLOPs there: 0.22 s at 5e7 FLOP/s, where this CPU computes it in milliseconds.
  // Two peers serve the stage one request at a time each, so 24 microbatches take >= 2.6 s.
  const fs::path dir = temp_dir("emulated-device");
  Run run = run_swarm("--d-model 32 --layers 2 --heads 2 --seq-len 32 --microbatch 4 --microbatches-per-step 4 "
                      "--eval-windows 4 --steps 6 --in-flight 4 --emulated-device 5e7",
                      dir);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  const auto config = nlohmann::json::parse(read_all(dir / "config.json"));
  CHECK(config["emulated_device_flops"] == 5e7);
  CHECK(read_all(dir / "peers" / "s0p0.log").find("on an emulated device of 5e+07 FLOP/s") != std::string::npos);
  const auto steps = of_kind(run, "step");
  REQUIRE(steps.size() >= 2);
  CHECK(steps.back()["microbatches_completed"] == 24);
  CHECK(steps.back()["microbatches_abandoned"] == 0);
  for (const auto& stage : of_kind(run, "stage_samples")) {
    CHECK(stage["samples_accumulated_total"] == stage["samples_completed"]);
  }
  const double per_microbatch = 3 * 28672.0 * 128 / 5e7;
  const double seconds = steps.back()["time"].get<double>() - steps.front()["time"].get<double>();
  const double completed = steps.back()["microbatches_completed"].get<double>() -
                           steps.front()["microbatches_completed"].get<double>();
  MESSAGE(completed << " microbatches in " << seconds << " s; stage 0 needs at least "
                    << completed * per_microbatch / 2 << " s");
  CHECK(seconds >= 0.95 * completed * per_microbatch / 2);

  const Run refused = run_swarm("--emulated-device -1", temp_dir("emulated-device-bad"));
  CHECK(refused.exit_code != 0);
  CHECK(refused.output.find("--emulated-device must be a finite FLOP/s rate") != std::string::npos);
}

TEST_CASE("--resume of a directory without a run is a clear error") {
  const fs::path dir = temp_dir("not-a-run");
  fs::create_directories(dir);
  const std::string command = fmt::format("apps/swarm local --resume {} 2>&1", dir.string());
  const Run run = run_command(command);
  CHECK(run.exit_code == 1);
  CHECK(run.output.find("no config.json") != std::string::npos);
}

TEST_CASE("over real processes, a 2x faster peer is not starved: it serves about half its stage's work or more") {
  const fs::path dir = temp_dir("routing");
  // The router measures whole round trips, a peer's forward holds and round waits
  // included, which cost a fast peer as long as a slow one: the share is 0.52 to
  // 0.54, not the 2/3 of their speeds. Routing by service time (replies reporting
  // their holds) reached 0.66, and was withdrawn while it slowed the hostile
  // suite's sign-flip ban (issue 26's note).
  Run run = run_swarm(fmt::format("{} --in-flight 2 --stages 2 --peers-per-stage 2 --slow-peer 0:2 "
                                  "--emulated-cost 0.001 --time-limit 20",
                                  kTinyModel),
                      dir);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  std::map<std::string, int64_t> served;
  for (const auto& p : of_kind(run, "peer")) {
    if (p["stage"] != 0) continue;
    served[p["peer"]] = std::max(served[p["peer"]], p["forward"].get<int64_t>() + p["backward"].get<int64_t>());
  }
  REQUIRE(served.size() == 2);
  // s0p0 is the slow one (the first peer spawned for stage 0).
  const double slow = static_cast<double>(served["s0p0"]);
  const double fast = static_cast<double>(served["s0p1"]);
  const double share = fast / (fast + slow);
  MESSAGE("fast peer share over processes: " << share << " (" << fast << " of " << fast + slow << ")");
  CHECK(share > 0.45);  // measured 0.516 to 0.54; the 2/3 its speed deserves is not met yet
}

}  // namespace
