// Round messages from a member against its stage, over real processes and sockets
// (the swarm, the windows and the checks: hostile_rounds_fixture.h). While a trainer
// trains, a member sends stage 0's peers:
//   - a steady stream of junk round messages (round_junk.h), each refused with an
//     error reply but the few answered ok by design;
//   - JOINs with the stage's own step and hash, and then nothing: this froze the stage
//     once (2.00 -> 0.00 steps/s), when the leader took the JOIN into every round and
//     every round was aborted at the part deadline; now the owners it left waiting
//     bench it (StageRounds::bench), longer each time;
//   - a flood of PARTs in the leader's name at the current step, at a stage of three,
//     where members hold parts that come before their BEGIN.
// The stage's rate before, during and after, its replicas' agreement and the run's
// final loss against a clean run's judge each.
#include <map>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <doctest/doctest.h>

#include "swarm/compression/codecs.h"
#include "swarm/peer/periodic_task.h"
#include "tests/apps/hostile_rounds_fixture.h"
#include "tests/apps/round_junk.h"

namespace swarm {
namespace {

using namespace hostile_rounds;  // HostileRun, Window, clean_run, check_*, and hostile_member.h
using namespace std::chrono_literals;

// The stage as its records show it: the highest step, its hash and its leader (the
// lowest id at that step, as the peers choose it).
StageNow stage_now(Attacker& attacker, const std::set<std::string>& stage0) {
  StageNow now;
  now.step = -1;
  for (const auto& [id, r] : attacker.progress_of(0, stage0)) {
    if (r.step > now.step) now = {r.step, r.params_hash, id};  // ordered by id: the lowest wins ties
  }
  return now;
}

TEST_CASE("junk round messages from a member cannot freeze its stage") {
  const RunEnd& clean = clean_run();
  HostileRun run("hostile-rounds-junk");
  Attacker& attacker = *run.attacker;
  const std::vector<LivePeer> targets = run.watched_peers();
  std::map<std::string, protocol::RefusalCounts> before_counts;
  for (const auto& peer : targets) before_counts[peer.id] = refusals_of(attacker, peer);

  run.wait_until_steady();
  const Window before = run.measure("before");

  // The stage as its records show it, re-read every 0.2 s by the stream itself.
  JunkMaker maker(attacker.id, {targets[0].id, targets[1].id}, 20240611);
  std::map<std::string, Tally> tally;  // by kind
  Counter answered;
  // The attack's pace: a steady stream, some 200 a second.
  StageNow now;
  auto read_at = Clock::now() - 1s;
  size_t ticks = 0;
  PeriodicTask stream;
  stream.start(0.004, [&] {
    const size_t i = ticks++;
    if (Clock::now() - read_at > 200ms) {
      read_at = Clock::now();
      if (StageNow read = stage_now(attacker, run.watched); read.step >= 0) now = read;
    }
    const LivePeer& target = targets[i % targets.size()];
    Junk junk = maker.next(target.id, now);
    Tally& t = tally[junk.kind];
    if (junk.frames.parts.empty()) {
      ++t.unencodable;
      return;
    }
    const Reply reply = reply_of(attacker.call(target.control, std::move(junk.frames)));
    t.count(reply);
    if (reply.answered) answered.add();
  });
  // The attack has landed once the peers have answered every kind of junk, twice.
  REQUIRE_MESSAGE(answered.wait_for_at_least(2 * kJunkKinds, 10s), "the peers answered " << answered.value());
  const Window during = run.measure("during");
  stream.stop();
  const Window after = run.measure("after");

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
  finish_and_judge(run, before, during, after, clean);
}

TEST_CASE("a member that JOINs with the stage's own step and hash, then sends nothing, cannot freeze its stage") {
  const RunEnd& clean = clean_run();
  HostileRun run("hostile-rounds-join");
  Attacker& attacker = *run.attacker;
  MalloryServer hole(attacker.credentials, /*answer_ok=*/true);
  // Any name bound to its key speaks for it; one above the peers' ids, so the leader stays the leader.
  auto high = security::peer_id_bound_to("zed", attacker.credentials.self);
  REQUIRE(high.is_ok());
  const std::vector<std::string> names = {*high};
  const RoundCodec codec = RoundCodec::of<compression::StandardCodecs>(CodecId::blockwise8);

  run.wait_until_steady();
  const Window before = run.measure("before");

  std::map<std::string, Tally> tally;  // by attacker id
  Counter answered;
  // A JOIN counts only from a stage-mate in the view: the member announces a record
  // as `zed` at the stage's step and hash, as a peer would, five times a second.
  PeriodicTask announcer;
  announcer.start(0.2, [&] {
    ProgressRecord newest;
    for (const auto& [id, r] : attacker.progress_of(0, run.watched)) {
      if (r.step >= newest.step) newest = r;
    }
    if (newest.peer_id.empty()) return;
    ProgressRecord mine;
    mine.peer_id = *high;
    mine.address = hole.server->address();
    mine.stage = 0;
    mine.step = newest.step;
    mine.params_hash = newest.params_hash;
    mine.recent_hashes = {{newest.step, newest.params_hash}};
    mine.samples = 16;
    mine.samples_per_second = 100;
    mine.published_at = attacker.registry.now();
    (void)attacker.registry.announce(progress_registry_key(0), *high, mine.to_json(), attacker.registry.now() + 5);
  });
  // The attack's pace: JOINs some 20 times a second, as a member re-JOINs.
  PeriodicTask joiner;
  joiner.start(0.05, [&] {
    for (const auto& [id, r] : attacker.progress_of(0, run.watched)) {
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
        const Reply reply = reply_of(attacker.call(r.address, std::move(frames).value()));
        tally[name].count(reply);
        if (reply.answered && !reply.error) answered.add();
      }
    }
  });
  // The attack has landed once a peer took the silent member's JOIN (answered it ok).
  REQUIRE_MESSAGE(answered.wait_for_at_least(1, 10s), "no peer took the member's JOIN");
  const Window during = run.measure("during");
  joiner.stop();
  announcer.stop();
  // The window after begins once the stage has stepped without the member (its last
  // JOIN may hold a round up to the part deadline).
  const auto stopped = Clock::now();
  const bool stepped = run.wait_for_steps(1, kWindowLimit);
  MESSAGE(fmt::format("stage 0 {} {:.1f} s after the attack stopped", stepped ? "stepped" : "had not stepped",
                      std::chrono::duration<double>(Clock::now() - stopped).count()));
  const Window after = run.measure("after");

  for (const auto& [name, t] : tally) {
    MESSAGE(fmt::format("JOINs as {}: {} sent, {} accepted, {} refused ({}), {} unanswered", name, t.sent,
                        t.accepted, t.refused, t.last_refusal, t.unanswered));
  }
  MESSAGE("the attacker's server was asked" << hole.asked() << log_lines(run, "aborted"));
  const RunEnd end = run.finish_training();
  check_rates(before, during, after);
  run.check_replicas_agree();
  check_loss(end, clean);
}

TEST_CASE("a flood of parts in the leader's name at the current step cannot freeze a stage of three") {
  const RunEnd& clean = clean_run();
  HostileRun run("hostile-rounds-early", /*stage0_peers=*/3);
  Attacker& attacker = *run.attacker;
  const std::vector<LivePeer> targets = run.watched_peers();
  const RoundCodec codec = RoundCodec::of<compression::StandardCodecs>(CodecId::blockwise8);

  run.wait_until_steady();
  const Window before = run.measure("before");

  // A part of a group nobody began, in the name of the round's leader, at the step the
  // stage is at: a member waiting for its leader's BEGIN holds such a part.
  Tally tally;
  Counter held;
  // The attack's pace: a part every millisecond at most (some 250 a second, as the
  // attacker's CPU is the peers' here, not another machine's; unpaused, over 1000 a
  // second cost 12% of the rate once, with no round aborted).
  std::mt19937_64 rng(7);
  StageNow now;
  now.step = -1;
  auto read_at = Clock::now() - 1s;
  size_t ticks = 0;
  PeriodicTask flood;
  flood.start(0.001, [&] {
    const size_t i = ticks++;
    if (Clock::now() - read_at > 100ms) {
      read_at = Clock::now();
      now = stage_now(attacker, run.watched);
    }
    const LivePeer& target = targets[i % targets.size()];
    if (target.id == now.leader || now.step < 0) return;
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
    if (!frames.is_ok()) return;
    const Reply reply = reply_of(attacker.call(target.control, std::move(frames).value()));
    tally.count(reply);
    if (reply.answered && !reply.error) held.add();
  });
  // The attack has landed once members have held (answered ok) parts in the leader's name.
  REQUIRE_MESSAGE(held.wait_for_at_least(20, 10s), "members held " << held.value() << " parts");
  const Window during = run.measure("during");
  flood.stop();
  // The window after begins once the stage has stepped past the parts held (they are
  // dropped when their step's BEGIN or another group's part arrives).
  const auto stopped = Clock::now();
  const bool stepped = run.wait_for_steps(1, kWindowLimit);
  MESSAGE(fmt::format("stage 0 {} {:.1f} s after the attack stopped", stepped ? "stepped" : "had not stepped",
                      std::chrono::duration<double>(Clock::now() - stopped).count()));
  const Window after = run.measure("after");

  MESSAGE(fmt::format("parts in the leader's name: {} sent, {} accepted ({}), {} refused ({}), {} unanswered",
                      tally.sent, tally.accepted, tally.last_other, tally.refused, tally.last_refusal,
                      tally.unanswered)
          << log_lines(run, "aborted"));
  finish_and_judge(run, before, during, after, clean);
}

}  // namespace
}  // namespace swarm
