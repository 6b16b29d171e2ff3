// swarm_process: what the process-level tests in tests/apps share. These tests drive
// the real apps/swarm binary (a data dependency, run from the runfiles root) as
// separate processes, over real sockets and signals, so they need the same few
// helpers: start a role with its output in a log, run `swarm local` to the end and
// read back its output, exit code and metrics.jsonl, and pick records by kind.
//
//   const fs::path dir = temp_dir("faults");
//   Run run = run_swarm("--stages 2 --time-limit 20", dir);
//   REQUIRE(run.exit_code == 0);
//   for (const auto& step : of_kind(run, "step")) ...
//
//   const pid_t peer = spawn({"peer", "--stage", "0", ...}, dir / "peer.log");
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <doctest/doctest.h>

namespace swarm::test_apps {

// The binary under test, relative to the test's working directory (the runfiles root).
inline constexpr const char* kSwarmBinary = "apps/swarm";

// A finished command: its exit code (-1 when it did not exit), its stdout and
// stderr together, and for `swarm local` the records of the run's metrics.jsonl.
struct Run {
  int exit_code = -1;
  std::string output;
  std::vector<nlohmann::json> records;
};

// $TEST_TMPDIR/name (or /tmp/name), removed if it was there; not created.
inline std::filesystem::path temp_dir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::filesystem::path dir = std::filesystem::path(base ? base : "/tmp") / name;
  std::filesystem::remove_all(dir);
  return dir;
}

// The whole file, or "" when it cannot be read.
inline std::string read_all(const std::filesystem::path& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The records of run_dir/metrics.jsonl, one JSON object a line; none when it is missing.
inline std::vector<nlohmann::json> read_metrics(const std::filesystem::path& run_dir) {
  std::vector<nlohmann::json> records;
  std::ifstream metrics(run_dir / "metrics.jsonl");
  std::string line;
  while (std::getline(metrics, line)) records.push_back(nlohmann::json::parse(line));
  return records;
}

// Runs a shell command to its end (add "2>&1" to capture stderr too): its output
// and exit code, no records.
inline Run run_command(const std::string& command) {
  Run run;
  FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[4096];
  while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) run.output += buffer;
  const int status = ::pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

// `swarm local --run-dir run_dir args` to its end: output, exit code and the run's records.
inline Run run_swarm(const std::string& args, const std::filesystem::path& run_dir) {
  Run run = run_command(fmt::format("{} local --run-dir {} {} 2>&1", kSwarmBinary, run_dir.string(), args));
  run.records = read_metrics(run_dir);
  return run;
}

// The run's records whose "kind" is `kind`, in order.
inline std::vector<nlohmann::json> of_kind(const Run& run, const std::string& kind) {
  std::vector<nlohmann::json> out;
  for (const auto& r : run.records) {
    if (r["kind"] == kind) out.push_back(r);
  }
  return out;
}

// Starts `swarm args...` with stdout and stderr to `log` (truncated) and returns its
// pid; the child is SIGKILLed when the test dies, so it never outlives it. (It
// follows the forking thread: spawn from the test's main thread.)
inline pid_t spawn(const std::vector<std::string>& args, const std::filesystem::path& log) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<char*> argv;
    static const std::string binary = kSwarmBinary;
    argv.push_back(const_cast<char*>(binary.c_str()));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(binary.c_str(), argv.data());
    ::_exit(127);
  }
  return pid;
}

}  // namespace swarm::test_apps
