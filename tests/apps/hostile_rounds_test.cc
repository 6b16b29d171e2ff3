// Attacks on the stage's round protocol (swarm/averaging/round_protocol.h) over real
// processes and sockets, judged by what they are meant to do: stop the stage. A
// secured swarm (a bootstrap node, two stages of two `swarm peer` processes, a
// `swarm trainer`, all holding the secret) trains while this test, a member with
// its own identity, attacks stage 0. Stage 0's global step rate is measured in
// three windows (before the attack, during it, after it stops) from the stage's
// progress records; during and after must each hold at least 0.8 of before. At the
// end the stage-0 replicas must agree: the same step (within one) and, for every
// step two of them published, the same parameters hash.
//   - a forged progress record claiming step 2^40, re-announced twice a second;
//   - a steady stream of junk round messages (PARTs for groups and steps that do
//     not exist, in the wrong codec or of the wrong size, in a real peer's name;
//     JOINs with absurd samples and wrong hashes; BEGINs naming the attacker
//     leader; COMMIT, ABORT and DONE for random groups; malformed JSON);
//   - a flood of PARTs in the leader's name at the current step, at a stage of
//     three, where members hold parts that come before their BEGIN;
// and two that freeze the stage today, skipped (see each): a JOIN with the
// stage's own step and hash from a member that then sends nothing, and a copy of a
// peer's progress record under a lower id.
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <doctest/doctest.h>

#include "swarm/averaging/averaging_messages.h"
#include "swarm/averaging/progress.h"
#include "swarm/averaging/round_messages.h"
#include "swarm/compression/codecs.h"
#include "swarm/protocol/client_cache.h"
#include "swarm/protocol/records.h"
#include "swarm/protocol/stage_protocol.h"
#include "swarm/registry/dht_registry.h"
#include "swarm/security/identity.h"
#include "swarm/security/record_seal.h"
#include "tests/apps/swarm_process.h"
#include "transports/zmq/zmq_transport.h"

namespace swarm {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using namespace test_apps;  // spawn, read_all, read_metrics, temp_dir

constexpr const char* kSecret = "hostile rounds test secret";
constexpr int64_t kRssBoundKib = 256 * 1024;  // per peer process, as in hostile_swarm_test
constexpr int kSeqLen = 32;
constexpr auto kWindow = 12s;       // each of the three measurement windows
constexpr double kHeldFraction = 0.8;  // of the rate before the attack, during and after it
constexpr int64_t kFarStep = int64_t{1} << 40;
// Seconds each sample costs a peer on top of its compute (slept, not spun): steps
// take a few hundred ms, as with a real model, and the rate depends less on what
// else the machine runs.
constexpr const char* kEmulatedCost = "0.01";

// Waits until the file matches `pattern` (returns the first match's group 1) or the
// deadline passes, woken by inotify whenever a file in its folder is written.
std::string wait_for(const fs::path& file, const std::string& pattern, std::chrono::seconds within) {
  const std::regex re(pattern);
  const auto deadline = std::chrono::steady_clock::now() + within;
  const int notify = ::inotify_init1(IN_CLOEXEC);
  REQUIRE(notify >= 0);
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
    if (::read(notify, events, sizeof events) < 0) break;
  }
  ::close(notify);
  if (found.empty()) FAIL("no match for '" << pattern << "' in " << file << ":\n" << read_all(file));
  return found;
}

int64_t rss_kib(pid_t pid) {
  std::ifstream status(fmt::format("/proc/{}/status", pid));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

struct LivePeer {
  std::string id;
  int stage = 0;
  std::string compute;  // trainers' requests and info
  std::string control;  // round messages and state requests
};

// The attacker: a member with its own identity, its own DHT node, CURVE clients.
struct Attacker {
  security::SwarmCredentials credentials;
  std::string id;
  DhtRegistry registry;
  ClientCache<ZmqTransport> clients;

  static Attacker join(uint16_t bootstrap_port) {
    auto credentials = security::join_swarm(kSecret);
    REQUIRE(credentials.is_ok());
    auto id = security::peer_id_bound_to("mallory", credentials->self);
    REQUIRE(id.is_ok());
    DhtRegistryOptions options;
    options.sealer = security::make_record_sealer(*credentials);
    options.per_address_rate_limit = false;
    auto registry = DhtRegistry::start(0, {fmt::format("127.0.0.1:{}", bootstrap_port)}, options);
    REQUIRE(registry.is_ok());
    ClientOptions client;
    client.security = credentials->client_options();
    return Attacker{*credentials, *id, std::move(registry).value(), ClientCache<ZmqTransport>(client)};
  }

  Result<wire::Frames> call(const std::string& address, wire::Frames frames) {
    auto client = clients.get(address);
    if (client == nullptr) return unavailable("cannot connect to {}", address);
    return client->call(std::move(frames), Clock::now() + 5s).get();
  }

  Status announce(const std::string& key, const std::string& value, double ttl_seconds) {
    return registry.announce(key, id, value, registry.now() + ttl_seconds);
  }

  // Per peer id: where it serves, from the stage and progress records.
  std::map<std::string, LivePeer> find_peers(int stages) {
    std::map<std::string, LivePeer> peers;
    for (int s = 0; s < stages; ++s) {
      if (auto records = registry.get(stage_registry_key(s)); records.is_ok()) {
        for (const auto& r : *records) {
          auto a = PeerAnnouncementRecord::from_json(r.value);
          if (a.is_ok() && a->peer_id != id) peers[a->peer_id] = {a->peer_id, s, a->address, peers[a->peer_id].control};
        }
      }
      if (auto records = registry.get(progress_registry_key(s)); records.is_ok()) {
        for (const auto& r : *records) {
          auto p = ProgressRecord::from_json(r.value);
          if (p.is_ok() && p->peer_id != id) peers[p->peer_id].control = p->address;
        }
      }
    }
    std::erase_if(peers, [](const auto& e) { return e.second.compute.empty() || e.second.control.empty(); });
    return peers;
  }

  // The newest progress record of each of `ids` in `stage`'s key, as the registry shows it now.
  std::map<std::string, ProgressRecord> progress_of(int stage, const std::set<std::string>& ids) {
    std::map<std::string, ProgressRecord> out;
    auto records = registry.get(progress_registry_key(stage));
    if (!records.is_ok()) return out;
    for (const auto& r : *records) {
      auto p = ProgressRecord::from_json(r.value);
      if (!p.is_ok() || !ids.count(p->peer_id)) continue;
      auto it = out.find(p->peer_id);
      if (it == out.end() || p->published_at > it->second.published_at) out[p->peer_id] = std::move(p).value();
    }
    return out;
  }
};

wire::Frames must(Result<wire::Frames> frames) {
  REQUIRE_MESSAGE(frames.is_ok(), frames.status().to_string());
  return std::move(frames).value();
}

// The reply's kind and, for an error, its message; nullopt when no reply came.
struct Reply {
  bool answered = false;
  bool error = false;
  std::string text;
};
Reply reply_of(const Result<wire::Frames>& reply) {
  if (!reply.is_ok()) return {false, false, reply.status().to_string()};
  auto decoded = wire::decode_message(reply->views(), wire::Limits{});
  if (!decoded.is_ok()) return {true, false, "undecodable reply: " + decoded.status().to_string()};
  if (decoded->header.kind != wire::MessageKind::error) return {true, false, "an ok reply"};
  const Status status = wire::status_from_error_reply(decoded->header);
  return {true, true, status.to_string()};
}

protocol::RefusalCounts refusals_of(Attacker& attacker, const LivePeer& peer) {
  auto reply = attacker.call(peer.compute, must(protocol::encode_info_request(peer.stage)));
  REQUIRE_MESSAGE(reply.is_ok(), reply.status().to_string());
  auto info = protocol::parse_peer_info(*reply, wire::Limits{});
  REQUIRE_MESSAGE(info.is_ok(), info.status().to_string());
  return info->refusals;
}

// The attacker's own server, the address in its records and JOINs: counts what it
// is asked, by wire kind, and answers every request with an error, or (a black
// hole that acknowledges) with an empty ok.
struct MalloryServer {
  std::optional<ZmqServer> server;
  std::atomic<int64_t> served{0};
  std::mutex mu;
  std::map<std::string, int64_t> by_what;  // a round message's op, or the wire kind

  MalloryServer(const security::SwarmCredentials& credentials, bool answer_ok) {
    ServerOptions options;
    options.security = credentials.server_options();
    auto bound = ZmqTransport::bind("tcp://127.0.0.1:*", options);
    REQUIRE(bound.is_ok());
    server.emplace(std::move(bound).value());
    REQUIRE(server->serve([this, answer_ok](const PeerIdentity&, wire::Frames request) {
                    ++served;
                    auto decoded = wire::decode_message(request.views(), wire::Limits{});
                    wire::MessageHeader header;
                    std::string what = "undecodable";
                    if (decoded.is_ok()) {
                      header = decoded->header;
                      what = fmt::format("kind {}", static_cast<int>(header.kind));
                      auto meta = control_json(*decoded);
                      if (header.kind == wire::MessageKind::allreduce_part && meta.is_ok() && meta->contains("op") &&
                          (*meta)["op"].is_string()) {
                        what = (*meta)["op"].get<std::string>();
                      }
                    }
                    {
                      std::lock_guard lock(mu);
                      ++by_what[what];
                    }
                    if (!answer_ok) {
                      return wire::make_error_reply(header.request_id, header.stage,
                                                    failed_precondition("mallory serves nothing"));
                    }
                    wire::MessageHeader reply;
                    reply.kind = wire::MessageKind::result;
                    reply.stage = header.stage;
                    reply.request_id = header.request_id;
                    return wire::Frames{{wire::serialize_header(reply)}};
                  })
                .is_ok());
  }
  std::string asked() {
    std::lock_guard lock(mu);
    std::string out;
    for (const auto& [what, n] : by_what) out += fmt::format(" {}: {}", what, n);
    return out.empty() ? " nothing" : out;
  }
};

// One stage's global step rate over a window.
struct Window {
  const char* name = "";
  double seconds = 0;
  int64_t from = 0, to = 0;
  double rate() const { return seconds > 0 ? static_cast<double>(to - from) / seconds : 0; }
};

// The swarm under attack: 2 stages x 2 peers and a trainer, all with the secret;
// torn down (every child SIGTERMed and reaped) when the test case ends, passed or not.
// The children of a run, SIGTERMed and reaped when it ends, even when its start fails.
struct Children : std::vector<pid_t> {
  ~Children() {
    int status = 0;
    for (pid_t pid : *this) ::kill(pid, SIGTERM);
    for (pid_t pid : *this) ::waitpid(pid, &status, 0);
  }
};

struct HostileRun {
  Children children;
  fs::path dir;
  uint16_t port = 0;
  std::map<std::string, pid_t> peer_pids;  // by name: p00, p01, p10, p11
  pid_t trainer_pid = -1;
  std::unique_ptr<Attacker> attacker;
  std::map<std::string, LivePeer> peers;  // by peer id
  std::set<std::string> stage0;            // the honest stage-0 peer ids
  int64_t last_step = 0;                   // stage 0's, as last sampled

  // `stage0_peers` serve stage 0 (p00, p01, ...), two serve stage 1 (p10, p11).
  explicit HostileRun(const std::string& name, int stage0_peers = 2) : dir(temp_dir(name)) {
    ::setenv("SWARM_SECRET", kSecret, 1);  // the children inherit it
    fs::create_directories(dir);
    children.push_back(spawn({"bootstrap", "--port", "0"}, dir / "boot.log"));
    port = static_cast<uint16_t>(std::stoi(wait_for(dir / "boot.log", R"(listening on 127\.0\.0\.1:(\d+))", 20s)));
    const std::vector<std::string> model = {"--d-model", "32", "--layers", "2", "--heads", "2", "--seq-len",
                                            std::to_string(kSeqLen)};
    std::vector<std::string> names = {"p10", "p11"};
    for (int i = 0; i < stage0_peers; ++i) names.push_back(fmt::format("p0{}", i));
    for (const std::string& peer : names) {
      std::vector<std::string> args = {"peer", "--stage", peer.substr(1, 1), "--stages", "2", "--peer-id", peer,
                                       "--bootstrap", fmt::format("127.0.0.1:{}", port), "--global-batch", "16",
                                       "--lr", "1e-2", "--warmup", "2", "--allreduce-part-timeout", "1",
                                       "--emulated-cost", kEmulatedCost};
      args.insert(args.end(), model.begin(), model.end());
      peer_pids[peer] = spawn(args, dir / (peer + ".log"));
      children.push_back(peer_pids[peer]);
    }
    for (const auto& [peer, pid] : peer_pids) wait_for(dir / (peer + ".log"), R"(\(CURVE\))", 30s);
    // Stopped with SIGTERM once the three windows are measured; the limit is a backstop.
    std::vector<std::string> trainer = {"trainer", "--bootstrap", fmt::format("127.0.0.1:{}", port), "--stages", "2",
                                        "--run-dir", (dir / "run").string(), "--microbatch", "4",
                                        "--microbatches-per-step", "4", "--steps", "100000", "--time-limit", "150",
                                        "--eval-windows", "8", "--forward-timeout", "3", "--backward-timeout", "5"};
    trainer.insert(trainer.end(), model.begin(), model.end());
    fs::create_directories(dir / "run");
    trainer_pid = spawn(trainer, dir / "trainer.log");
    children.push_back(trainer_pid);
    wait_for(dir / "run" / "metrics.jsonl", R"("kind":"step",.*"step":5,)", 90s);

    attacker.reset(new Attacker(Attacker::join(port)));
    REQUIRE(attacker->registry.wait_connected(10s).is_ok());
    const auto found_by = Clock::now() + 20s;
    while (peers.size() < names.size() && Clock::now() < found_by) peers = attacker->find_peers(2);
    REQUIRE(peers.size() == names.size());
    for (const auto& [id, peer] : peers) {
      if (peer.stage == 0) stage0.insert(id);
    }
    REQUIRE(stage0.size() == static_cast<size_t>(stage0_peers));
  }

  std::vector<LivePeer> stage0_peers() const {
    std::vector<LivePeer> out;
    for (const auto& id : stage0) out.push_back(peers.at(id));
    return out;
  }

  // Stage 0's global step: the highest its honest peers publish (never less than
  // last seen: a DHT lookup may miss a record).
  int64_t stage0_step() {
    for (const auto& [id, r] : attacker->progress_of(0, stage0)) last_step = std::max(last_step, r.step);
    return last_step;
  }

  // Stage 0's rate over the next `length`.
  Window measure(const char* name, std::chrono::seconds length) {
    const auto start = Clock::now();
    const int64_t from = stage0_step();
    std::this_thread::sleep_until(start + length);
    const int64_t to = stage0_step();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return Window{name, seconds, from, to};
  }

  // The trainer stops (SIGTERM: it drains and writes its last records); the peers
  // then take no more samples, so their steps stand still.
  void stop_trainer() {
    ::kill(trainer_pid, SIGTERM);
    int status = 0;
    REQUIRE(::waitpid(trainer_pid, &status, 0) == trainer_pid);
    children.erase(std::find(children.begin(), children.end(), trainer_pid));
    const std::string log = read_all(dir / "trainer.log");
    INFO(log.substr(log.size() > 3000 ? log.size() - 3000 : 0));
    CHECK(WIFEXITED(status));
  }

  // Every stage-0 replica at one step (within one) and identical at every step both published.
  void check_replicas_agree() {
    std::this_thread::sleep_for(1500ms);  // records published after the last round settled
    std::map<std::string, ProgressRecord> last;
    const auto read_by = Clock::now() + 10s;
    while (last.size() < stage0.size() && Clock::now() < read_by) last = attacker->progress_of(0, stage0);
    REQUIRE(last.size() == stage0.size());
    int64_t low = std::numeric_limits<int64_t>::max(), high = 0;
    std::map<int64_t, std::set<uint64_t>> at_step;
    std::string ends;
    for (const auto& [id, r] : last) {
      low = std::min(low, r.step);
      high = std::max(high, r.step);
      at_step[r.step].insert(r.params_hash);
      ends += fmt::format(" {} step {} hash {};", id.substr(0, 3), r.step, hex64(r.params_hash));
    }
    MESSAGE("stage 0 ends at" << ends);
    CHECK(high - low <= 1);
    for (const auto& [step, hashes] : at_step) CHECK(hashes.size() == 1);

    std::map<int64_t, std::map<std::string, std::string>> hashes;  // step -> peer -> hash
    for (const auto& r : read_metrics(dir / "run")) {
      if (r["kind"] != "replica" || r["stage"] != 0 || !stage0.count(r["peer"].get<std::string>())) continue;
      hashes[r["step"].get<int64_t>()][r["peer"].get<std::string>()] = r["hash"];
    }
    int shared = 0, differ = 0;
    for (const auto& [step, by_peer] : hashes) {
      if (by_peer.size() < 2) continue;
      ++shared;
      std::set<std::string> distinct;
      std::string all;
      for (const auto& [peer, hash] : by_peer) {
        distinct.insert(hash);
        all += fmt::format(" {} {}", peer.substr(0, 3), hash);
      }
      if (distinct.size() > 1) {
        ++differ;
        MESSAGE("step " << step << ":" << all);
      }
    }
    MESSAGE("the run's metrics hold " << shared << " stage-0 steps two or more replicas published; " << differ
                                      << " differ");
    CHECK(differ == 0);
    CHECK(shared > 10);
  }

  void check_rss() {
    for (const auto& [name, pid] : peer_pids) {
      INFO("peer " << name);
      int status = 0;
      CHECK(::waitpid(pid, &status, WNOHANG) == 0);  // alive
      const int64_t rss = rss_kib(pid);
      MESSAGE("peer " << name << " RSS " << rss / 1024 << " MiB (bound " << kRssBoundKib / 1024 << " MiB)");
      CHECK(rss > 0);
      CHECK(rss < kRssBoundKib);
    }
  }
};

void check_rates(const Window& before, const Window& during, const Window& after) {
  for (const Window* w : {&before, &during, &after}) {
    MESSAGE(fmt::format("stage 0 {:>6}: steps {} -> {} in {:.1f} s: {:.2f} global steps/s", w->name, w->from, w->to,
                        w->seconds, w->rate()));
  }
  CHECK(before.to - before.from >= 5);  // the stage trained: a rate to hold
  CHECK(during.rate() >= kHeldFraction * before.rate());
  CHECK(after.rate() >= kHeldFraction * before.rate());
}

// Runs `body` on its own thread until stop() (at most once a `period`).
class Repeating {
 public:
  Repeating(std::chrono::milliseconds period, std::function<void()> body) : thread_([this, period, body] {
      std::unique_lock lock(mu_);
      do {
        lock.unlock();
        body();
        lock.lock();
      } while (!cv_.wait_for(lock, period, [&] { return stopped_; }));
    }) {}
  ~Repeating() { stop(); }
  void stop() {
    {
      std::lock_guard lock(mu_);
      stopped_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = false;
  std::thread thread_;
};

TEST_CASE("a forged progress record at step 2^40 cannot freeze its stage") {
  HostileRun run("hostile-rounds-forged");
  Attacker& attacker = *run.attacker;
  MalloryServer mallory(attacker.credentials, /*answer_ok=*/false);
  std::map<std::string, protocol::RefusalCounts> before_counts;
  for (const auto& peer : run.stage0_peers()) before_counts[peer.id] = refusals_of(attacker, peer);

  std::this_thread::sleep_for(2s);  // past the start of training
  const Window before = run.measure("before", kWindow);

  // As convincing as a forger can make it: serving, committed with the real peers,
  // the step in its recent hashes too.
  ProgressRecord forged;
  forged.peer_id = attacker.id;
  forged.address = mallory.server->address();
  forged.stage = 0;
  forged.step = kFarStep;
  forged.params_hash = 0x5eedbadc0ffee;
  forged.samples = 16;
  forged.samples_per_second = 1000;
  forged.state = ProgressRecord::State::serving;
  forged.committed_group = 0x1234567;
  forged.committed_members.assign(run.stage0.begin(), run.stage0.end());
  forged.committed_members.push_back(attacker.id);
  std::sort(forged.committed_members.begin(), forged.committed_members.end());
  forged.stage_mates_seen = 2;
  forged.recent_hashes = {{kFarStep - 1, 0x5eedbadc0ffef}, {kFarStep, forged.params_hash}};
  int64_t announced = 0;
  Window during;
  {
    Repeating forger(500ms, [&] {  // twice a second, like a peer
      forged.published_at = attacker.registry.now();
      if (attacker.announce(progress_registry_key(0), forged.to_json(), 5).is_ok()) ++announced;
    });
    std::this_thread::sleep_for(1s);  // the record is in the DHT
    during = run.measure("during", kWindow);
  }
  MESSAGE("the forged record announced " << announced << " times");
  CHECK(announced >= 20);
  // The record lapses (5 s) before the window after the attack.
  std::this_thread::sleep_for(6s);
  const Window after = run.measure("after", kWindow);

  for (const auto& peer : run.stage0_peers()) {
    const protocol::RefusalCounts now = refusals_of(attacker, peer);
    const int64_t unvouched = now.at("unvouched_ahead") - before_counts[peer.id]["unvouched_ahead"];
    MESSAGE("peer " << peer.id << " counted " << unvouched << " unvouched records ahead");
    CHECK(unvouched > 0);
  }
  MESSAGE("the forged record's address was asked " << mallory.served.load() << " times");
  CHECK(mallory.served.load() == 0);  // nobody downloaded from it, nor JOINed it
  run.stop_trainer();
  check_rates(before, during, after);
  run.check_rss();
  run.check_replicas_agree();
}

// ---- the junk round messages ----

struct Junk {
  std::string kind;
  wire::Frames frames;
};

// The junk a peer answers with ok, as round_protocol.cc means it to; each is harmless:
//  - StageRounds::on_abort: an ABORT of a group the peer is not in is "over already";
//  - StageRounds::on_part: a PART in its leader's name at its step, while it waits for
//    that leader's BEGIN, is held (bounded by max_early_values) until a part of another
//    group or the BEGIN arrives. The attacker's view of the step lags by up to a
//    publication period, so its "next step" is at times the step the peer is at.
// Every other kind must be refused with an error reply, every time.
constexpr const char* kAbortRandom = "abort, random group";
constexpr const char* kLeadersPartNow = "part in the leader's name, current step";
constexpr const char* kLeadersPartNext = "part in the leader's name, next step";
bool answered_ok_by_design(const std::string& kind) {
  return kind == kAbortRandom || kind == kLeadersPartNow || kind == kLeadersPartNext;
}

// What the attacker knows of the stage (from its records): the step, the leader.
struct StageNow {
  int64_t step = 0;
  uint64_t hash = 0;
  std::string leader;
};

class JunkMaker {
 public:
  JunkMaker(const std::string& attacker, std::vector<std::string> honest, uint64_t seed)
      : attacker_(attacker), honest_(std::move(honest)), rng_(seed),
        codec_(RoundCodec::of<compression::StandardCodecs>(CodecId::blockwise8)) {}

  // Kinds in turn, each aimed at `target`.
  Junk next(const std::string& target, const StageNow& now) {
    const int kind = static_cast<int>(count_++ % 22);
    const std::string other = honest_[0] == target ? honest_[1] : honest_[0];
    switch (kind) {
      case 0: return part("part, attacker leads, current step", attacker_, attacker_, now.step);
      case 1: return part("part, attacker leads, next step", attacker_, attacker_, now.step + 1);
      case 2: return part("part, attacker leads, step 2^40", attacker_, attacker_, kFarStep);
      case 3: return part("part, step 2^40 in the leader's name", attacker_, now.leader, kFarStep);
      case 4: return part("part as a real peer (impostor)", other, now.leader, now.step);
      case 5: return part("part as the target itself", target, now.leader, now.step);
      case 6: return part(kLeadersPartNow, attacker_, now.leader, now.step);
      case 7: return part(kLeadersPartNext, attacker_, now.leader, now.step + 1);
      case 8: return raw_codec_part(now);
      case 9: return short_part(now);
      case 10: return nan_part(now);
      case 11: return join("join, huge samples, wrong hash", now.step, INT64_MAX / 2, now.hash ^ 0x9e3779b97f4a7c15);
      case 12: return join("join, step 2^40", kFarStep, 1'000'000'000'000, now.hash + 1);
      case 13: return begin(target, now.step, "begin, the attacker leads");
      case 14: return simple("commit, attacker leads", RoundOp::commit, attacker_, now.step);
      case 15: return simple("commit in the leader's name", RoundOp::commit, now.leader, now.step);
      case 16: return simple(kAbortRandom, RoundOp::abort, now.leader, now.step);
      case 17: return simple("done, random group", RoundOp::done, now.leader, now.step);
      case 18: return malformed("malformed JSON", R"({"op": "part", "step": 3, "sender": )");
      case 19: return join("join, next step, huge samples, wrong hash", now.step + 1, INT64_MAX / 2, rng_());
      case 20: return begin(target, now.step + 1, "begin, the attacker leads, next step");
      default:
        return malformed("wrong JSON types",
                         fmt::format(R"({{"op": "join", "step": "ten", "sender": ["{}"], "samples": -1.5}})",
                                     attacker_));
    }
  }

 private:
  uint64_t group() { return rng_() | 1; }

  // No REQUIRE here: the stream runs on its own thread. A message that cannot be
  // encoded goes out as no frames, which the tally counts apart.
  static wire::Frames encoded(Result<wire::Frames> frames) {
    return frames.is_ok() ? std::move(frames).value() : wire::Frames{};
  }

  RoundMessage base(RoundOp op, const std::string& sender, const std::string& leader, int64_t step) {
    RoundMessage m;
    m.op = op;
    m.stage = 0;
    m.step = step;
    m.sender = sender;
    m.leader = leader;
    m.group = group();
    m.params_hash = rng_();
    return m;
  }

  std::vector<float> values(size_t n) {
    std::uniform_real_distribution<float> u(-1, 1);
    std::vector<float> v(n);
    for (auto& x : v) x = u(rng_);
    return v;
  }

  Junk part(const std::string& kind, const std::string& sender, const std::string& leader, int64_t step) {
    RoundMessage m = base(RoundOp::part, sender, leader, step);
    m.phase = 0;
    m.part = 1;
    m.from = 0;
    m.chunk = 0;
    m.values = values(256);
    return {kind, encoded(encode_round_message(m, codec_))};
  }

  Junk raw_codec_part(const StageNow& now) {
    RoundMessage m = base(RoundOp::part, attacker_, now.leader, now.step);
    m.part = 1;
    m.values = values(256);
    return {"part in the wrong codec (raw f32)", encoded(encode_round_message(m, RoundCodec::raw()))};
  }

  Junk short_part(const StageNow& now) {
    // The wire library will not encode it: a valid part, its payload cut by hand.
    Junk junk = part("part of junk bytes, wrong size", attacker_, now.leader, now.step);
    if (!junk.frames.parts.empty()) junk.frames.parts.back() = wire::Frame(std::string(100, '\x7f'));
    return junk;
  }

  Junk nan_part(const StageNow& now) {
    RoundMessage m = base(RoundOp::part, attacker_, now.leader, now.step);
    m.part = 1;
    std::string junk(260, '\xff');  // the size of 256 values, a NaN for their scale
    return {"part of junk bytes, NaN scale",
            encoded(encode_round_part(m, CodecId::blockwise8, 256, wire::Frame(std::move(junk))))};
  }

  Junk join(const std::string& kind, int64_t step, int64_t samples, uint64_t hash) {
    RoundMessage m = base(RoundOp::join, attacker_, "", step);
    m.address = "tcp://127.0.0.1:9";
    m.samples = samples;
    m.samples_per_second = 1e9;
    m.params_hash = hash;
    return {kind, encoded(encode_round_message(m, codec_))};
  }

  Junk begin(const std::string& target, int64_t step, const std::string& kind) {
    RoundMessage m = base(RoundOp::begin, attacker_, attacker_, step);
    m.members = {{attacker_, "tcp://127.0.0.1:9", 16}, {target, "tcp://127.0.0.1:9", 16}};
    std::sort(m.members.begin(), m.members.end(),
              [](const RoundMember& a, const RoundMember& b) { return a.peer_id < b.peer_id; });
    return {kind, encoded(encode_round_message(m, codec_))};
  }

  Junk simple(const std::string& kind, RoundOp op, const std::string& leader, int64_t step) {
    RoundMessage m = base(op, attacker_, leader, step);
    m.reason = "mallory says so";
    return {kind, encoded(encode_round_message(m, codec_))};
  }

  Junk malformed(const std::string& kind, std::string json) {
    wire::MessageHeader header;
    header.kind = wire::MessageKind::allreduce_part;
    header.stage = 0;
    const int64_t size = static_cast<int64_t>(json.size());
    const wire::EncodedTensor tensors[] = {{DType::u8, wire::Codec::none, {size}, wire::Frame(std::move(json))}};
    return {kind, encoded(wire::encode_message_payloads(header, tensors))};
  }

  std::string attacker_;
  std::vector<std::string> honest_;
  std::mt19937_64 rng_;
  RoundCodec codec_;
  uint64_t count_ = 0;
};

struct Tally {
  int64_t sent = 0, refused = 0, accepted = 0, unanswered = 0, unencodable = 0;
  std::string last_refusal, last_other;
};

TEST_CASE("junk round messages from a member cannot freeze its stage") {
  HostileRun run("hostile-rounds-junk");
  Attacker& attacker = *run.attacker;
  const std::vector<LivePeer> targets = run.stage0_peers();
  std::map<std::string, protocol::RefusalCounts> before_counts;
  for (const auto& peer : targets) before_counts[peer.id] = refusals_of(attacker, peer);

  std::this_thread::sleep_for(2s);
  const Window before = run.measure("before", kWindow);

  // The stage as its records show it, re-read every 0.2 s by the stream itself.
  JunkMaker maker(attacker.id, {targets[0].id, targets[1].id}, 20240611);
  std::map<std::string, Tally> tally;  // by kind
  std::atomic<bool> attacking{true};
  std::thread stream([&] {
    StageNow now;
    auto read_at = Clock::now() - 1s;
    for (size_t i = 0; attacking.load(); ++i) {
      if (Clock::now() - read_at > 200ms) {
        read_at = Clock::now();
        auto records = attacker.progress_of(0, run.stage0);
        if (!records.empty()) {
          // The leader is the lowest id at the stage's step: the attacker reads it as they do.
          now.step = -1;
          for (const auto& [id, r] : records) {
            if (r.step > now.step) now = {r.step, r.params_hash, id};  // ordered by id: the lowest wins ties
          }
        }
      }
      const LivePeer& target = targets[i % targets.size()];
      Junk junk = maker.next(target.id, now);
      Tally& t = tally[junk.kind];
      if (junk.frames.parts.empty()) {
        ++t.unencodable;
        continue;
      }
      ++t.sent;
      const Reply reply = reply_of(attacker.call(target.control, std::move(junk.frames)));
      if (!reply.answered) {
        ++t.unanswered;
        t.last_other = reply.text;
      } else if (reply.error) {
        ++t.refused;
        t.last_refusal = reply.text;
      } else {
        ++t.accepted;
        t.last_other = reply.text;
      }
      std::this_thread::sleep_for(4ms);  // a steady stream, ~200 a second
    }
  });
  std::this_thread::sleep_for(1s);
  const Window during = run.measure("during", kWindow);
  attacking = false;
  stream.join();
  const Window after = run.measure("after", kWindow);

  int64_t sent = 0, refused = 0;
  for (const auto& [kind, t] : tally) {
    MESSAGE(fmt::format("{:>42}: {:>4} sent, {:>4} refused, {} accepted, {} unanswered; {}", kind, t.sent, t.refused,
                        t.accepted, t.unanswered, t.accepted + t.unanswered > 0 ? t.last_other : t.last_refusal));
    INFO("kind " << kind << ": " << t.last_other);
    CHECK(t.unencodable == 0);
    CHECK(t.unanswered == 0);
    if (!answered_ok_by_design(kind)) CHECK(t.refused == t.sent);
    sent += t.sent;
    refused += t.refused;
  }
  MESSAGE(sent << " junk round messages sent, " << refused << " refused with an error reply (the rest: ok by design, "
               << "see answered_ok_by_design)");
  CHECK(sent >= 300);
  for (const auto& peer : targets) {
    const protocol::RefusalCounts now = refusals_of(attacker, peer);
    std::string grown;
    for (const auto& [name, count] : now) {
      const int64_t d = count - before_counts[peer.id][name];
      if (d != 0) grown += fmt::format(" {}+{}", name, d);
    }
    MESSAGE("peer " << peer.id << " refusal counters grew:" << grown);
    CHECK(now.at("parts") > before_counts[peer.id]["parts"]);
  }
  run.stop_trainer();
  check_rates(before, during, after);
  run.check_rss();
  run.check_replicas_agree();
}


// Lines of the stage-0 peers' logs that name `what`, counted, with the last one.
std::string log_lines(HostileRun& run, const std::string& what) {
  std::string out;
  for (const auto& [name, pid] : run.peer_pids) {
    if (name[1] != '0') continue;
    const std::string log = read_all(run.dir / (name + ".log"));
    int64_t n = 0;
    std::string last;
    size_t at = 0;
    while ((at = log.find(what, at)) != std::string::npos) {
      ++n;
      const size_t line = log.rfind('\n', at) + 1;
      const size_t end = std::min(log.find('\n', at), log.size());
      last = log.substr(line, end - line);
      at = end;
    }
    out += fmt::format("\n  {}: {} lines with '{}'{}{}", name, n, what, n ? "; the last: " : "", last);
  }
  return out;
}

// Froze its stage (2.00 -> 0.00 steps/s) before members whose contribution never
// came were benched: the leader took the member's JOIN (it names the step and hash
// the records show) into every round, the member acknowledged the BEGIN and the
// parts and never sent its own, and every round was aborted at the part deadline.
// Now the owners it left waiting bench it (StageRounds::bench), longer each time.
TEST_CASE("a member that JOINs with the stage's own step and hash, then sends nothing, cannot freeze its stage") {
  HostileRun run("hostile-rounds-join");
  Attacker& attacker = *run.attacker;
  MalloryServer hole(attacker.credentials, /*answer_ok=*/true);
  // Any name bound to its key speaks for it; one above the peers' ids, so the leader stays the leader.
  auto high = security::peer_id_bound_to("zed", attacker.credentials.self);
  REQUIRE(high.is_ok());
  const std::vector<std::string> names = {*high};
  const RoundCodec codec = RoundCodec::of<compression::StandardCodecs>(CodecId::blockwise8);

  std::this_thread::sleep_for(2s);
  const Window before = run.measure("before", kWindow);

  std::map<std::string, Tally> tally;  // by attacker id
  std::atomic<bool> attacking{true};
  std::thread joiner([&] {
    while (attacking.load()) {
      for (const auto& [id, r] : attacker.progress_of(0, run.stage0)) {
        for (const auto& name : names) {
          RoundMessage m;
          m.op = RoundOp::join;
          m.stage = 0;
          m.step = r.step;
          m.sender = name;
          m.address = hole.server->address();
          m.samples = 16;
          m.samples_per_second = 100;
          m.params_hash = r.params_hash;
          auto frames = encode_round_message(m, codec);
          if (!frames.is_ok()) continue;
          Tally& t = tally[name];
          ++t.sent;
          const Reply reply = reply_of(attacker.call(r.address, std::move(frames).value()));
          (reply.error ? t.refused : reply.answered ? t.accepted : t.unanswered) += 1;
          (reply.error ? t.last_refusal : t.last_other) = reply.text;
        }
      }
      std::this_thread::sleep_for(50ms);
    }
  });
  std::this_thread::sleep_for(1s);
  const Window during = run.measure("during", kWindow);
  attacking = false;
  joiner.join();
  std::this_thread::sleep_for(2s);
  const Window after = run.measure("after", kWindow);

  for (const auto& [name, t] : tally) {
    MESSAGE(fmt::format("JOINs as {}: {} sent, {} accepted, {} refused ({}), {} unanswered", name, t.sent,
                        t.accepted, t.refused, t.last_refusal, t.unanswered));
  }
  MESSAGE("the attacker's server was asked" << hole.asked() << log_lines(run, "aborted"));
  run.stop_trainer();
  check_rates(before, during, after);
  run.check_replicas_agree();
}

// Froze its stage (2.00 -> 0.00 steps/s) while choose_leader took the lowest id
// among the fresh records at the step, a member of the committed membership or
// not: a copy of a peer's record under "mallory.<fingerprint>" made every peer
// JOIN mallory, which acknowledged and never sent a BEGIN. Now only members lead
// where a member is present.
TEST_CASE("a forged progress record at the stage's own step and hash, under a lower id, cannot freeze its stage") {
  HostileRun run("hostile-rounds-lead");
  Attacker& attacker = *run.attacker;
  MalloryServer hole(attacker.credentials, /*answer_ok=*/true);
  REQUIRE(attacker.id < *run.stage0.begin());  // "mallory." sorts before "p00.": the leader, if believed

  std::this_thread::sleep_for(2s);
  const Window before = run.measure("before", kWindow);

  int64_t announced = 0;
  Window during;
  {
    // A copy of the stage's newest record, re-announced as the stage moves.
    Repeating forger(100ms, [&] {
      auto records = attacker.progress_of(0, run.stage0);
      if (records.empty()) return;
      ProgressRecord forged = std::max_element(records.begin(), records.end(), [](const auto& a, const auto& b) {
                                return a.second.step < b.second.step;
                              })->second;
      forged.peer_id = attacker.id;
      forged.address = hole.server->address();
      forged.state = ProgressRecord::State::serving;
      forged.published_at = attacker.registry.now();
      if (attacker.announce(progress_registry_key(0), forged.to_json(), 5).is_ok()) ++announced;
    });
    std::this_thread::sleep_for(1s);
    during = run.measure("during", kWindow);
  }
  std::this_thread::sleep_for(6s);  // the forged record lapses
  const Window after = run.measure("after", kWindow);

  MESSAGE("the forged record announced " << announced << " times; the attacker's server was asked" << hole.asked()
                                         << log_lines(run, "aborted"));
  run.stop_trainer();
  check_rates(before, during, after);
  run.check_replicas_agree();
}

TEST_CASE("a flood of parts in the leader's name at the current step cannot freeze a stage of three") {
  HostileRun run("hostile-rounds-early", /*stage0_peers=*/3);
  Attacker& attacker = *run.attacker;
  const std::vector<LivePeer> targets = run.stage0_peers();
  const RoundCodec codec = RoundCodec::of<compression::StandardCodecs>(CodecId::blockwise8);

  std::this_thread::sleep_for(2s);
  const Window before = run.measure("before", kWindow);

  // A part of a group nobody began, in the name of the round's leader, at the step the
  // stage is at: a member waiting for its leader's BEGIN holds such a part.
  Tally tally;
  std::atomic<bool> attacking{true};
  std::thread flood([&] {
    std::mt19937_64 rng(7);
    StageNow now;
    auto read_at = Clock::now() - 1s;
    for (size_t i = 0; attacking.load(); ++i) {
      if (Clock::now() - read_at > 100ms) {
        read_at = Clock::now();
        auto records = attacker.progress_of(0, run.stage0);
        now.step = -1;
        for (const auto& [id, r] : records) {
          if (r.step > now.step) now = {r.step, r.params_hash, id};
        }
      }
      const LivePeer& target = targets[i % targets.size()];
      if (target.id == now.leader || now.step < 0) continue;
      RoundMessage m;
      m.op = RoundOp::part;
      m.stage = 0;
      m.step = now.step;
      m.sender = attacker.id;
      m.leader = now.leader;
      m.group = rng() | 1;
      m.params_hash = now.hash;
      m.part = 1;
      m.values.assign(64, 0.25f);
      auto frames = encode_round_message(m, codec);
      if (!frames.is_ok()) continue;
      ++tally.sent;
      const Reply reply = reply_of(attacker.call(target.control, std::move(frames).value()));
      (reply.error ? tally.refused : reply.answered ? tally.accepted : tally.unanswered) += 1;
      (reply.error ? tally.last_refusal : tally.last_other) = reply.text;
      // Some 250 a second: the attacker's CPU is the peers' here, not another machine's.
      // (Unpaused, over 1000 a second cost 12% of the rate once, with no round aborted.)
      std::this_thread::sleep_for(1ms);
    }
  });
  std::this_thread::sleep_for(1s);
  const Window during = run.measure("during", kWindow);
  attacking = false;
  flood.join();
  std::this_thread::sleep_for(2s);
  const Window after = run.measure("after", kWindow);

  MESSAGE(fmt::format("parts in the leader's name: {} sent, {} accepted ({}), {} refused ({}), {} unanswered",
                      tally.sent, tally.accepted, tally.last_other, tally.refused, tally.last_refusal,
                      tally.unanswered)
          << log_lines(run, "aborted"));
  run.stop_trainer();
  check_rates(before, during, after);
  run.check_rss();
  run.check_replicas_agree();
}

}  // namespace
}  // namespace swarm
