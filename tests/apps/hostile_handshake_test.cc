// A stranger's unfinished handshakes against a peer, over real processes and
// sockets (the swarm, the windows and the checks: hostile_rounds_fixture.h). While
// a trainer trains, a process without the secret opens 20,000 TCP connections to
// one stage-0 peer from its own loopback address and never speaks: once, this took
// a peer from 182 to 556 MiB and filled its descriptor table (20000/20000), and its
// checkpoints failed with "Too many open files". The peer's connection guard keeps
// at most its per-source cap of them, shuts the rest down and counts them, so its
// descriptors stay far below the limit, its checkpoints are written and stage 0
// trains on at its rate.
#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <doctest/doctest.h>

#include "tests/apps/hostile_rounds_fixture.h"
#include "tests/transports/zmq/stranger_socket.h"

namespace swarm {
namespace {

using namespace hostile_rounds;  // HostileRun, Window, clean_run, check_*, and hostile_member.h
using namespace std::chrono_literals;
using test_sockets::ended;
using test_sockets::open_from;

constexpr int kConnections = 20000;

int64_t descriptors_of(pid_t pid) {
  int64_t n = 0;
  if (DIR* dir = ::opendir(fmt::format("/proc/{}/fd", pid).c_str())) {
    while (::readdir(dir) != nullptr) ++n;
    ::closedir(dir);
  }
  return std::max<int64_t>(0, n - 2);
}

int64_t open_files_limit() {
  rlimit limit{};
  return ::getrlimit(RLIMIT_NOFILE, &limit) == 0 ? static_cast<int64_t>(limit.rlim_cur) : 1024;
}

// The stranger: kConnections connections from two addresses of its own, each
// held until the peer ends it (two threads: on 2 cores one opens some 500 a second).
// Each sweep also reads the victim's descriptor count, so the most it reached is
// sampled as the flood goes, by the flood itself.
struct Stranger {
  std::atomic<int64_t> opened{0}, failed{0}, held{0}, most_descriptors{0};
  std::atomic<bool> stop{false};
  pid_t victim;
  std::vector<std::thread> threads;

  Stranger(int port, pid_t victim_pid) : victim(victim_pid) {
    for (const char* source : {"127.0.0.2", "127.0.0.3"}) {
      threads.emplace_back([this, port, source] { flood(source, port); });
    }
  }
  ~Stranger() {
    stop = true;
    for (auto& t : threads) t.join();
  }

  void flood(const char* source, int port) {
    std::vector<int> open;
    while (!stop && opened + failed < kConnections) {
      const int fd = open_from(source, port);
      (fd >= 0 ? opened : failed) += 1;
      if (fd >= 0) open.push_back(fd);
      if (open.size() % 64 == 0) {
        const size_t before = open.size();
        std::erase_if(open, [](int f) { return ended(f) ? (::close(f), true) : false; });
        held += static_cast<int64_t>(open.size()) - static_cast<int64_t>(before);
        const int64_t now = descriptors_of(victim);
        int64_t most = most_descriptors.load();
        while (now > most && !most_descriptors.compare_exchange_weak(most, now)) {
        }
      }
      if (fd >= 0) ++held;
    }
    for (int f : open) ::close(f);
  }
};

TEST_CASE("a stranger's 20,000 unfinished handshakes leave a peer's descriptors, checkpoints and rate alone") {
  const RunEnd& clean = clean_run();
  HostileRun run("hostile-handshake");
  Attacker& attacker = *run.attacker;
  const std::string victim = "p00";
  const pid_t pid = run.peer_pids.at(victim);
  const LivePeer* target = nullptr;
  for (const auto& [id, peer] : run.peers) {
    if (id.starts_with(victim + ".")) target = &peer;
  }
  REQUIRE(target != nullptr);
  const int port = std::stoi(target->compute.substr(target->compute.rfind(':') + 1));
  const protocol::RefusalCounts at_start = refusals_of(attacker, *target);
  const fs::path checkpoint = run.dir / (victim + ".ckpt");

  run.wait_until_steady();
  const Window before = run.measure("before");
  const int64_t descriptors_before = descriptors_of(pid);
  const auto checkpoint_before = fs::exists(checkpoint) ? fs::last_write_time(checkpoint) : fs::file_time_type::min();

  // The window during the attack is the flood, from its first connection to its
  // last, and at least kWindowSteps of the stage's steps: with the kernel's accept
  // queue at 1,024 the stranger opens its 20,000 in some 2 s, and the peer is still
  // shutting down what the queue held after that.
  int64_t most_descriptors = 0;
  Window during{"during", 0};
  {
    const auto start = Clock::now();
    during.from = run.watched_step();
    Stranger stranger(port, pid);
    const bool done = run.wait([&] { return stranger.opened + stranger.failed >= kConnections; }, 60s);
    const double flood_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    run.wait([&] { return run.watched_step() >= during.from + kWindowSteps; }, kWindowLimit);
    during.to = run.watched_step();
    during.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    most_descriptors = stranger.most_descriptors.load();
    MESSAGE(fmt::format("the stranger opened {} connections ({} failed) in {:.1f} s, held {} at the end",
                        stranger.opened.load(), stranger.failed.load(), flood_seconds, stranger.held.load()));
    CHECK(done);
    CHECK(stranger.opened >= kConnections * 9 / 10);
  }
  const Window after = run.measure("after");

  const int64_t limit = open_files_limit();
  protocol::RefusalCounts now = refusals_of(attacker, *target);
  const int64_t refused = now["connections_refused"] - at_start.at("connections_refused");
  const int64_t unfinished = now["unfinished_closed"] - at_start.at("unfinished_closed");
  MESSAGE(fmt::format("peer {}: descriptors {} before, at most {} during (limit {}); connections refused +{}, closed "
                      "unfinished +{}; RSS {} MiB",
                      victim, descriptors_before, most_descriptors, limit, refused, unfinished, rss_kib(pid) / 1024));
  // The per-source caps for two sources (256 each), and what the guard has yet to
  // shut down: within the reserve the guard keeps for checkpoints and clients.
  CHECK(most_descriptors <= descriptors_before + 1024);
  CHECK(most_descriptors < limit - 1024);
  CHECK(refused >= kConnections / 4);
  CHECK(fs::exists(checkpoint));
  CHECK(fs::last_write_time(checkpoint) > checkpoint_before);
  const std::string log = read_all(run.dir / (victim + ".log"));
  CHECK(log.find("checkpoint failed") == std::string::npos);
  CHECK(log.find("Too many open files") == std::string::npos);

  finish_and_judge(run, before, during, after, clean);
}

}  // namespace
}  // namespace swarm
