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
//   const std::string port = wait_for(dir / "boot.log", R"(listening on 127\.0\.0\.1:(\d+))", 20s);
//
// Nothing here sleeps and hopes: a test waits for something it can observe (a line
// in a log, a record in metrics.jsonl, a value the DHT returns), with a deadline.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <regex>
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

// Starts `swarm args...` (or another program built on it: `binary`) with stdout and
// stderr to `log` (truncated) and returns its pid; the child is SIGKILLed when the
// test dies, so it never outlives it. (It follows the forking thread: spawn from
// the test's main thread.)
inline pid_t spawn(const std::vector<std::string>& args, const std::filesystem::path& log,
                   const std::string& binary = kSwarmBinary) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(binary.c_str()));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(binary.c_str(), argv.data());
    ::_exit(127);
  }
  return pid;
}

// Waits up to `within` for the child to exit; SIGKILLs it after that. Its wait status, or -1.
inline int wait_exit(pid_t pid, std::chrono::seconds within) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) return status;
    if (done < 0) return -1;
    ::poll(nullptr, 0, 100);
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return -1;
}

// A child that a failed REQUIRE leaves behind is SIGKILLed (its peers die with it).
struct Reaped {
  pid_t pid;
  bool done = false;
  ~Reaped() {
    if (done) return;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
};

// Waits until `done()` holds or `within` has passed, and says whether it held. It
// checks at once, then whenever a file in `folder` is created or written (inotify:
// a log line, a metrics record), and, for a condition that no write there shows
// (what the DHT or a peer's info reply says), also every `recheck`. `folder` must
// exist; watching it rather than a file covers a file not created yet.
inline bool wait_until(const std::filesystem::path& folder, std::chrono::milliseconds within,
                       const std::function<bool()>& done,
                       std::chrono::milliseconds recheck = std::chrono::milliseconds::max()) {
  using Steady = std::chrono::steady_clock;
  const auto deadline = Steady::now() + within;
  const int notify = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  REQUIRE(notify >= 0);
  REQUIRE_MESSAGE(::inotify_add_watch(notify, folder.c_str(), IN_CREATE | IN_MODIFY | IN_CLOSE_WRITE) >= 0, folder);
  bool held = false;
  while (!(held = done())) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Steady::now());
    if (left.count() <= 0) break;
    pollfd written{notify, POLLIN, 0};
    const int timeout = static_cast<int>(std::min<int64_t>({left.count(), recheck.count(), INT32_MAX}));
    if (::poll(&written, 1, timeout) < 0) break;
    char events[4096];
    while (::read(notify, events, sizeof events) > 0) {
    }
  }
  ::close(notify);
  return held;
}

// Waits until `file` matches `pattern` and returns the first match's group 1 (the
// whole match if it has no group); fails the test at the deadline, showing the file.
inline std::string wait_for(const std::filesystem::path& file, const std::string& pattern,
                            std::chrono::milliseconds within) {
  const std::regex re(pattern);
  std::string found;
  const bool matched = wait_until(file.parent_path(), within, [&] {
    std::smatch m;
    const std::string text = read_all(file);
    if (!std::regex_search(text, m, re)) return false;
    found = m.size() > 1 ? m[1].str() : m[0].str();
    return true;
  });
  if (!matched) FAIL("no match for '" << pattern << "' in " << file << ":\n" << read_all(file));
  return found;
}

// The process's resident set in KiB, from /proc; -1 when it cannot be read.
inline int64_t rss_kib(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

}  // namespace swarm::test_apps
