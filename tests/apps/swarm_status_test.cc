// `swarm status` against a running `swarm local`, over real processes, sockets and
// an OpenDHT registry: its JSON shows every peer with its stage, address,
// throughput, global step and parameter hash; its text shows the same peers; a
// malformed or unreachable bootstrap is a clear error and exit status 1.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <regex>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <doctest/doctest.h>

#include "tests/apps/swarm_process.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using namespace swarm::test_apps;  // spawn, wait_for, run_command, read_all, temp_dir
using Clock = std::chrono::steady_clock;

TEST_CASE("swarm status shows every peer of a running swarm local, in JSON and in text") {
  const fs::path dir = temp_dir("swarm-status");
  fs::create_directories(dir);
  const fs::path log = dir / "local.log";
  const pid_t local = spawn({"local", "--run-dir", (dir / "run").string(), "--d-model", "32", "--layers", "2",
                             "--heads", "2", "--seq-len", "32", "--microbatch", "4", "--steps", "100000",
                             "--time-limit", "120", "--peers-per-stage", "2", "--stages", "2",
                             "--eval-windows", "4", "--rebalance-period", "0"},
                            log);
  Reaped reaped{local};  // 400 steps of this model take 7 s: the run is stopped below, not left to end
  // swarm local prints its registry's bootstrap node before it starts the peers.
  const std::string port = wait_for(log, R"(registry: OpenDHT via 127\.0\.0\.1:(\d+))", 30s);
  wait_for(log, R"(all 2 stages served after [0-9.]+ s; training)", 60s);

  const std::string bootstrap = "127.0.0.1:" + port;
  const Run json_run = run_command(fmt::format("{} status --bootstrap {} --json 2>{}", kSwarmBinary, bootstrap,
                                               (dir / "status.err").string()));
  INFO(json_run.output);
  INFO(read_all(dir / "status.err"));
  REQUIRE(json_run.exit_code == 0);
  const auto status = nlohmann::json::parse(json_run.output);  // one JSON object, nothing else on stdout
  CHECK(status["bootstrap"] == bootstrap);
  CHECK(status["secured"] == false);
  CHECK(status["stages_read"] == 2);
  REQUIRE(status["stages"].size() == 2);
  REQUIRE(status["peers"].size() == 4);
  std::map<int, int> per_stage;
  for (const auto& peer : status["peers"]) {
    INFO(peer.dump());
    const int stage = peer["stage"].get<int>();
    ++per_stage[stage];
    // swarm local names its peers s<stage>p<n>; nobody moves with --rebalance-period 0.
    CHECK(peer["peer"].get<std::string>().rfind(fmt::format("s{}p", stage), 0) == 0);
    CHECK(peer["address"].get<std::string>().rfind("tcp://127.0.0.1:", 0) == 0);
    CHECK(peer["throughput"].get<double>() >= 0);
    CHECK(peer["queue"].get<int64_t>() >= 0);
    REQUIRE(peer["step"].is_number_integer());
    CHECK(peer["step"].get<int64_t>() >= 0);
    REQUIRE(peer["hash"].is_string());
    CHECK(std::regex_match(peer["hash"].get<std::string>(), std::regex("[0-9a-f]{16}")));
  }
  CHECK(per_stage[0] == 2);
  CHECK(per_stage[1] == 2);
  for (const auto& stage : status["stages"]) CHECK(stage["peers"] == 2);
  CHECK(status["trainers"]["announced"] == false);
  CHECK(status["refused"]["count"] == 0);

  const Run text_run = run_command(fmt::format("{} status --bootstrap {} --stages 2 2>&1", kSwarmBinary, bootstrap));
  INFO(text_run.output);
  REQUIRE(text_run.exit_code == 0);
  CHECK(text_run.output.find(fmt::format("swarm via {} (plaintext): 2 stages, 4 peers", bootstrap)) !=
        std::string::npos);
  for (const auto& peer : status["peers"]) {
    CHECK(text_run.output.find(peer["peer"].get<std::string>() + " ") != std::string::npos);
  }
  CHECK(text_run.output.find("trainers: not announced in the registry") != std::string::npos);

  ::kill(local, SIGINT);
  const int local_status = wait_exit(local, 60s);
  reaped.done = true;
  INFO(read_all(log));
  CHECK(WIFEXITED(local_status));
}

TEST_CASE("a malformed or unreachable bootstrap is a clear error, exit status 1") {
  const Run malformed = run_command(fmt::format("{} status --bootstrap nonsense 2>&1", kSwarmBinary));
  INFO(malformed.output);
  CHECK(malformed.exit_code == 1);
  CHECK(malformed.output.find("swarm status: invalid_argument: bootstrap node 'nonsense' is not host:port") !=
        std::string::npos);

  // Nothing listens on UDP port 9 (discard) of loopback here: no DHT node answers.
  const Run unreachable = run_command(fmt::format("{} status --bootstrap 127.0.0.1:9 --wait 2 2>&1", kSwarmBinary));
  INFO(unreachable.output);
  CHECK(unreachable.exit_code == 1);
  CHECK(unreachable.output.find("swarm status: unavailable: no DHT node answered at 127.0.0.1:9 within 2 s") !=
        std::string::npos);
}

}  // namespace
