// `swarm local` end to end with real processes, ZeroMQ, OpenDHT and signals:
// a killed peer, a restarted one and a stopped-then-continued one cost
// retries, never a microbatch; and stochastic wiring gives a 2x faster peer
// process 2/3 of the stage's work. Reads the run's metrics.jsonl.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <doctest/doctest.h>

namespace {

namespace fs = std::filesystem;

struct Run {
  int exit_code = -1;
  std::string output;
  std::vector<nlohmann::json> records;
};

fs::path temp_dir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  fs::path dir = fs::path(base ? base : "/tmp") / name;
  fs::remove_all(dir);
  return dir;
}

Run run_swarm(const std::string& args, const fs::path& run_dir) {
  Run run;
  const std::string command = fmt::format("apps/swarm local --run-dir {} {} 2>&1", run_dir.string(), args);
  FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[4096];
  while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) run.output += buffer;
  const int status = ::pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream metrics(run_dir / "metrics.jsonl");
  std::string line;
  while (std::getline(metrics, line)) run.records.push_back(nlohmann::json::parse(line));
  return run;
}

// The tiny model these tests train: fast enough for many microbatches.
const char* kTinyModel =
    "--d-model 32 --layers 2 --heads 2 --seq-len 32 --microbatch 4 --microbatches-per-step 4 "
    "--eval-windows 8 --steps 100000";

std::vector<nlohmann::json> of_kind(const Run& run, const std::string& kind) {
  std::vector<nlohmann::json> out;
  for (const auto& r : run.records) {
    if (r["kind"] == kind) out.push_back(r);
  }
  return out;
}

TEST_CASE("killed, restarted and stopped peers cost retries but no microbatch, and the loss keeps falling") {
  const fs::path dir = temp_dir("faults");
  Run run = run_swarm(fmt::format("{} --in-flight 4 --stages 2 --peers-per-stage 2 --time-limit 24 --forward-timeout 1.5 "
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
  CHECK(stopped_at_continue >= 0);
  CHECK(stopped_final > stopped_at_continue);
}

TEST_CASE("over real processes, a 2x faster peer serves 2/3 of its stage's work, within 10%") {
  const fs::path dir = temp_dir("routing");
  // The router measures round trips, queueing included: with 4 microbatches in
  // flight the busier fast peer's queue makes it look slower (share ~0.63), with
  // 1 the sleeps' overshoot favours it (~0.70). 2 in flight sits between.
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
  CHECK(share == doctest::Approx(2.0 / 3.0).epsilon(0.10 / (2.0 / 3.0)));
}

}  // namespace
