// The simulator's hops (--hops hub|p2p), the trainers' links, joined rounds and the
// waits they cause: bytes on each link, the pace they set, and each stage counting
// every microbatch once when a path breaks.
#include <cmath>

#include <doctest/doctest.h>

#include "tests/sim/sim_test_util.h"

namespace swarm::sim {
namespace {

using testing::run;

// 2 stages x 2 peers, one trainer, every process behind the same slow link and compute
// so fast that the links set the pace: the time-to-target setup of docs/NETWORK.md.
Scenario linked_swarm(HopMode hops) {
  Scenario s;
  s.peers = 4;
  s.stages = 2;
  s.trainers = 1;
  s.in_flight = 32;
  s.microbatch = 8;
  s.seq_len = 128;
  s.d_model = 128;
  s.activation_bytes = 524'288;            // f32 [8, 128, 128]
  s.activation_gradient_bytes = 262'144;   // a cheaper gradient codec, to tell them apart
  s.stage_params = 400'000;
  s.gradient_bytes = 1'600'000;
  s.throughput = Distribution::constant(1e5);
  s.backward_cost = 2;
  s.last_stage_cost = 3;
  s.compute_jitter = 0;
  s.latency_ms = Distribution::constant(50);
  s.bandwidth_mbps = Distribution::constant(200);
  s.trainer_bandwidth_mbps = 200;
  s.trainer_latency_ms = 50;
  s.hops = hops;
  s.rounds = RoundTrigger::joins;
  s.global_batch.target_samples = 256;
  s.rebalance = false;
  s.seconds = 60;
  s.sample_every = 3;
  return s;
}

double step_seconds(const Summary& summary, const Scenario& s) {
  REQUIRE(summary.throughput_end > 0);
  return static_cast<double>(32 * s.microbatch) / summary.throughput_end;
}

TEST_CASE("hub mode puts every stage's traffic on the trainer's link; peer to peer only tokens and the loss") {
  const Scenario hub = linked_swarm(HopMode::hub), p2p = linked_swarm(HopMode::peer_to_peer);
  const testing::Run h = run(hub), p = run(p2p);
  const double tokens = 4.0 * 8 * 128;
  // Hub: stage 0's forward (tokens), the loss stage's fused request (activation and
  // targets), stage 0's backward (its input again and the gradient); replies: the
  // activation, the gradient, nothing.
  const double hub_up = tokens + (524'288 + tokens) + (tokens + 262'144);
  // Per microbatch, over microbatches partly sent or answered at the end.
  CHECK(h.summary.trainer_up_bytes / h.summary.microbatches_started == doctest::Approx(hub_up).epsilon(0.02));
  CHECK(h.summary.trainer_down_bytes / h.summary.microbatches_completed ==
        doctest::Approx(524'288 + 262'144).epsilon(0.02));
  CHECK(p.summary.trainer_up_bytes / p.summary.microbatches_started == doctest::Approx(2 * tokens));
  CHECK(p.summary.trainer_down_bytes / p.summary.microbatches_completed == doctest::Approx(64).epsilon(0.01));
  CHECK(h.summary.microbatches_abandoned == 0);
  CHECK(p.summary.microbatches_abandoned == 0);
}

TEST_CASE("a hub step on a saturated trainer link takes its bytes over the bandwidth; peer to peer is faster") {
  const Scenario hub = linked_swarm(HopMode::hub), p2p = linked_swarm(HopMode::peer_to_peer);
  const testing::Run h = run(hub), p = run(p2p);
  const double bytes_per_second = 200e6 / 8;
  const double up_per_microbatch = h.summary.trainer_up_bytes / h.summary.microbatches_started;
  const double link_floor = 32 * up_per_microbatch / bytes_per_second;
  const double hub_step = step_seconds(h.summary, hub), p2p_step = step_seconds(p.summary, p2p);
  INFO("hub step ", hub_step, " s against its link's floor ", link_floor, " s; p2p step ", p2p_step, " s");
  CHECK(hub_step >= link_floor * 0.99);
  CHECK(hub_step <= link_floor * 1.2);
  CHECK(hub_step / p2p_step >= 1.5);
}

TEST_CASE("joined rounds step the stage once per global batch of the samples it accumulated") {
  for (HopMode hops : {HopMode::hub, HopMode::peer_to_peer}) {
    const testing::Run r = run(linked_swarm(hops));
    for (int stage = 0; stage < 2; ++stage) {
      INFO(std::string(hop_mode_name(hops)), " stage ", stage, ": ", r.summary.stage_samples[stage], " samples, ",
           r.summary.global_steps[stage], " steps");
      CHECK(r.summary.global_steps[stage] >= 20);
      // A round that took k batches counts k steps; the last batch may still be accumulating or averaging.
      CHECK(r.summary.global_steps[stage] <= r.summary.stage_samples[stage] / 256 + 1);
      CHECK(r.summary.global_steps[stage] >= r.summary.stage_samples[stage] / 256 - 2);
    }
  }
}

TEST_CASE("peer to peer: peers killed mid-forward and mid-backward lose no microbatch and none counts twice") {
  Scenario s = linked_swarm(HopMode::peer_to_peer);
  s.peers = 6;  // 3 per stage, so each stage keeps two after its kill
  s.forward_timeout = 2;
  s.backward_timeout = 3;
  s.schedule = *parse_schedule("kill:0:20.01,kill:1:35.02");
  const testing::Run r = run(s);
  const Summary& sum = r.summary;
  INFO("completed ", sum.microbatches_completed, ", restarts ", sum.path_restarts, ", duplicates ",
       sum.duplicates_refused, ", timeouts ", sum.timeouts);
  CHECK(sum.kills == 2);
  CHECK(sum.microbatches_abandoned == 0);
  CHECK(sum.path_restarts > 0);  // the stage-0 kill broke paths on their way back
  CHECK(sum.timeouts > 0);
  const int64_t completed = sum.microbatches_completed * s.microbatch;
  const int64_t in_flight = sum.microbatches_in_flight * s.microbatch;
  for (int stage = 0; stage < 2; ++stage) {
    INFO("stage ", stage, " accumulated ", sum.stage_samples[stage]);
    CHECK(sum.stage_samples[stage] >= completed);
    CHECK(sum.stage_samples[stage] <= completed + in_flight);
  }
}

TEST_CASE("peer to peer with the same scenario writes the same bytes") {
  Scenario s = linked_swarm(HopMode::peer_to_peer);
  s.peers = 6;
  s.schedule = *parse_schedule("kill:1:10");
  CHECK(run(s).lines == run(s).lines);
}

TEST_CASE("a forward hold makes forwards that meet pending gradients wait, one at a time") {
  // Small activations (a maxout boundary and 4 bits), so the links' bandwidth does not
  // bind; 2 peers a stage, whose rounds take link crossings while the next step's
  // forwards arrive. The real runs measured 0.541 s a step with the 20 ms hold and
  // 0.406 s without (docs/NETWORK.md, "Time to target").
  Scenario s = linked_swarm(HopMode::peer_to_peer);
  s.activation_bytes = s.activation_gradient_bytes = 20'000;
  s.gradient_bytes = 200'000;
  s.round_wait = 0.25;
  const double free_step = step_seconds(run(s).summary, s);
  s.forward_hold = 0.02;
  const double held_step = step_seconds(run(s).summary, s);
  INFO("step without the hold ", free_step, " s, with it ", held_step, " s");
  CHECK(free_step >= 0.2);  // four 50 ms crossings at the least
  CHECK(held_step >= free_step + 0.1);
  CHECK(held_step <= free_step + 32 * 0.02);  // at most every forward of a step held in full
}

TEST_CASE("work that waits for the round's step pays the round; with no wait the round overlaps the pipeline") {
  Scenario s = linked_swarm(HopMode::peer_to_peer);
  s.activation_bytes = s.activation_gradient_bytes = 20'000;
  s.gradient_bytes = 1'000'000;  // 20 ms through a 25 MB/s link each way, plus four crossings
  s.round_wait = 0.25;
  const double waiting = step_seconds(run(s).summary, s);
  s.round_wait = 0;
  const double overlapped = step_seconds(run(s).summary, s);
  INFO("step with the round wait ", waiting, " s, without ", overlapped, " s");
  CHECK(overlapped == doctest::Approx(0.2).epsilon(0.1));  // the pipeline's four crossings
  CHECK(waiting >= overlapped + 0.15);                    // the round's crossings and parts on top
}

TEST_CASE("bad hop and round settings are refused by name") {
  Scenario s = linked_swarm(HopMode::hub);
  s.trainer_bandwidth_mbps = -1;
  CHECK(s.validate().message().find("--trainer-bandwidth-mbps") != std::string::npos);
  s = linked_swarm(HopMode::hub);
  s.forward_hold = std::nan("");
  CHECK(s.validate().message().find("--forward-hold") != std::string::npos);
  CHECK(parse_hop_mode("ring").status().message().find("--hops") != std::string::npos);
  CHECK(parse_round_trigger("eventually").status().message().find("--rounds") != std::string::npos);
  CHECK(*parse_hop_mode("p2p") == HopMode::peer_to_peer);
}

}  // namespace
}  // namespace swarm::sim
