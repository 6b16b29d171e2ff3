// `swarm local` with rebalancing, over real processes, sockets, an OpenDHT registry
// and SIGKILL: a stage-0 peer moves to a thinned stage 1 and its replica matches its
// new stage-mates'; a stage emptied by two kills is refilled and the run ends with its
// ledger; a balanced swarm stays put.
#include <map>
#include <set>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <doctest/doctest.h>

#include "tests/apps/swarm_process.h"

namespace {

namespace fs = std::filesystem;
using namespace swarm::test_apps;  // Run, run_swarm, of_kind, temp_dir

// A small model, short timeouts, and emulated peers that set the pace.
constexpr const char* kSmallSwarm =
    "--d-model 32 --layers 2 --heads 2 --seq-len 32 --microbatch 4 --microbatches-per-step 4 --eval-windows 8 "
    "--steps 100000 --forward-timeout 1 --backward-timeout 2 --emulated-cost 0.01 --stages 2";

std::vector<nlohmann::json> moves_of(const Run& run) {
  std::vector<nlohmann::json> moves;
  for (const auto& e : of_kind(run, "event")) {
    if (e["event"] == "peer_moved") moves.push_back(e);
  }
  return moves;
}

// (stage, step) -> peer -> hash, from the run's replica records.
std::map<std::pair<int, int64_t>, std::map<std::string, std::string>> hashes_of(const Run& run) {
  std::map<std::pair<int, int64_t>, std::map<std::string, std::string>> out;
  for (const auto& r : of_kind(run, "replica")) out[{r["stage"], r["step"]}][r["peer"]] = r["hash"];
  return out;
}

// What the peers said about rebalancing, for the failure message.
std::string rebalancing_lines(const fs::path& run_dir) {
  std::string out;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(run_dir / "peers", error)) {
    std::istringstream log(read_all(entry.path()));
    for (std::string line; std::getline(log, line);) {
      if (line.find("rebalanc") != std::string::npos || line.find("mov") != std::string::npos) out += line + "\n";
    }
  }
  return out;
}

void check_last_step_clean(const Run& run) {
  auto steps = of_kind(run, "step");
  REQUIRE_FALSE(steps.empty());
  const auto& last = steps.back();
  CHECK(last.contains("validation_loss"));
  CHECK(last["microbatches_abandoned"] == 0);
}

TEST_CASE("a stage-0 peer moves to the thinned stage 1, and its replica is its new stage-mates'") {
  const fs::path dir = temp_dir("rebalance-move");
  Run run = run_swarm(fmt::format("{} --peers-per-stage 3 --in-flight 4 --rebalance-period 2 --time-limit 40 "
                                  "--chaos kill-peer:1:8,kill-peer:1:10",
                                  kSmallSwarm),
                      dir);
  INFO(run.output);
  INFO(rebalancing_lines(dir));
  REQUIRE(run.exit_code == 0);
  const auto moves = moves_of(run);
  REQUIRE(moves.size() >= 1);
  CHECK(moves.front()["from_stage"] == 0);
  CHECK(moves.front()["to_stage"] == 1);
  CHECK(moves.size() == 1);  // 2 + 2 is balanced: nobody moves on or back
  const std::string mover = moves.front()["peer"];
  check_last_step_clean(run);

  // At every stage-1 step where the mover and a stage-mate both published a hash, the hashes agree.
  int compared = 0;
  for (const auto& [key, by_peer] : hashes_of(run)) {
    if (key.first != 1 || !by_peer.count(mover)) continue;
    for (const auto& [peer, hash] : by_peer) {
      if (peer == mover) continue;
      CHECK_MESSAGE(hash == by_peer.at(mover), "stage 1 step " << key.second << ": " << peer << " vs " << mover);
      ++compared;
    }
  }
  CHECK(compared > 0);
  // (Not every (stage, step) need hold one hash: a round that fails under load can leave a
  // replica apart, which the hash check catches and re-syncs; the mover's are compared above.)

  // Stage 0 lost no peer to a kill: it holds every completed sample once, the mover's
  // among them, as the ledger the mover kept for the stage it left shows.
  const auto stages = of_kind(run, "stage_samples");
  REQUIRE(stages.size() == 2);
  CHECK(stages[0]["samples_accumulated_total"] == stages[0]["samples_completed"]);
  bool mover_reported_stage0 = false;
  for (const auto& p : of_kind(run, "peer_samples")) {
    if (p["peer"] == mover && p["stage"] == 0 && !p.contains("error")) {
      mover_reported_stage0 = p["samples_accumulated_total"].get<int64_t>() > 0;
    }
  }
  CHECK(mover_reported_stage0);
}

TEST_CASE("a stage emptied by two kills is refilled, and the run ends with its ledger") {
  const fs::path dir = temp_dir("rebalance-refill");
  Run run = run_swarm(fmt::format("{} --peers-per-stage 2 --in-flight 2 --rebalance-period 2 --time-limit 30 "
                                  "--chaos kill-peer:1:6,kill-peer:1:8",
                                  kSmallSwarm),
                      dir);
  INFO(run.output);
  INFO(rebalancing_lines(dir));
  REQUIRE(run.exit_code == 0);
  const auto moves = moves_of(run);
  REQUIRE(moves.size() == 1);
  CHECK(moves.front()["from_stage"] == 0);
  CHECK(moves.front()["to_stage"] == 1);
  check_last_step_clean(run);
  // Training went on after the refill.
  double moved_at = moves.front()["time"];
  int64_t steps_after = 0;
  for (const auto& s : of_kind(run, "step")) steps_after += s["time"].get<double>() > moved_at ? 1 : 0;
  CHECK(steps_after >= 3);
  CHECK(run.output.find("stage 1: ") != std::string::npos);  // the ledger lines
  CHECK(of_kind(run, "stage_samples").size() == 2);
}

TEST_CASE("a balanced swarm stays put over ten rebalancing periods") {
  const fs::path dir = temp_dir("rebalance-balanced");
  Run run = run_swarm(fmt::format("{} --peers-per-stage 2 --in-flight 2 --rebalance-period 1 --time-limit 14",
                                  kSmallSwarm),
                      dir);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(moves_of(run).empty());
  auto steps = of_kind(run, "step");
  REQUIRE_FALSE(steps.empty());
  CHECK(steps.back()["time"].get<double>() >= 10);  // ten periods of checks
}

}  // namespace
