// A pipeline's retry gets the reply its first attempt sent, once that finished;
// one that arrives while the first still runs waits for it; bounded.
#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <thread>

#include "swarm/peer/pipeline_replays.h"

namespace swarm {
namespace {

using std::chrono::milliseconds;

protocol::StageReply reply_with_loss(float loss) {
  protocol::StageReply reply;
  reply.loss = loss;
  return reply;
}

Deadline soon() { return Clock::now() + std::chrono::seconds(5); }

TEST_CASE("the first attempt runs; a retry after it finished gets its reply; a failed one is run again") {
  PipelineReplays replays;
  REQUIRE(replays.claim(7, soon()).claim == PipelineReplays::Claim::run);
  const protocol::StageReply sent = reply_with_loss(2.5f);
  replays.finish(7, &sent);
  const PipelineReplays::Claimed again = replays.claim(7, soon());
  CHECK(again.claim == PipelineReplays::Claim::replay);
  CHECK(again.reply.loss == 2.5f);
  CHECK(replays.replayed() == 1);

  REQUIRE(replays.claim(8, soon()).claim == PipelineReplays::Claim::run);
  replays.finish(8, nullptr);  // failed: nothing to replay
  CHECK(replays.claim(8, soon()).claim == PipelineReplays::Claim::run);
}

TEST_CASE("a retry that arrives while the first attempt runs waits for its reply, or gives up at its deadline") {
  PipelineReplays replays;
  REQUIRE(replays.claim(9, soon()).claim == PipelineReplays::Claim::run);
  CHECK(replays.claim(9, Clock::now() + milliseconds(20)).claim == PipelineReplays::Claim::gave_up);
  auto waiting = std::async(std::launch::async, [&] { return replays.claim(9, soon()); });
  CHECK(waiting.wait_for(milliseconds(50)) == std::future_status::timeout);
  const protocol::StageReply sent = reply_with_loss(1.25f);
  replays.finish(9, &sent);
  const PipelineReplays::Claimed waited = waiting.get();
  CHECK(waited.claim == PipelineReplays::Claim::replay);
  CHECK(waited.reply.loss == 1.25f);
}

TEST_CASE("replies are kept up to the capacity, oldest dropped first, for their time, and not across a move") {
  Clock::time_point fake = Clock::now();
  PipelineReplays replays({/*max_replies=*/2, /*max_bytes=*/size_t{1} << 20, /*keep_seconds=*/0.2}, [&] { return fake; });
  const protocol::StageReply sent = reply_with_loss(1);
  for (uint64_t id : {1, 2, 3}) {
    REQUIRE(replays.claim(id, soon()).claim == PipelineReplays::Claim::run);
    replays.finish(id, &sent);
  }
  CHECK(replays.claim(1, soon()).claim == PipelineReplays::Claim::run);  // evicted: computed again
  replays.finish(1, nullptr);
  CHECK(replays.claim(3, soon()).claim == PipelineReplays::Claim::replay);
  fake += milliseconds(199);
  CHECK(replays.claim(3, soon()).claim == PipelineReplays::Claim::replay);
  fake += milliseconds(2);  // past keep_seconds
  CHECK(replays.claim(3, soon()).claim == PipelineReplays::Claim::run);
  replays.finish(3, &sent);
  replays.clear();
  CHECK(replays.claim(3, soon()).claim == PipelineReplays::Claim::run);
}

TEST_CASE("a retry a deadline late still replays at a fast stage's rate") {
  // The classifier's stages finished some 800 pipelines a second; a trainer's retry
  // came 7 s after the first attempt. With 64 replies kept, its reply was gone, the
  // replica refused it as a duplicate and a stage-mate counted it again (76816
  // samples of 76800 in classifier_program_test).
  PipelineReplays replays;
  const protocol::StageReply sent = reply_with_loss(1);
  for (uint64_t id = 1; id <= 8 * 800; ++id) {
    REQUIRE(replays.claim(id, soon()).claim == PipelineReplays::Claim::run);
    replays.finish(id, &sent);
  }
  CHECK(replays.claim(1, soon()).claim == PipelineReplays::Claim::replay);
}

TEST_CASE("replies are kept within a byte budget, oldest dropped first") {
  Tensor gradient = *Tensor::zeros(Shape{1000}, DType::f32);
  protocol::StageReply large{protocol::raw_tensor(gradient), 1.0f};
  PipelineReplays replays({/*max_replies=*/100, /*max_bytes=*/10000, /*keep_seconds=*/60});
  for (uint64_t id : {1, 2, 3}) {  // 4000 bytes and some each: the third pushes the first out
    REQUIRE(replays.claim(id, soon()).claim == PipelineReplays::Claim::run);
    replays.finish(id, &large);
  }
  CHECK(replays.claim(1, soon()).claim == PipelineReplays::Claim::run);
  replays.finish(1, nullptr);
  CHECK(replays.claim(2, soon()).claim == PipelineReplays::Claim::replay);
  CHECK(replays.claim(3, soon()).claim == PipelineReplays::Claim::replay);
  // One reply beyond the whole budget is not kept, and pushes nothing out.
  Tensor huge_gradient = *Tensor::zeros(Shape{4000}, DType::f32);
  protocol::StageReply huge{protocol::raw_tensor(huge_gradient), 1.0f};
  REQUIRE(replays.claim(4, soon()).claim == PipelineReplays::Claim::run);
  replays.finish(4, &huge);
  CHECK(replays.claim(4, soon()).claim == PipelineReplays::Claim::run);
  replays.finish(4, nullptr);
  CHECK(replays.claim(3, soon()).claim == PipelineReplays::Claim::replay);
}

}  // namespace
}  // namespace swarm
