// Stage synchronization across real processes: three `swarm peer` processes serve
// one stage, found through a `swarm bootstrap` OpenDHT node, and a `swarm trainer`
// drives them. One peer SIGKILLs itself in the middle of an all-reduce (the
// --test-die-in-allreduce hook); the other two finish that round without it and
// keep bit-identical parameters at every step, as the trainer's metrics.jsonl shows.
#include <poll.h>
#include <sys/inotify.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <doctest/doctest.h>

#include "tests/apps/swarm_process.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using namespace swarm::test_apps;  // spawn, read_all, read_metrics, temp_dir

// The first match of `pattern` in `file`, waiting (inotify, with a deadline) for it to be written.
std::string wait_for(const fs::path& file, const std::string& pattern, std::chrono::seconds within) {
  const std::regex re(pattern);
  const auto deadline = std::chrono::steady_clock::now() + within;
  const int notify = ::inotify_init1(IN_CLOEXEC);
  REQUIRE(notify >= 0);
  // The folder, not the file: the child may not have created its log yet.
  REQUIRE(::inotify_add_watch(notify, file.parent_path().c_str(), IN_CREATE | IN_MODIFY | IN_CLOSE_WRITE) >= 0);
  std::string found;
  while (found.empty()) {
    std::smatch m;
    const std::string text = read_all(file);
    if (std::regex_search(text, m, re)) {
      found = m.size() > 1 ? m[1].str() : m[0].str();
      break;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd written{notify, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&written, 1, static_cast<int>(left.count())) <= 0) break;
    char events[4096];
    (void)::read(notify, events, sizeof events);
  }
  ::close(notify);
  if (found.empty()) FAIL("no match for '" << pattern << "' in " << file << ":\n" << read_all(file));
  return found;
}

TEST_CASE("a peer SIGKILLed mid-all-reduce is dropped; its two stage-mates stay identical at every step") {
  const fs::path dir = temp_dir("sync-processes");
  fs::create_directories(dir);

  // The bootstrap node prints its port on stdout: read it through a pipe, waiting
  // with poll() until the line arrives or the deadline passes.
  int out[2];
  REQUIRE(::pipe(out) == 0);
  const pid_t bootstrap = ::fork();
  REQUIRE(bootstrap >= 0);
  if (bootstrap == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::dup2(out[1], 1);
    ::close(out[0]);
    ::execl("apps/swarm", "apps/swarm", "bootstrap", "--port", "0", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(out[1]);
  std::string text, port;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (port.empty()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd readable{out[0], POLLIN, 0};
    if (::poll(&readable, 1, static_cast<int>(left.count())) <= 0) break;
    char buffer[256];
    const ssize_t got = ::read(out[0], buffer, sizeof(buffer));
    if (got <= 0) break;
    text.append(buffer, static_cast<size_t>(got));
    const auto at = text.find("127.0.0.1:");
    if (at != std::string::npos && text.find('\n', at) != std::string::npos) {
      port = text.substr(at + 10, text.find('\n', at) - at - 10);
    }
  }
  REQUIRE_MESSAGE(!port.empty(), text);

  const std::vector<std::string> model = {"--d-model", "32", "--layers", "2", "--heads", "2", "--seq-len", "32"};
  std::map<std::string, pid_t> peers;
  for (const std::string id : {"k0", "k1", "k2"}) {
    std::vector<std::string> args = {"peer", "--stage", "0", "--stages", "1", "--peer-id", id,
                                     "--bootstrap", "127.0.0.1:" + port, "--global-batch", "16",
                                     "--lr", "1e-2", "--warmup", "2", "--allreduce-part-timeout", "1"};
    args.insert(args.end(), model.begin(), model.end());
    if (id == "k2") {
      args.push_back("--test-die-in-allreduce");
      args.push_back("1");
    }
    peers[id] = spawn(args, dir / (id + ".log"));
  }
  // All three serve the same fresh state before any sample arrives: a peer whose
  // stage stepped without it must download (README: a stage of this tiny model
  // steps faster than a download, an open bug this test is not about).
  for (const std::string id : {"k0", "k1", "k2"}) wait_for(dir / (id + ".log"), "serving its own state at step 0", 30s);

  // Trained for a time, not a step count: with no per-step barrier, the trainer's
  // other microbatches keep flowing while one waits out the dead k2, and a fixed
  // 60 steps could all be spent before k0 and k1 drop k2 and step on without it.
  std::vector<std::string> trainer = {"trainer", "--bootstrap", "127.0.0.1:" + port, "--stages", "1",
                                      "--run-dir", (dir / "run").string(), "--microbatch", "4",
                                      "--microbatches-per-step", "4", "--steps", "100000", "--time-limit", "10",
                                      "--eval-windows", "8",
                                      "--forward-timeout", "2", "--backward-timeout", "3"};
  trainer.insert(trainer.end(), model.begin(), model.end());
  const pid_t trainer_pid = spawn(trainer, dir / "trainer.log");
  int trainer_status = 0;
  REQUIRE(::waitpid(trainer_pid, &trainer_status, 0) == trainer_pid);
  const std::string trainer_log = read_all(dir / "trainer.log");
  INFO(trainer_log);
  CHECK(WIFEXITED(trainer_status));
  CHECK(WEXITSTATUS(trainer_status) == 0);
  CHECK(trainer_log.find("0 abandoned") != std::string::npos);

  // k2 killed itself with SIGKILL; the others are still alive.
  int status = 0;
  const pid_t reaped = ::waitpid(peers["k2"], &status, WNOHANG);
  INFO(read_all(dir / "k2.log"));
  REQUIRE(reaped == peers["k2"]);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
  CHECK(::waitpid(peers["k0"], &status, WNOHANG) == 0);
  CHECK(::waitpid(peers["k1"], &status, WNOHANG) == 0);

  std::map<int64_t, std::map<std::string, std::string>> hashes;  // step -> peer -> hash
  for (const auto& r : read_metrics(dir / "run")) {
    if (r["kind"] == "replica") hashes[r["step"].get<int64_t>()][r["peer"].get<std::string>()] = r["hash"];
  }
  int64_t k2_last = -1;
  int both = 0;
  for (const auto& [step, by_peer] : hashes) {
    if (by_peer.count("k2")) k2_last = step;
    if (by_peer.count("k0") && by_peer.count("k1")) {
      ++both;
      INFO("step " << step);
      CHECK(by_peer.at("k0") == by_peer.at("k1"));
    }
  }
  MESSAGE("k2 died in the round of step " << k2_last << "; k0 and k1 logged " << both << " steps, all identical");
  // k0 and k1 stepped on past the round k2 died in, together. The first step after it
  // that both published (the log samples the last 16 hashes of each record every
  // 0.5 s, so at 20 steps/s it can miss k2_last + 1 itself) holds one hash.
  auto after = hashes.upper_bound(k2_last);
  while (after != hashes.end() && !(after->second.count("k0") && after->second.count("k1"))) ++after;
  REQUIRE(after != hashes.end());
  CHECK(after->second.at("k0") == after->second.at("k1"));
  CHECK(both > 10);

  for (const auto& [id, pid] : peers) ::kill(pid, SIGTERM);
  ::kill(bootstrap, SIGTERM);
  for (const auto& [id, pid] : peers) ::waitpid(pid, &status, 0);
  ::waitpid(bootstrap, &status, 0);
}

}  // namespace
