// A member's every other attack on a secured swarm, over real processes and sockets
// (the swarm, the windows and the checks: hostile_rounds_fixture.h), sent while stage
// 0's rate is measured:
//   - state requests with overflowing offsets and lengths;
//   - registry records with wrong JSON types, from the far future, and a forged
//     progress record claiming a much later step, pointing at a forged state;
//   - all-reduce parts from a non-member, posing as a member, far in the future,
//     with absurd weights;
//   - oversized batches;
//   - a fake stage-1 peer whose replies have the wrong dtype and shape;
// then, in a window of its own (such requests are served, at a cost), a flood of
// valid-looking forward requests. Each refused attack is counted by the peers it
// reached; stage 0's rate during and after holds, and during the flood it keeps a
// lower bound; its replicas agree, every peer stays under the RSS bound, and the final loss is
// within the tolerance of the binary's clean run.
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
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
#include "swarm/peer/periodic_task.h"
#include "tests/apps/hostile_rounds_fixture.h"
#include "transports/zmq/zmq_transport.h"

namespace swarm {
namespace {

using namespace hostile_rounds;  // HostileRun, Window, clean_run, check_*, and hostile_member.h
using namespace std::chrono_literals;
using hostile::must;

// Seconds the attacker's records live: the forged record ahead lapses this long
// after its last announce, and the window after begins then.
constexpr double kRecordTtl = 5;
// Valid-looking forwards are served, not rate-limited per client (docs/TRUST.md):
// a flood costs the stage the compute it asks for, so it has a window of its own,
// shorter (the windows end by kTrainerSteps) and with a lower bound than the refused
// attacks': it must not stall the stage. At --max-batch 1 a peer serves its callers
// in turn (ZeroMQ's fair queueing), some 0.1 s per 8-row forward here, so a flood
// keeps one of stage 0's two peers half busy until its requests' 5 s deadline.
// Measured inside the refused attacks' 8.5 s window: 100 and 200 forwards lasted
// 5.1 s, 25 3.4 s, 15 2.2 s, and the window held 0.79 to 0.86 of the rate before
// whatever their number (0.99 without the flood); in a 16-step window of its own,
// 100 held 0.74, and the 16-step window after it 0.84: the trainer's router keeps
// the flooded peer's virtual-time debt (stochastic_wiring.h) for many seconds. So
// the flood comes last, in an 8-step window: 0.69 of the rate before.
constexpr int kFloodForwards = 100;
constexpr int64_t kFloodWindowSteps = 8;
constexpr double kFloodHeldFraction = 0.5;

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

// Every attack of this file, once each, in the order a member would try them; the
// forged record ahead is re-announced twice a second until the attacks are done.
struct EveryAttack {
  std::map<std::string, int> sent_state, sent_parts;
  int oversized = 0;
  std::string stage0_target;
  std::string timeline;  // when each attack ended, and the trainer's step then: where a window's time went

  void mark(HostileRun& run, const char* what, Clock::time_point start) {
    timeline += fmt::format(" {} {:.1f}s@{}", what, std::chrono::duration<double>(Clock::now() - start).count(),
                            run.trainer_step());
  }

  // `at_start`: the peers' counters before any attack (the records with wrong types
  // are announced before this runs).
  void run(HostileRun& run, HostileServer& hostile, std::map<std::string, protocol::RefusalCounts> at_start) {
    Attacker& attacker = *run.attacker;
    const auto start = Clock::now();
    mark(run, "start", start);
    for (const auto& [id, peer] : run.peers) {
      sent_state[id] = overflowing_state_requests(attacker, peer);
      sent_parts[id] = hostile_parts(attacker, peer, /*near_step=*/0);
    }
    mark(run, "state+parts", start);
    const LivePeer& stage0 = run.peers.at(*run.watched.begin());
    stage0_target = stage0.id;
    oversized = oversized_batch(attacker, stage0);
    mark(run, "oversized", start);
    // A fake stage-1 peer that claims to be very fast, so the trainer's router tries it.
    PeerAnnouncementRecord fake{attacker.id, hostile.server->address(), 1, 1e6, 0};
    REQUIRE(attacker.announce(stage_registry_key(1), fake.to_json(), kRecordTtl).is_ok());
    // Stage 1's peers refuse the record with wrong types before it is replaced by one
    // from the future, which they must refuse too.
    std::vector<LivePeer> stage1;
    for (const auto& [id, peer] : run.peers) {
      if (peer.stage == 1) stage1.push_back(peer);
    }
    std::map<std::string, protocol::RefusalCounts> since = at_start;
    wait_until_bad_records_grow(attacker, stage1, since);
    mark(run, "fake-peer+wrong-types", start);
    for (const auto& peer : stage1) since[peer.id] = refusals_of(attacker, peer);
    future_record(attacker, 1);
    wait_until_bad_records_grow(attacker, stage1, since);
    mark(run, "future-record", start);
  }
};

TEST_CASE("a member's every other attack is refused and counted, and the training holds") {
  const RunEnd& clean = clean_run();
  HostileRun run("hostile-every-attack");
  Attacker& attacker = *run.attacker;
  HostileServer hostile(attacker.credentials);
  std::map<std::string, protocol::RefusalCounts> at_start;
  for (const auto& [id, peer] : run.peers) at_start[id] = refusals_of(attacker, peer);

  run.wait_until_steady();
  const Window before = run.measure("before");
  ProgressRecord ahead = hostile_records(attacker, 0, hostile.server->address());
  EveryAttack attack;
  Window during;
  {
    PeriodicTask forger;  // a real forger re-announces, as peers do, so its record never goes stale
    forger.start(0.5, [&] {
      ahead.published_at = attacker.registry.now();
      (void)attacker.announce(progress_registry_key(0), ahead.to_json(), kRecordTtl);
    });
    std::thread attacks([&] { attack.run(run, hostile, at_start); });
    during = run.measure("during");
    attacks.join();
  }
  MESSAGE("the fake stage-1 peer answered " << hostile.served.load() << " requests; attacks ended at:" << attack.timeline);
  REQUIRE_MESSAGE(run.wait([&] { return run.attacker_record_lapsed(); }, 15s), "the forged record never lapsed");
  const Window after = run.measure("after");
  // The flood last: the trainer's router is slow to trust a peer again after it was
  // slow (see kFloodForwards), so nothing is measured after it.
  int flood_answered = 0;
  Window flooded;
  {
    std::thread flooding([&] { flood_answered = flood(attacker, run.peers.at(attack.stage0_target), kFloodForwards); });
    flooded = run.measure("flood", kFloodWindowSteps);
    flooding.join();
  }
  MESSAGE(fmt::format("flood: {} of {} valid-looking forwards answered; stage 0 in its window: steps {} -> {} in {:.1f} s: "
                      "{:.2f} global steps/s, {:.2f} of its rate before (bound {})",
                      flood_answered, kFloodForwards, flooded.from, flooded.to, flooded.seconds, flooded.rate(),
                      flooded.rate() / before.rate(), kFloodHeldFraction));
  CHECK(flood_answered == kFloodForwards);
  CHECK(flooded.rate() >= kFloodHeldFraction * before.rate());

  for (const auto& [id, peer] : run.peers) {
    INFO("peer " << id);
    protocol::RefusalCounts now = refusals_of(attacker, peer);
    auto grew = [&](const char* name) { return now[name] - at_start[id][name]; };
    CHECK(grew("state_requests") >= attack.sent_state[id]);
    CHECK(grew("parts") + grew("validation") >= attack.sent_parts[id]);
    if (peer.stage == 0) {
      if (id == attack.stage0_target) CHECK(grew("spec") >= attack.oversized);
      CHECK(grew("unvouched_ahead") > 0);  // the forged record ahead
    } else {
      CHECK(grew("bad_records") > 0);  // wrong types, then a record from the future
    }
  }
  const RunEnd end = run.finish_training();
  const std::string trainer_log = read_all(run.dir / "trainer.log");
  CHECK(trainer_log.find(" 0 abandoned") != std::string::npos);
  std::smatch refused;
  REQUIRE(std::regex_search(trainer_log, refused, std::regex(R"((\d+) registry records refused)")));
  CHECK(std::stoll(refused[1]) > 0);  // the stage record with wrong types
  // The fake peer's wrong replies got it banned, and it was never trusted with a result.
  if (hostile.served.load() > 0) {
    CHECK(read_all(run.dir / "run" / "metrics.jsonl").find(fmt::format(R"("peer":"{}")", attacker.id)) !=
          std::string::npos);
  }
  check_rates(before, during, after);
  run.check_rss();
  run.check_replicas_agree();
  check_loss(end, clean);
}

}  // namespace
}  // namespace swarm
