// Forged progress records against a stage's round protocol, over real processes and
// sockets (the swarm, the windows and the checks: hostile_rounds_fixture.h). A member
// announces, in stage 0's progress key, under its own id:
//   - a record claiming step 2^40, re-announced twice a second: peers must not follow
//     it (download from it, or JOIN it) and must count it as unvouched;
//   - a copy of the stage's newest record (its own step and hash) under an id that
//     sorts before every peer's, so that it would lead every round if believed: it
//     froze the stage once (2.00 -> 0.00 steps/s), while the lowest fresh id at the
//     step led, member of the committed group or not; now only members lead where a
//     member is present.
// The stage's rate before, during and after, its replicas' agreement and the run's
// final loss against a clean run's judge each.
#include <algorithm>
#include <atomic>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <doctest/doctest.h>

#include "swarm/peer/periodic_task.h"
#include "tests/apps/hostile_rounds_fixture.h"

namespace swarm {
namespace {

using namespace hostile_rounds;  // HostileRun, Window, clean_run, check_*, and hostile_member.h
using namespace std::chrono_literals;

// The trainer's displays trust what the peers trust: no record of its metrics
// (replica hashes, global steps) and no line it printed shows the forged step,
// and the final step record and the summary count the forged record refused.
void check_displays_refused(HostileRun& run) {
  int64_t highest = 0;
  int64_t refused = -1;
  for (const auto& r : read_metrics(run.dir / "run")) {
    if (r.contains("step") && r["step"].is_number()) highest = std::max(highest, r["step"].get<int64_t>());
    if (r["kind"] == "step" && r.contains("refused_records")) refused = r["refused_records"].get<int64_t>();
  }
  MESSAGE("the highest step in the run's metrics: " << highest << "; refused records: " << refused);
  CHECK(highest < kFarStep);
  CHECK(refused >= 1);
  const std::string log = read_all(run.dir / "trainer.log");
  CHECK(log.find(std::to_string(kFarStep)) == std::string::npos);
  CHECK(log.find(fmt::format("unvouched progress records refused: {}\n", refused)) != std::string::npos);
}

TEST_CASE("a forged progress record at step 2^40 cannot freeze its stage") {
  const RunEnd& clean = clean_run();
  HostileRun run("hostile-rounds-forged");
  Attacker& attacker = *run.attacker;
  MalloryServer mallory(attacker.credentials, /*answer_ok=*/false);

  run.wait_until_steady();
  const Window before = run.measure("before");

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
  forged.committed_members.assign(run.watched.begin(), run.watched.end());
  forged.committed_members.push_back(attacker.id);
  std::sort(forged.committed_members.begin(), forged.committed_members.end());
  forged.stage_mates_seen = 2;
  forged.recent_hashes = {{kFarStep - 1, 0x5eedbadc0ffef}, {kFarStep, forged.params_hash}};
  std::map<std::string, protocol::RefusalCounts> at_start;
  for (const auto& peer : run.watched_peers()) at_start[peer.id] = refusals_of(attacker, peer);
  std::atomic<int64_t> announced{0};
  Window during;
  {
    PeriodicTask forger;
    forger.start(0.5, [&] {  // twice a second, like a peer
      forged.published_at = attacker.registry.now();
      if (attacker.announce(progress_registry_key(0), forged.to_json(), 5).is_ok()) ++announced;
    });
    // The attack has landed once every stage-0 peer has read the record and refused
    // to follow it (its unvouched_ahead counter grew since the forger started).
    const bool landed = run.wait([&] {
      for (const auto& peer : run.watched_peers()) {
        if (refusals_of(attacker, peer)["unvouched_ahead"] <= at_start[peer.id]["unvouched_ahead"]) return false;
      }
      return true;
    }, 10s);
    REQUIRE_MESSAGE(landed, "the stage-0 peers never counted the forged record as unvouched");
    during = run.measure("during");
  }
  MESSAGE("the forged record announced " << announced.load() << " times in a " << during.seconds
                                         << " s window and the wait before it");
  CHECK(announced.load() >= static_cast<int64_t>(during.seconds));  // kept fresh throughout
  // The window after begins once the record has lapsed (expired 5 s after its last announce).
  REQUIRE_MESSAGE(run.wait([&] { return run.attacker_record_lapsed(); }, 15s), "the forged record never lapsed");
  const Window after = run.measure("after");

  for (const auto& peer : run.watched_peers()) {
    const int64_t unvouched = refusals_of(attacker, peer).at("unvouched_ahead") - at_start[peer.id]["unvouched_ahead"];
    MESSAGE("peer " << peer.id << " counted " << unvouched << " unvouched records ahead");
    CHECK(unvouched > 0);
  }
  MESSAGE("the forged record's address was asked " << mallory.served.load() << " times");
  CHECK(mallory.served.load() == 0);  // nobody downloaded from it, nor JOINed it
  const RunEnd end = run.finish_training();
  check_displays_refused(run);
  check_rates(before, during, after);
  run.check_rss();
  run.check_replicas_agree();
  check_loss(end, clean);
}

TEST_CASE("a forged progress record at the stage's own step and hash, under a lower id, cannot freeze its stage") {
  const RunEnd& clean = clean_run();
  HostileRun run("hostile-rounds-lead");
  Attacker& attacker = *run.attacker;
  MalloryServer hole(attacker.credentials, /*answer_ok=*/true);
  REQUIRE(attacker.id < *run.watched.begin());  // "mallory." sorts before "p00.": the leader, if believed

  run.wait_until_steady();
  const Window before = run.measure("before");

  std::atomic<int64_t> announced{0};
  std::atomic<int64_t> forged_step{-1};
  Window during;
  {
    // A copy of the stage's newest record, re-announced as the stage moves.
    PeriodicTask forger;
    forger.start(0.1, [&] {
      auto records = attacker.progress_of(0, run.watched);
      if (records.empty()) return;
      ProgressRecord forged = std::max_element(records.begin(), records.end(), [](const auto& a, const auto& b) {
                                return a.second.step < b.second.step;
                              })->second;
      forged.peer_id = attacker.id;
      forged.address = hole.server->address();
      forged.state = ProgressRecord::State::serving;
      forged.published_at = attacker.registry.now();
      if (attacker.announce(progress_registry_key(0), forged.to_json(), 5).is_ok()) {
        ++announced;
        forged_step = forged.step;
      }
    });
    // The attack has landed once the registry returns the copy, as the peers read it
    // (every 0.2 s): at the step the stage is at now, or within one.
    const bool landed = run.wait([&] {
      const auto copy = attacker.progress_of(0, {attacker.id});
      return !copy.empty() && copy.begin()->second.step + 1 >= run.watched_step();
    }, 10s);
    REQUIRE_MESSAGE(landed, "the registry never returned the forged copy at the stage's step");
    during = run.measure("during");
  }
  MESSAGE("the forged record announced " << announced.load() << " times, the last at step " << forged_step.load());
  // The window after begins once the copy has lapsed (expired 5 s after its last announce).
  REQUIRE_MESSAGE(run.wait([&] { return run.attacker_record_lapsed(); }, 15s), "the forged copy never lapsed");
  const Window after = run.measure("after");

  MESSAGE("the attacker's server was asked" << hole.asked() << log_lines(run, "aborted"));
  const RunEnd end = run.finish_training();
  check_rates(before, during, after);
  run.check_replicas_agree();
  check_loss(end, clean);
}

// Not a test of the swarm: the measurement behind kLossTolerance, run by hand
// (--test_arg=--no-skip --test_arg=--test-case='*spread*'). Three clean runs; their
// final validation losses must lie within the tolerance of each other, or the
// tolerance is too tight for the noise.
TEST_CASE("clean runs' final losses spread less than the tolerance" * doctest::skip()) {
  std::vector<double> losses;
  for (int i = 0; i < 3; ++i) losses.push_back(run_clean(fmt::format("hostile-rounds-clean-{}", i)).validation_loss);
  const auto [low, high] = std::minmax_element(losses.begin(), losses.end());
  MESSAGE(fmt::format("clean validation losses: {:.4f}; spread {:.4f}", fmt::join(losses, ", "), *high - *low));
  CHECK(*high - *low <= kLossTolerance);
}

}  // namespace
}  // namespace swarm
