// Backwards from a member trainer, over real processes and sockets (the swarm, the
// windows and the checks: hostile_rounds_fixture.h). While a trainer trains, a
// member sends stage 1 (the loss stage) backwards for microbatches it never
// forwarded, with d_loss = -1000: once, 901 of them were accepted and the training
// loss went from 2.9 to 76,650, with no counter raised. The protocol fixes d_loss
// (protocol::kLossGradient), so each is refused and counted as `loss_gradient`. It
// also sends stage 0 backwards with steered gradients for microbatches it never
// forwarded there: refused and counted as `backward_unbound`. Stage 1's rate, its
// replicas and the run's final loss are judged against a clean run's.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <doctest/doctest.h>

#include "swarm/compression/codecs.h"
#include "swarm/peer/periodic_task.h"
#include "swarm/protocol/tensor_codec.h"
#include "tests/apps/hostile_rounds_fixture.h"

namespace swarm {
namespace {

using namespace hostile_rounds;  // HostileRun, Window, clean_run, check_*, and hostile_member.h
using namespace std::chrono_literals;

constexpr int kRows = 4;  // the trainer's microbatch
constexpr float kSteeringGradient = -1000.0f;

// A loss-stage backward of a microbatch nobody forwarded: activations that fit the
// stage's input, real-looking targets, and d_loss = kSteeringGradient.
wire::Frames steered_backward(const protocol::StageSpec& spec, uint64_t microbatch_id) {
  const int64_t width = spec.io.input.dims.back();
  const auto [hidden, targets] = loss_stage_batch(kRows, kSeqLen, width);
  Tensor d_loss = *Tensor::empty(Shape{1}, DType::f32);
  d_loss.data<float>()[0] = kSteeringGradient;

  protocol::StageRequest request;
  request.kind = wire::MessageKind::backward;
  request.request_id = microbatch_id;
  auto input =
      protocol::encode_floats<compression::StandardCodecs>(hidden, protocol::codec_for(spec, protocol::TensorRole::input));
  REQUIRE_MESSAGE(input.is_ok(), input.status().to_string());
  request.input = std::move(input).value();
  request.grad_output = protocol::raw_tensor(d_loss);
  request.targets = protocol::raw_tensor(targets);
  request.microbatch_id = microbatch_id;
  request.deadline_unix_ms = protocol::unix_millis_now() + 5000;
  return must(protocol::encode_request(request, spec.stage, protocol::reply_codec_for(spec, request.kind)));
}

// A stage-0 backward of a microbatch nobody forwarded there, its output gradient
// scaled by kSteeringGradient: the stage takes backwards only for forwards it
// served the caller (ForwardLedger).
wire::Frames unbound_backward(const protocol::StageSpec& spec, uint64_t microbatch_id) {
  const int64_t width = spec.io.output.dims.back();
  Tensor tokens = *Tensor::zeros(Shape{kRows, kSeqLen}, DType::i32);
  for (int32_t& t : tokens.span<int32_t>()) t = 'a';
  Tensor grad = *Tensor::empty(Shape{kRows, kSeqLen, width}, DType::f32);
  float v = 0.5f;
  for (float& x : grad.span<float>()) x = kSteeringGradient * 1e-3f * (v = std::fmod(v * 1.3f + 0.1f, 1.0f));
  auto grad_output = protocol::encode_floats<compression::StandardCodecs>(
      grad, protocol::codec_for(spec, protocol::TensorRole::grad_output));
  REQUIRE_MESSAGE(grad_output.is_ok(), grad_output.status().to_string());
  protocol::StageRequest request;
  request.kind = wire::MessageKind::backward;
  request.request_id = microbatch_id;
  request.input = protocol::raw_tensor(tokens);
  request.grad_output = std::move(grad_output).value();
  request.microbatch_id = microbatch_id;
  request.deadline_unix_ms = protocol::unix_millis_now() + 5000;
  return must(protocol::encode_request(request, spec.stage, protocol::reply_codec_for(spec, request.kind)));
}

TEST_CASE("a member trainer's steered loss-stage backwards are refused and counted; the training holds") {
  const RunEnd& clean = clean_run();
  HostileRun run("hostile-backward", /*stage0_peers=*/2, /*watched_stage=*/1);
  Attacker& attacker = *run.attacker;
  const std::vector<LivePeer> targets = run.watched_peers();
  const protocol::StageSpec spec = spec_of(attacker, targets[0]);
  REQUIRE(spec.io.targets.has_value());  // stage 1 is the loss stage
  std::vector<LivePeer> first_stage;
  for (const auto& [id, peer] : run.peers) {
    if (peer.stage == 0) first_stage.push_back(peer);
  }
  REQUIRE(first_stage.size() == 2);
  const protocol::StageSpec first_spec = spec_of(attacker, first_stage[0]);
  std::map<std::string, protocol::RefusalCounts> at_start;
  for (const auto& peer : targets) at_start[peer.id] = refusals_of(attacker, peer);
  for (const auto& peer : first_stage) at_start[peer.id] = refusals_of(attacker, peer);

  run.wait_until_steady();
  const Window before = run.measure("before");

  // The attack's pace: some 100 a second, ids far from the trainer's; every
  // fourth at stage 0, without its forward.
  Tally tally, unbound;
  Counter answered;
  uint64_t next_id = uint64_t{1} << 62;
  PeriodicTask stream;
  stream.start(0.01, [&] {
    const uint64_t id = next_id++;
    if (id % 4 == 3) {
      unbound.count(reply_of(attacker.call(first_stage[id % 2].compute, unbound_backward(first_spec, id))));
      return;
    }
    const Reply reply = reply_of(attacker.call(targets[id % targets.size()].compute, steered_backward(spec, id)));
    tally.count(reply);
    if (reply.answered) answered.add();
  });
  // The attack has landed once the peers have answered some of it.
  REQUIRE_MESSAGE(answered.wait_for_at_least(20, 10s), "the peers answered " << answered.value());
  const Window during = run.measure("during");
  stream.stop();
  const Window after = run.measure("after");

  MESSAGE(fmt::format("steered backwards: {} sent, {} refused ({}), {} accepted, {} unanswered", tally.sent,
                      tally.refused, tally.last_refusal, tally.accepted, tally.unanswered));
  CHECK(tally.sent >= 100);  // as fast as the peers answer: each waits its turn behind the training
  CHECK(tally.accepted == 0);
  CHECK(tally.refused == tally.sent - tally.unanswered);
  CHECK(tally.last_refusal.find("d_loss") != std::string::npos);
  int64_t counted = 0;
  for (const auto& peer : targets) {
    protocol::RefusalCounts now = refusals_of(attacker, peer);
    const int64_t grown = now["loss_gradient"] - at_start[peer.id]["loss_gradient"];
    MESSAGE("peer " << peer.id << ": loss_gradient +" << grown);
    counted += grown;
  }
  CHECK(counted == tally.refused);
  MESSAGE(fmt::format("stage-0 backwards without their forward: {} sent, {} refused ({}), {} accepted, {} unanswered",
                      unbound.sent, unbound.refused, unbound.last_refusal, unbound.accepted, unbound.unanswered));
  CHECK(unbound.sent >= 20);
  CHECK(unbound.accepted == 0);
  CHECK(unbound.last_refusal.find("without its forward") != std::string::npos);
  int64_t unbound_counted = 0;
  for (const auto& peer : first_stage) {
    protocol::RefusalCounts now = refusals_of(attacker, peer);
    unbound_counted += now["backward_unbound"] - at_start[peer.id]["backward_unbound"];
  }
  CHECK(unbound_counted == unbound.refused);

  finish_and_judge(run, before, during, after, clean);
}

}  // namespace
}  // namespace swarm
