// Pipelines of a peer-to-peer swarm (--hops p2p) from a member that is not on
// their path, over real processes and sockets (the swarm, the windows and the
// checks: hostile_rounds_fixture.h). Peer to peer, the loss stage hears of a
// microbatch from stage 0, never from its trainer, and keys retries by the
// microbatch id: before hop chains, any member could send it pipelines under ids
// of its choosing, and one sent ahead of a trainer's would be accumulated in its
// place. Now a pipeline carries the chain of signed hand-offs from its trainer
// (swarm/security/hop_chain.h) and is keyed by (trainer, id). While the trainer
// trains, the member sends stage 1 pipelines with no chain, with a chain to
// another peer, with a chain that claims a stage-0 peer as its trainer, with a
// chain for another microbatch, and with garbage activations, and sends stage 0's
// peers pipeline results in a stage-1 peer's name (hops are answered at once and
// their outcomes come back as requests of their own): each is refused and
// counted. Stage 1's rate, its replicas and the run's final loss are judged
// against a clean run's.
//
// A member can also announce itself as a peer of stage 1, answer every pipeline
// "accepted" at once and never send its outcome. Stage 0's peers choose by
// rendezvous on the microbatch id, so before a silent peer was left out it was
// ranked first for a third of the microbatches, every retry of them included, and
// each cost a deadline for as long as it kept announcing. Now it costs each sender
// one deadline.
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <doctest/doctest.h>

#include "swarm/compression/codecs.h"
#include "swarm/peer/periodic_task.h"
#include "swarm/protocol/pipeline_result.h"
#include "swarm/protocol/tensor_codec.h"
#include "swarm/protocol/records.h"
#include "swarm/security/hop_chain.h"
#include "tests/apps/hostile_rounds_fixture.h"

namespace swarm {
namespace {

using namespace hostile_rounds;  // HostileRun, Window, clean_run, check_*, and hostile_member.h
using namespace std::chrono_literals;

constexpr int kRows = 4;  // the trainer's microbatch

// A loss-stage pipeline: activations of `width` (the stage's own, or garbage's),
// real-looking targets, and `chain` as its hop chain.
wire::Frames pipeline(const protocol::StageSpec& spec, uint64_t microbatch_id, int64_t width, std::string chain) {
  const auto [hidden, targets] = loss_stage_batch(kRows, kSeqLen, width);
  protocol::StageRequest request;
  request.kind = wire::MessageKind::pipeline;
  request.request_id = microbatch_id;
  auto input =
      protocol::encode_floats<compression::StandardCodecs>(hidden, protocol::codec_for(spec, protocol::TensorRole::input));
  REQUIRE_MESSAGE(input.is_ok(), input.status().to_string());
  request.input = std::move(input).value();
  request.targets = protocol::raw_tensor(targets);
  request.microbatch_id = microbatch_id;
  request.deadline_unix_ms = protocol::unix_millis_now() + 5000;
  request.hop_chain = std::move(chain);
  return must(protocol::encode_request(request, spec.stage, protocol::reply_codec_for(spec, request.kind)));
}

// The ways a member off the path can try a pipeline, in turn.
enum class Forgery {
  no_chain,
  chain_to_another_peer,
  claims_another_trainer,
  chain_for_another_id,
  garbage,
  forged_result,  // to a stage-0 peer: the outcome of a pipeline it never passed on to the sender
  count
};

const char* name_of(Forgery forgery) {
  switch (forgery) {
    case Forgery::no_chain: return "no hop chain";
    case Forgery::chain_to_another_peer: return "a chain to the other stage-1 peer";
    case Forgery::claims_another_trainer: return "a chain that claims a stage-0 peer as its trainer";
    case Forgery::chain_for_another_id: return "a chain for another microbatch";
    case Forgery::garbage: return "activations of the wrong width";
    case Forgery::forged_result: return "a pipeline result in a stage-1 peer's name, under a guessed token";
    case Forgery::count: break;
  }
  return "";
}

TEST_CASE("peer to peer: pipelines from a member off their path are refused and counted; the training holds") {
  const RunEnd& clean = clean_run();
  HostileRun run("hostile-pipeline", /*stage0_peers=*/2, /*watched_stage=*/1, {}, /*owned=*/false,
                 /*peer_to_peer=*/true);
  Attacker& attacker = *run.attacker;
  const std::vector<LivePeer> targets = run.watched_peers();
  REQUIRE(targets.size() == 2);
  const protocol::StageSpec spec = spec_of(attacker, targets[0]);
  REQUIRE(spec.io.targets.has_value());  // stage 1 is the loss stage
  const int64_t width = spec.io.input.dims.back();
  std::string stage0_peer;
  std::vector<LivePeer> stage0;
  for (const auto& [id, peer] : run.peers) {
    if (peer.stage == 0) stage0_peer = id;
    if (peer.stage == 0) stage0.push_back(peer);
  }
  REQUIRE(stage0.size() == 2);
  std::map<std::string, protocol::RefusalCounts> at_start;
  for (const auto& peer : targets) at_start[peer.id] = refusals_of(attacker, peer);
  for (const auto& peer : stage0) at_start[peer.id] = refusals_of(attacker, peer);

  run.wait_until_steady();
  const Window before = run.measure("before");

  // Some 100 a second, each forgery in turn, at either stage-1 peer.
  std::map<Forgery, Tally> tallies;
  Counter answered;
  uint64_t next_id = uint64_t{1} << 62;
  PeriodicTask stream;
  stream.start(0.01, [&] {
    const uint64_t id = next_id++;
    const Forgery forgery = static_cast<Forgery>(id % static_cast<uint64_t>(Forgery::count));
    const LivePeer& target = targets[(id / 8) % 2];
    const LivePeer& other = targets[1 - (id / 8) % 2];
    const security::HopStart start{id, 0, protocol::unix_millis_now() + 5000};
    const auto& self = attacker.credentials.self;
    std::string chain;
    int64_t input_width = width;
    switch (forgery) {
      case Forgery::no_chain: break;
      case Forgery::chain_to_another_peer:
        chain = security::hop_chain_bytes(security::start_hop_chain(self, attacker.id, start, other.id));
        break;
      case Forgery::claims_another_trainer:
        chain = security::hop_chain_bytes(security::start_hop_chain(self, stage0_peer, start, target.id));
        break;
      case Forgery::chain_for_another_id:
        chain = security::hop_chain_bytes(security::start_hop_chain(self, attacker.id, {id + 1, 0, start.deadline_unix_ms}, target.id));
        break;
      case Forgery::garbage:
        chain = security::hop_chain_bytes(security::start_hop_chain(self, attacker.id, start, target.id));
        input_width = width + 3;
        break;
      case Forgery::forged_result: {
        protocol::StageReply outcome;
        outcome.tensor = protocol::raw_tensor(loss_stage_batch(kRows, kSeqLen, width).hidden);
        outcome.loss = 0.0f;
        const uint64_t guessed_token = id * 0x9e3779b97f4a7c15ull;
        const Reply reply = reply_of(attacker.call(
            stage0[(id / 8) % 2].compute,
            must(protocol::encode_pipeline_result(0, id, id, target.id, guessed_token, outcome,
                                                  attacker.credentials.certificate))));
        tallies[forgery].count(reply);
        if (reply.answered) answered.add();
        return;
      }
      case Forgery::count: break;
    }
    const Reply reply = reply_of(attacker.call(target.compute, pipeline(spec, id, input_width, std::move(chain))));
    tallies[forgery].count(reply);
    if (reply.answered) answered.add();
  });
  // The attack has landed once the peers have answered some of it.
  REQUIRE_MESSAGE(answered.wait_for_at_least(50, 10s), "the peers answered " << answered.value());
  const Window during = run.measure("during");
  stream.stop();
  const Window after = run.measure("after");

  int64_t chains_refused = 0;
  for (int f = 0; f < static_cast<int>(Forgery::count); ++f) {
    const Tally& tally = tallies[static_cast<Forgery>(f)];
    MESSAGE(fmt::format("{}: {} sent, {} refused ({}), {} accepted, {} unanswered", name_of(static_cast<Forgery>(f)),
                        tally.sent, tally.refused, tally.last_refusal, tally.accepted, tally.unanswered));
    CHECK(tally.sent >= 10);
    CHECK(tally.accepted == 0);
    CHECK(tally.refused == tally.sent - tally.unanswered);
    if (static_cast<Forgery>(f) != Forgery::garbage && static_cast<Forgery>(f) != Forgery::forged_result) {
      chains_refused += tally.refused;
    }
  }
  CHECK(tallies[Forgery::forged_result].last_refusal.find("no pipeline waits for return id") != std::string::npos);
  CHECK(tallies[Forgery::no_chain].last_refusal.find("without a hop chain") != std::string::npos);
  CHECK(tallies[Forgery::chain_to_another_peer].last_refusal.find("not here") != std::string::npos);
  CHECK(tallies[Forgery::claims_another_trainer].last_refusal.find("not bound to the key") != std::string::npos);
  CHECK(tallies[Forgery::chain_for_another_id].last_refusal.find("is for microbatch") != std::string::npos);
  int64_t hop_chains = 0, spec_refused = 0;
  for (const auto& peer : targets) {
    protocol::RefusalCounts now = refusals_of(attacker, peer);
    hop_chains += now["hop_chains"] - at_start[peer.id]["hop_chains"];
    spec_refused += now["spec"] - at_start[peer.id]["spec"];
    MESSAGE("peer " << peer.id << ": hop_chains +" << now["hop_chains"] - at_start[peer.id]["hop_chains"]
                    << ", spec +" << now["spec"] - at_start[peer.id]["spec"]);
  }
  CHECK(hop_chains == chains_refused);
  CHECK(spec_refused == tallies[Forgery::garbage].refused);
  int64_t results_refused = 0;
  for (const auto& peer : stage0) {
    const int64_t more = refusals_of(attacker, peer)["pipeline_results"] - at_start[peer.id]["pipeline_results"];
    MESSAGE("stage-0 peer " << peer.id << ": pipeline_results +" << more);
    results_refused += more;
  }
  CHECK(results_refused == tallies[Forgery::forged_result].refused);

  finish_and_judge(run, before, during, after, clean);
}

// A peer that answers every pipeline "accepted" at once and never sends its
// outcome; any other request waits on a worker of its own until the test ends.
struct SilentPeer {
  std::atomic<int64_t> pipelines{0};
  std::mutex mu;
  std::condition_variable cv;
  bool released = false;
  std::optional<ZmqServer> server;  // last: destroyed first, while its handlers can still wake

  explicit SilentPeer(const security::SwarmCredentials& credentials) {
    ServerOptions options;
    options.security = credentials.server_options();
    options.worker_threads = 64;
    auto bound = ZmqTransport::bind("tcp://127.0.0.1:*", options);
    REQUIRE(bound.is_ok());
    server.emplace(std::move(bound).value());
    REQUIRE(server->serve([this](const PeerIdentity&, wire::Frames request) {
                    auto decoded = wire::decode_message(request.views(), wire::Limits{});
                    if (decoded.is_ok() && decoded->header.kind == wire::MessageKind::pipeline) {
                      ++pipelines;
                      return protocol::encode_acceptance(decoded->header.request_id, 1);
                    }
                    std::unique_lock lock(mu);
                    cv.wait_for(lock, 120s, [&] { return released; });
                    return wire::make_error_reply(0, 1, unavailable("too late"));
                  })
                .is_ok());
  }
  ~SilentPeer() {
    {
      std::lock_guard lock(mu);
      released = true;
    }
    cv.notify_all();
  }
};

// Lines of the stage-0 peers' logs that left the silent peer out.
int64_t left_out_lines(HostileRun& run, const std::string& silent_id) {
  int64_t lines = 0;
  for (const auto& [name, pid] : run.peer_pids) {
    if (name[1] != '0') continue;
    const std::string log = test_apps::read_all(run.dir / (name + ".log"));
    for (size_t at = log.find(silent_id); at != std::string::npos; at = log.find(silent_id, at + 1)) {
      const size_t line_end = log.find('\n', at);
      if (log.substr(at, line_end - at).find("left out of pipelines") != std::string::npos) ++lines;
    }
  }
  return lines;
}

TEST_CASE("peer to peer: a member that accepts pipelines and never answers costs each sender one deadline") {
  const RunEnd& clean = clean_run();
  // A stage-0 peer gives a pipeline's stage-1 hop 2 s (--backward-timeout): one deadline.
  const std::vector<std::string> hop_timeout = {"--backward-timeout", "2"};
  HostileRun run("hostile-silent-peer", /*stage0_peers=*/2, /*watched_stage=*/1,
                 {{"p00", hop_timeout}, {"p01", hop_timeout}}, /*owned=*/false, /*peer_to_peer=*/true);
  Attacker& attacker = *run.attacker;
  SilentPeer silent(attacker.credentials);

  run.wait_until_steady();
  const Window before = run.measure("before");
  Window during;
  {
    PeriodicTask announcer;  // as a live peer does, so its record never lapses
    announcer.start(0.5, [&] {
      PeerAnnouncementRecord record{attacker.id, silent.server->address(), 1, 1e6, 0};
      (void)attacker.announce(stage_registry_key(1), record.to_json(), 5);
    });
    // The attack has landed once each stage-0 peer has waited out a pipeline there:
    // the deadline it costs is here, before the window.
    const auto announced = Clock::now();
    REQUIRE_MESSAGE(run.wait([&] { return left_out_lines(run, attacker.id) >= 2; }, 30s),
                    "stage 0's peers left the silent peer out " << left_out_lines(run, attacker.id)
                                                                << " times; it took " << silent.pipelines.load());
    const double landed_seconds = std::chrono::duration<double>(Clock::now() - announced).count();
    const int64_t taken = silent.pipelines.load();
    // It still announces itself: were it not left out, a third of the pipelines would reach it.
    during = run.measure("during");
    MESSAGE(fmt::format("the silent peer took {} pipelines in the {:.1f} s until both stage-0 peers left it out, and "
                        "{} more in the window during, while it still announced itself",
                        taken, landed_seconds, silent.pipelines.load() - taken));
    CHECK(silent.pipelines.load() == taken);
    CHECK(left_out_lines(run, attacker.id) == 2);  // once each: what it held timed out together
    CHECK(taken <= 2 * 2 * 2);  // the trainer's 2 in flight, each tried at it once or retried there once, per sender
  }
  const Window after = run.measure("after");
  finish_and_judge(run, before, during, after, clean);
}

}  // namespace
}  // namespace swarm
