// Peer to peer, hops answered at once. The outcome of a pipeline a peer passed on
// comes back as a pipeline_result request of its own: only the peer the pipeline
// went to may deliver it, once, for that microbatch, under the pipeline's token;
// anything else is refused and counted, and nothing from outside grows the table.
// Also: the form of a pipeline_result and of the answer "accepted", the bound on
// answered pipelines in progress, and a decoded message's owned copy.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "swarm/peer/hop_workers.h"
#include "swarm/protocol/pipeline_result.h"
#include "swarm/protocol/tensor_codec.h"
#include "swarm/trainer/hop_returns.h"
#include "swarm/wire/owned_message.h"

namespace swarm {
namespace {

Deadline past() { return Clock::now() - std::chrono::seconds(1); }

protocol::StageReply gradient_and_loss(float loss) {
  Tensor gradient = *Tensor::empty(Shape{2, 3}, DType::f32);
  for (int i = 0; i < 6; ++i) gradient.data<float>()[i] = 0.5f * i;
  protocol::StageReply reply;
  reply.tensor = protocol::raw_tensor(gradient);
  reply.loss = loss;
  reply.metrics = {0.25f};
  return reply;
}

protocol::PipelineResult result_for(uint64_t token, uint64_t microbatch, std::string from, float loss) {
  protocol::PipelineResult result;
  result.return_id = token;
  result.microbatch_id = microbatch;
  result.from_peer = std::move(from);
  result.outcome = gradient_and_loss(loss);
  return result;
}

TEST_CASE("an outcome reaches the pipeline that waits for it, from the peer it went to, once") {
  HopReturns returns;
  const uint64_t token = returns.expect(41, "s1p0");
  CHECK(token != 0);
  CHECK(returns.waiting() == 1);
  CHECK(returns.deliver(result_for(token, 41, "s1p0", 2.5f)).is_ok());
  // The same token again: its pipeline has its outcome already.
  CHECK(returns.deliver(result_for(token, 41, "s1p0", 9.0f)).code() == StatusCode::not_found);
  // Delivered before the wait: no thread needed, nothing waited.
  Result<protocol::StageReply> outcome = returns.wait(token, past());
  REQUIRE(outcome.is_ok());
  CHECK(*outcome->loss == 2.5f);
  CHECK(returns.waiting() == 0);
  // Spent: a late copy is refused, and the table stays empty.
  CHECK(returns.deliver(result_for(token, 41, "s1p0", 2.5f)).code() == StatusCode::not_found);
  CHECK(returns.waiting() == 0);
  CHECK(returns.counts().delivered == 1);
  CHECK(returns.counts().unknown == 2);
}

TEST_CASE("another peer, another microbatch or a forged token cannot deliver an outcome") {
  HopReturns returns;
  const uint64_t token = returns.expect(41, "s1p0");
  CHECK(returns.deliver(result_for(token, 41, "s1p1", 1.0f)).code() == StatusCode::permission_denied);
  CHECK(returns.deliver(result_for(token, 42, "s1p0", 1.0f)).code() == StatusCode::permission_denied);
  CHECK(returns.deliver(result_for(token + 1, 41, "s1p0", 1.0f)).code() == StatusCode::not_found);
  CHECK(returns.counts().wrong_sender == 2);
  CHECK(returns.counts().unknown == 1);
  // None of them took the place of the real one.
  CHECK(returns.deliver(result_for(token, 41, "s1p0", 3.0f)).is_ok());
  CHECK(*returns.wait(token, past())->loss == 3.0f);
}

TEST_CASE("an accepted pipeline with no outcome by its deadline times out; a refused one is forgotten") {
  HopReturns returns;
  const uint64_t silent = returns.expect(7, "s1p0");
  Result<protocol::StageReply> outcome = returns.wait(silent, past());
  CHECK(outcome.status().code() == StatusCode::deadline_exceeded);
  CHECK(returns.deliver(result_for(silent, 7, "s1p0", 1.0f)).code() == StatusCode::not_found);  // too late
  const uint64_t refused = returns.expect(8, "s1p1");
  returns.forget(refused);
  CHECK(returns.waiting() == 0);
}

TEST_CASE("an error outcome is delivered as the error; close wakes a waiter") {
  HopReturns returns;
  const uint64_t token = returns.expect(9, "s1p0");
  protocol::PipelineResult failed;
  failed.return_id = token;
  failed.microbatch_id = 9;
  failed.from_peer = "s1p0";
  failed.outcome = unavailable("stage 2 has no peers");
  CHECK(returns.deliver(std::move(failed)).is_ok());
  CHECK(returns.wait(token, past()).status().code() == StatusCode::unavailable);

  const uint64_t waiting = returns.expect(10, "s1p0");
  std::thread closer([&] {
    while (returns.waiting() == 0) std::this_thread::yield();
    returns.close();
  });
  // Without close this would wait a minute: the test's deadline is the close.
  const auto started = Clock::now();
  CHECK(returns.wait(waiting, Clock::now() + std::chrono::seconds(60)).status().code() == StatusCode::unavailable);
  closer.join();
  CHECK(Clock::now() - started < std::chrono::seconds(30));
}

Result<protocol::PipelineResult> round_trip(const wire::Frames& frames) {
  SWARM_ASSIGN_OR_RETURN(wire::DecodedMessage message, wire::decode_message(frames.views(), wire::Limits{}));
  return protocol::parse_pipeline_result(message);
}

TEST_CASE("a pipeline_result carries the gradient and the loss, or the error, and nothing else") {
  auto frames = protocol::encode_pipeline_result(0, 5, 41, "s1p0", 77, gradient_and_loss(1.5f));
  REQUIRE(frames.is_ok());
  auto parsed = round_trip(*frames);
  REQUIRE(parsed.is_ok());
  CHECK(parsed->microbatch_id == 41);
  CHECK(parsed->return_id == 77);
  CHECK(parsed->from_peer == "s1p0");
  REQUIRE(parsed->outcome.is_ok());
  CHECK(*parsed->outcome->loss == 1.5f);
  CHECK(parsed->outcome->metrics == std::vector<float>{0.25f});
  CHECK(parsed->outcome->tensor->dims == std::vector<int64_t>{2, 3});

  auto error = round_trip(*protocol::encode_pipeline_result(0, 6, 41, "s1p0", 77, unavailable("gone")));
  REQUIRE(error.is_ok());
  CHECK(error->outcome.status().code() == StatusCode::unavailable);
  CHECK(error->outcome.status().message() == "gone");

  // A success needs both tensors; a result needs its ids and its sender.
  protocol::StageReply no_loss = gradient_and_loss(1.0f);
  no_loss.loss.reset();
  CHECK(!protocol::encode_pipeline_result(0, 7, 41, "s1p0", 77, no_loss).is_ok());
  CHECK(round_trip(*protocol::encode_pipeline_result(0, 8, 0, "s1p0", 77, gradient_and_loss(1.0f))).status().code() ==
        StatusCode::invalid_argument);
  CHECK(round_trip(*protocol::encode_pipeline_result(0, 8, 41, "", 77, gradient_and_loss(1.0f))).status().code() ==
        StatusCode::invalid_argument);
  CHECK(round_trip(*protocol::encode_pipeline_result(0, 8, 41, "s1p0", 0, gradient_and_loss(1.0f))).status().code() ==
        StatusCode::invalid_argument);

  // Forged by hand: an error code beside tensors, three tensors, a loss of the wrong form.
  wire::MessageHeader header;
  header.kind = wire::MessageKind::pipeline_result;
  header.microbatch_id = 41;
  header.return_id = 77;
  header.reply_to = "s1p0";
  const protocol::StageReply good = gradient_and_loss(1.0f);
  header.error_code = static_cast<uint16_t>(StatusCode::unavailable);
  std::vector<wire::EncodedTensor> one{*good.tensor};
  CHECK(round_trip(*wire::encode_message_payloads(header, one)).status().code() == StatusCode::invalid_argument);
  header.error_code = 0;
  std::vector<wire::EncodedTensor> three{*good.tensor, *good.tensor, *good.tensor};
  CHECK(round_trip(*wire::encode_message_payloads(header, three)).status().code() == StatusCode::invalid_argument);
  std::vector<wire::EncodedTensor> matrix_loss{*good.tensor, *good.tensor};  // a 2x3 "loss"
  CHECK(round_trip(*wire::encode_message_payloads(header, matrix_loss)).status().code() == StatusCode::invalid_argument);
  // A reply_to beyond the wire's bound is refused when encoding.
  header.reply_to.assign(wire::kMaxWireReplyTo + 1, 'x');
  CHECK(!wire::encode_message_payloads(header, one).is_ok());
}

TEST_CASE("the answer accepted is a result without tensors; a pipeline's reply is not one") {
  CHECK(protocol::is_acceptance(protocol::encode_acceptance(3, 1)));
  CHECK(!protocol::is_acceptance(*protocol::encode_reply(3, 1, gradient_and_loss(1.0f))));
  CHECK(!protocol::is_acceptance(wire::make_error_reply(3, 1, unavailable("busy"))));
}

TEST_CASE("hop workers run at most their bound at once; beyond it, busy; a finished one frees its place") {
  std::mutex mu;
  std::condition_variable changed;
  int started = 0;
  bool release = false;
  std::atomic<int> finished{0};
  {
    HopWorkers workers(2);
    const auto job = [&] {
      std::unique_lock lock(mu);
      ++started;
      changed.notify_all();
      changed.wait(lock, [&] { return release; });
      ++finished;
    };
    CHECK(workers.try_run(job));
    CHECK(workers.try_run(job));
    CHECK(!workers.try_run(job));  // busy
    {
      std::unique_lock lock(mu);
      changed.wait(lock, [&] { return started == 2; });
      release = true;
      changed.notify_all();
    }
    while (finished.load() < 2) std::this_thread::yield();
    while (workers.running() > 0) std::this_thread::yield();
    CHECK(workers.try_run(job));  // room again
  }  // the destructor waits for the third
  CHECK(finished.load() == 3);
}

TEST_CASE("an owned copy of a decoded message keeps its header and tensors after the frames are gone") {
  std::shared_ptr<const wire::OwnedMessage> owned;
  {
    auto frames = protocol::encode_reply(9, 1, gradient_and_loss(4.0f));
    REQUIRE(frames.is_ok());
    auto decoded = wire::decode_message(frames->views(), wire::Limits{});
    REQUIRE(decoded.is_ok());
    owned = wire::OwnedMessage::copy_of(*decoded);
  }
  REQUIRE(owned->message.tensors.size() == 2);
  CHECK(owned->message.header.request_id == 9);
  const TensorView& gradient = owned->message.tensors[0].view;
  CHECK(gradient.shape() == Shape{2, 3});
  CHECK(gradient.data<float>()[5] == 2.5f);
  CHECK(owned->message.tensors[1].view.data<float>()[0] == 4.0f);
}

}  // namespace
}  // namespace swarm
