// A secured swarm under attack from one of its own members, over real processes and
// sockets: a bootstrap node, two stages of two `swarm peer` processes and a
// `swarm trainer`, all holding the secret, while this test (also holding it, with
// its own identity) sends every kind of hostile input it can:
//   - state requests with overflowing offsets and lengths;
//   - registry records with wrong JSON types, from the far future, and a forged
//     progress record claiming a much later step, pointing at a forged state;
//   - all-reduce parts from a non-member, posing as a member, far in the future,
//     with absurd weights;
//   - oversized batches;
//   - a fake stage-1 peer whose replies have the wrong dtype and shape;
//   - a flood of valid-looking forward requests.
// Each peer must keep serving the honest trainer (which finishes with no microbatch
// abandoned and its loss falling), stay under an RSS bound, and count each attack.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <doctest/doctest.h>

#include "swarm/averaging/all_reduce.h"
#include "swarm/averaging/progress.h"
#include "swarm/averaging/state_transfer.h"
#include "swarm/protocol/records.h"
#include "swarm/protocol/stage_protocol.h"
#include "swarm/registry/dht_registry.h"
#include "swarm/security/identity.h"
#include "swarm/security/record_seal.h"
#include "tests/apps/hostile_member.h"
#include "tests/apps/swarm_process.h"
#include "transports/zmq/zmq_transport.h"

namespace swarm {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using namespace test_apps;  // spawn, wait_for, read_all, rss_kib, temp_dir
using hostile::Attacker;
using hostile::LivePeer;
using hostile::must;
using hostile::refusals_of;

constexpr const char* kSecret = "hostile swarm test secret";
constexpr int64_t kRssBoundKib = 256 * 1024;  // per peer process: 24-98 MiB measured under these attacks
constexpr int kSeqLen = 32;
constexpr double kRecordTtl = 60;  // seconds the attacker's records live

bool is_error_reply(const Result<wire::Frames>& reply) {
  if (!reply.is_ok()) return false;
  auto decoded = wire::decode_message(reply->views(), wire::Limits{});
  return decoded.is_ok() && decoded->header.kind == wire::MessageKind::error;
}

// Until every peer's bad_records counter passes its value in `since`: each check is a
// round trip to the peer, and the peers read the registry every 0.2 s.
void wait_until_bad_records_grow(Attacker& attacker, const std::vector<LivePeer>& peers,
                                 std::map<std::string, protocol::RefusalCounts>& since) {
  const auto deadline = Clock::now() + 20s;
  for (const auto& peer : peers) {
    while (refusals_of(attacker, peer)["bad_records"] <= since[peer.id]["bad_records"]) {
      REQUIRE_MESSAGE(Clock::now() < deadline, "peer " << peer.id << " never refused the record");
    }
  }
}

// ---- the attacks: each returns how many hostile messages it sent to `peer` ----

int overflowing_state_requests(Attacker& a, const LivePeer& peer) {
  const int64_t max = std::numeric_limits<int64_t>::max();
  const std::vector<nlohmann::json> requests = {
      {{"op", "chunk"}, {"hash", 1}, {"offset", max - 1}, {"length", 1 << 20}},
      {{"op", "chunk"}, {"hash", 1}, {"offset", 0}, {"length", max}},
      {{"op", "chunk"}, {"hash", "one"}, {"offset", -5}, {"length", 16}},
      {{"op", "chunk"}, {"hash", 1}, {"offset", 1.5e300}, {"length", 16}},
  };
  for (const auto& meta : requests) CHECK(is_error_reply(a.call(peer.control, must(encode_state_request(peer.stage, meta)))));
  return static_cast<int>(requests.size());
}

int hostile_parts(Attacker& a, const LivePeer& peer, int64_t near_step) {
  const std::vector<float> values(16, 0.5f);
  struct Part {
    std::string sender;
    int64_t step;
    double weight;
  };
  const std::vector<Part> parts = {
      {a.id, near_step + 1, 1.0},                                 // not a member
      {peer.id, near_step + 1, 1.0},                              // posing as the peer itself
      {a.id, std::numeric_limits<int64_t>::max() / 2, 1.0},        // far future
      {a.id, near_step + 1, 1e300},                               // absurd weight
      {a.id, near_step + 1, -4.0},                                // negative weight
  };
  for (const auto& p : parts) {
    auto frames = all_reduce_detail::encode_part(peer.stage, 42, p.step, 0, 0, 0, 0, p.sender, p.weight, 7, values);
    CHECK(is_error_reply(a.call(peer.control, must(std::move(frames)))));
  }
  return static_cast<int>(parts.size());
}

protocol::StageRequest forward_of(int64_t rows, uint64_t microbatch_id) {
  std::vector<int32_t> tokens(static_cast<size_t>(rows * kSeqLen), 65);
  std::string bytes(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(int32_t));
  protocol::StageRequest request;
  request.kind = wire::MessageKind::forward;
  request.request_id = microbatch_id;
  request.input = wire::EncodedTensor{DType::i32, CodecId::none, {rows, kSeqLen}, wire::Frame(std::move(bytes))};
  request.microbatch_id = microbatch_id;
  request.deadline_unix_ms = protocol::unix_millis_now() + 5000;
  return request;
}

int oversized_batch(Attacker& a, const LivePeer& stage0) {
  auto frames = protocol::encode_request(forward_of(4096, 1), 0, CodecId::blockwise8);
  CHECK(is_error_reply(a.call(stage0.compute, must(std::move(frames)))));
  return 1;
}

// Registry records: wrong types in every record kind, one from the far future, and a
// progress record claiming a step far ahead, served by a donor of junk. Returns the
// last, which the attacker keeps fresh.
ProgressRecord hostile_records(Attacker& a, int stage, const std::string& junk_donor) {
  const double now = a.registry.now();
  // In stage 0's key, so it stays beside the fake stage-1 peer announced later.
  REQUIRE(a.announce(stage_registry_key(0), fmt::format(R"({{"peer": "{}", "address": 7, "stage": "one"}})", a.id),
                     kRecordTtl)
              .is_ok());
  REQUIRE(a.announce(progress_registry_key(1 - stage),
                     fmt::format(R"({{"peer": "{}", "address": [], "step": "ten", "samples": -1}})", a.id), kRecordTtl)
              .is_ok());
  ProgressRecord ahead;
  ahead.peer_id = a.id;
  ahead.address = junk_donor;
  ahead.stage = stage;
  ahead.step = 1000000;
  ahead.params_hash = 0xbad;
  ahead.published_at = now;
  ahead.stage_mates_seen = 1;
  REQUIRE(a.announce(progress_registry_key(stage), ahead.to_json(), kRecordTtl).is_ok());
  return ahead;
}

void future_record(Attacker& a, int stage) {
  ProgressRecord future;
  future.peer_id = a.id;
  future.stage = stage;
  future.address = "tcp://127.0.0.1:9";
  future.published_at = a.registry.now() + 1e6;
  REQUIRE(a.announce(progress_registry_key(stage), future.to_json(), kRecordTtl).is_ok());
}

// Answers everything wrongly: stage replies of the wrong dtype or shape, junk state.
struct HostileServer {
  std::optional<ZmqServer> server;
  std::atomic<int64_t> served{0};

  explicit HostileServer(const security::SwarmCredentials& credentials) {
    ServerOptions options;
    options.security = credentials.server_options();
    auto bound = ZmqTransport::bind("tcp://127.0.0.1:*", options);
    REQUIRE(bound.is_ok());
    server.emplace(std::move(bound).value());
    REQUIRE(server->serve([this](const PeerIdentity&, wire::Frames request) { return answer(request); }).is_ok());
  }

  wire::Frames answer(const wire::Frames& request) {
    auto decoded = wire::decode_message(request.views(), wire::Limits{});
    const uint64_t id = decoded.is_ok() ? decoded->header.request_id : 0;
    const int64_t n = served.fetch_add(1);
    wire::MessageHeader header;
    header.kind = wire::MessageKind::result;
    header.stage = decoded.is_ok() ? decoded->header.stage : 0;
    header.request_id = id;
    // Alternately the wrong dtype (i32 where floats belong) and the wrong shape.
    const std::vector<int64_t> dims = n % 2 == 0 ? std::vector<int64_t>{8, kSeqLen, 128} : std::vector<int64_t>{3, 5};
    int64_t count = 1;
    for (int64_t d : dims) count *= d;
    std::string bytes(static_cast<size_t>(count * 4), '\0');
    const std::vector<wire::EncodedTensor> tensors{
        {n % 2 == 0 ? DType::i32 : DType::f32, CodecId::none, dims, wire::Frame(std::move(bytes))}};
    auto frames = wire::encode_message_payloads(header, tensors);
    return frames.is_ok() ? std::move(frames).value() : wire::Frames{};
  }
};

// Many valid-looking forwards in flight at once.
int flood(Attacker& a, const LivePeer& stage0, int count) {
  auto client = a.clients.get(stage0.compute);
  REQUIRE(client != nullptr);
  std::vector<Call> calls;
  for (int i = 0; i < count; ++i) {
    auto frames = protocol::encode_request(forward_of(8, 1000000 + i), 0, CodecId::blockwise8);
    calls.push_back(client->call(must(std::move(frames)), Clock::now() + 30s));
  }
  int answered = 0;
  for (auto& call : calls) answered += call.get().is_ok() ? 1 : 0;
  return answered;
}

TEST_CASE("a member's every attack is refused and counted while the swarm trains on") {
  ::setenv("SWARM_SECRET", kSecret, 1);  // the children inherit it
  const fs::path dir = temp_dir("hostile-swarm");
  fs::create_directories(dir);

  std::vector<pid_t> children;
  children.push_back(spawn({"bootstrap", "--port", "0"}, dir / "boot.log"));
  const uint16_t port = static_cast<uint16_t>(
      std::stoi(wait_for(dir / "boot.log", R"(listening on 127\.0\.0\.1:(\d+))", 20s)));
  const std::vector<std::string> model = {"--d-model", "32", "--layers", "2", "--heads", "2", "--seq-len",
                                          std::to_string(kSeqLen)};
  std::map<std::string, pid_t> peer_pids;
  for (const std::string name : {"p00", "p01", "p10", "p11"}) {
    std::vector<std::string> args = {"peer", "--stage", name.substr(1, 1), "--stages", "2", "--peer-id", name,
                                     "--bootstrap", fmt::format("127.0.0.1:{}", port), "--global-batch", "16",
                                     "--lr", "1e-2", "--warmup", "2", "--allreduce-part-timeout", "1"};
    args.insert(args.end(), model.begin(), model.end());
    peer_pids[name] = spawn(args, dir / (name + ".log"));
    children.push_back(peer_pids[name]);
  }
  for (const auto& [name, pid] : peer_pids) wait_for(dir / (name + ".log"), R"(\(CURVE\))", 30s);

  std::vector<std::string> trainer = {"trainer", "--bootstrap", fmt::format("127.0.0.1:{}", port), "--stages", "2",
                                      "--run-dir", (dir / "run").string(), "--microbatch", "4",
                                      "--microbatches-per-step", "4", "--steps", "100000", "--time-limit", "40",
                                      "--eval-windows", "8", "--forward-timeout", "3", "--backward-timeout", "5"};
  trainer.insert(trainer.end(), model.begin(), model.end());
  fs::create_directories(dir / "run");
  const pid_t trainer_pid = spawn(trainer, dir / "trainer.log");
  children.push_back(trainer_pid);
  // The run's step records (its stdout shows a status line only every 10 s, as logs want);
  // wait_for watches the folder, so it must exist before the trainer writes there.
  wait_for(dir / "run" / "metrics.jsonl", R"("kind":"step",.*"step":5,)", 90s);

  Attacker attacker = Attacker::join(port, kSecret);
  REQUIRE(attacker.registry.wait_connected(10s).is_ok());
  std::map<std::string, LivePeer> peers;
  const auto found_by = Clock::now() + 20s;
  while (peers.size() < 4 && Clock::now() < found_by) peers = attacker.find_peers(2);
  REQUIRE(peers.size() == 4);
  std::map<std::string, protocol::RefusalCounts> before;
  for (const auto& [id, peer] : peers) before[id] = refusals_of(attacker, peer);

  HostileServer hostile(attacker.credentials);
  std::map<std::string, int> sent_state, sent_parts;
  for (const auto& [id, peer] : peers) {
    sent_state[id] = overflowing_state_requests(attacker, peer);
    sent_parts[id] = hostile_parts(attacker, peer, /*near_step=*/0);
  }
  const LivePeer& stage0 = std::find_if(peers.begin(), peers.end(), [](auto& e) { return e.second.stage == 0; })->second;
  const int oversized = oversized_batch(attacker, stage0);
  ProgressRecord ahead = hostile_records(attacker, 0, hostile.server->address());
  // A real forger re-announces, as peers do, so its record never goes stale.
  std::mutex forger_mu;
  std::condition_variable forger_cv;
  bool trained = false;
  std::thread forger([&] {
    std::unique_lock lock(forger_mu);
    do {
      ahead.published_at = attacker.registry.now();
      (void)attacker.announce(progress_registry_key(0), ahead.to_json(), kRecordTtl);
    } while (!forger_cv.wait_for(lock, 500ms, [&] { return trained; }));  // twice a second, like a peer
  });
  // A fake stage-1 peer that claims to be very fast, so the trainer's router tries it.
  PeerAnnouncementRecord fake{attacker.id, hostile.server->address(), 1, 1e6, 0};
  const std::string fake_id = attacker.id;
  const int answered = flood(attacker, stage0, 400);
  MESSAGE("flood: " << answered << " of 400 valid-looking forwards answered");
  {
    // Stage records and progress records share the attacker's one subkey per key.
    REQUIRE(attacker.announce(stage_registry_key(1), fake.to_json(), kRecordTtl).is_ok());
  }
  // Stage 1's peers have refused the record with wrong types before it is replaced by
  // one from the future, which they must refuse too.
  std::vector<LivePeer> stage1;
  for (const auto& [id, peer] : peers) {
    if (peer.stage == 1) stage1.push_back(peer);
  }
  wait_until_bad_records_grow(attacker, stage1, before);
  std::map<std::string, protocol::RefusalCounts> after_wrong_types;
  for (const auto& peer : stage1) after_wrong_types[peer.id] = refusals_of(attacker, peer);
  future_record(attacker, 1);
  wait_until_bad_records_grow(attacker, stage1, after_wrong_types);

  int trainer_status = 0;
  const pid_t waited = ::waitpid(trainer_pid, &trainer_status, 0);
  {
    std::lock_guard lock(forger_mu);
    trained = true;
  }
  forger_cv.notify_all();
  forger.join();
  REQUIRE(waited == trainer_pid);
  const std::string trainer_log = read_all(dir / "trainer.log");
  INFO(trainer_log.substr(trainer_log.size() > 3000 ? trainer_log.size() - 3000 : 0));
  CHECK(WIFEXITED(trainer_status));
  CHECK(WEXITSTATUS(trainer_status) == 0);
  CHECK(trainer_log.find(" 0 abandoned") != std::string::npos);
  std::smatch loss;
  REQUIRE(std::regex_search(trainer_log, loss, std::regex(R"(train loss ([0-9.]+) -> ([0-9.]+))")));
  CHECK(std::stod(loss[2]) < std::stod(loss[1]));
  std::smatch refused;
  REQUIRE(std::regex_search(trainer_log, refused, std::regex(R"((\d+) registry records refused)")));
  CHECK(std::stoll(refused[1]) > 0);  // the stage record with wrong types

  // The fake peer's wrong replies got it banned, and it was never trusted with a result.
  const std::string metrics = read_all(dir / "run" / "metrics.jsonl");
  MESSAGE("the fake stage-1 peer answered " << hostile.served.load() << " requests");
  if (hostile.served.load() > 0) CHECK(metrics.find(fmt::format(R"("peer":"{}")", fake_id)) != std::string::npos);

  for (const auto& [id, peer] : peers) {
    INFO("peer " << id);
    const pid_t pid = peer_pids.count(id.substr(0, 3)) ? peer_pids[id.substr(0, 3)] : -1;
    REQUIRE(pid > 0);
    CHECK(::waitpid(pid, &trainer_status, WNOHANG) == 0);  // alive
    const int64_t rss = rss_kib(pid);
    MESSAGE("peer " << id << " RSS " << rss / 1024 << " MiB (bound " << kRssBoundKib / 1024 << " MiB)");
    CHECK(rss > 0);
    CHECK(rss < kRssBoundKib);
    protocol::RefusalCounts after = refusals_of(attacker, peer);
    auto grew = [&](const char* name) { return after[name] - before[id][name]; };
    CHECK(grew("state_requests") >= sent_state[id]);
    CHECK(grew("parts") + grew("validation") >= sent_parts[id]);
    if (peer.stage == 0) {
      if (id == stage0.id) CHECK(grew("spec") >= oversized);
      CHECK(grew("unvouched_ahead") > 0);  // the forged record ahead
    } else {
      CHECK(grew("bad_records") > 0);  // wrong types, then a record from the future
    }
  }
  for (pid_t pid : children) ::kill(pid, SIGTERM);
  for (pid_t pid : children) ::waitpid(pid, &trainer_status, 0);
}

}  // namespace
}  // namespace swarm
