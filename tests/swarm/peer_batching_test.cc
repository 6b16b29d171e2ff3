// Forward requests that arrive together are run as one stage call, and each
// caller gets exactly its own rows back.
#include <condition_variable>
#include <future>
#include <mutex>
#include <random>

#include <doctest/doctest.h>

#include "models/mlp/mlp_stage.h"
#include "swarm/compression/codecs.h"
#include "swarm/peer/peer.h"
#include "swarm/registry/in_process_registry.h"
#include "transports/inproc/inproc_transport.h"

namespace swarm {
namespace {

using namespace std::chrono_literals;

// An MLP stage whose first forward waits at a gate, so that the test can line
// requests up behind it.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  int forward_calls = 0;
  std::vector<int64_t> batch_rows;
};

class GatedStage {
 public:
  using stage_concept = stage_t;
  GatedStage(mlp::MlpStage inner, Gate* gate) : inner_(std::move(inner)), gate_(gate) {}
  bool takes_targets() const { return false; }
  StageIoSpec io_spec() const { return inner_.io_spec(); }
  Result<Tensor> forward(const TensorView& input, const TensorView* targets) {
    {
      std::unique_lock lock(gate_->mu);
      ++gate_->forward_calls;
      gate_->batch_rows.push_back(input.shape()[0]);
      gate_->cv.wait(lock, [&] { return gate_->open; });
    }
    return inner_.forward(input, targets);
  }
  Result<Tensor> backward(const TensorView& input, const TensorView& grad, const TensorView* targets) {
    return inner_.backward(input, grad, targets);
  }
  std::vector<StageParameterView> parameter_views() { return inner_.parameter_views(); }
  Status zero_grad() { return inner_.zero_grad(); }

 private:
  mlp::MlpStage inner_;
  Gate* gate_;
};
static_assert(Stage<GatedStage>);

TEST_CASE("forward requests that wait together run as one batch; each gets its own rows") {
  InProcessRegistry registry;
  Gate gate;
  PeerConfig config;
  config.stage_index = 0;
  config.peer_id = "batching-peer";
  config.bind_address = "inproc://batching-peer";
  config.max_batch = 4;
  config.codec = CodecId::none;  // the requests below are raw f32
  const mlp::MlpLayerConfig layer{.in = 3, .out = 5, .gelu = true};
  Peer<GatedStage, InprocTransport, InProcessRegistry, compression::StandardCodecs> peer(config, GatedStage(*mlp::MlpStage::create(layer, 11), &gate),
                                                            &registry);
  REQUIRE(peer.start().is_ok());
  auto client = InprocTransport::connect(peer.address(), {});
  REQUIRE(client.is_ok());

  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<Tensor> inputs;
  std::vector<Call> calls;
  for (int i = 0; i < 4; ++i) {
    Tensor x = *Tensor::empty(Shape{i + 1, 3}, DType::f32);  // batches of 1, 2, 3 and 4 rows
    for (float& v : x.span<float>()) v = normal(rng);
    wire::MessageHeader header;
    header.kind = wire::MessageKind::forward;
    header.stage = 0;
    header.request_id = i;
    header.microbatch_id = 100 + i;
    header.deadline_unix_ms = protocol::unix_millis_now() + 60'000;
    std::vector<TensorView> views{x};
    calls.push_back(client->call(*wire::encode_message(header, views), Clock::now() + 30s));
    inputs.push_back(std::move(x));
    if (i == 0) {
      // Wait until the first request sits at the gate before the others come.
      const auto deadline = Clock::now() + 10s;
      while (Clock::now() < deadline) {
        std::lock_guard lock(gate.mu);
        if (gate.forward_calls == 1) break;
      }
    }
  }
  // All four are in the peer: one at the gate, three queued behind it.
  const auto deadline = Clock::now() + 10s;
  while (peer.requests_in_service() < 4 && Clock::now() < deadline) {
  }
  REQUIRE(peer.requests_in_service() == 4);
  {
    // Every compute worker is taken; control traffic has its own server and is
    // answered anyway, while the stage is still held at the gate.
    auto control = InprocTransport::connect(peer.control_address(), {});
    REQUIRE(control.is_ok());
    wire::MessageHeader ping;
    ping.kind = wire::MessageKind::ping;
    auto pong = control->call(*wire::encode_message(ping, std::vector<TensorView>{}), Clock::now() + 5s).get();
    REQUIRE_MESSAGE(pong.is_ok(), pong.status().to_string());
    auto decoded = wire::decode_message(pong->views(), wire::Limits{});
    REQUIRE(decoded.is_ok());
    CHECK(decoded->header.kind == wire::MessageKind::result);
    std::lock_guard lock(gate.mu);
    CHECK_FALSE(gate.open);
    CHECK(gate.forward_calls == 1);
  }
  {
    std::lock_guard lock(gate.mu);
    gate.open = true;
  }
  gate.cv.notify_all();

  auto reference = *mlp::MlpStage::create(layer, 11);
  for (int i = 0; i < 4; ++i) {
    auto reply = calls[i].get();
    REQUIRE(reply.is_ok());
    auto decoded = wire::decode_message(reply->views(), wire::Limits{});
    REQUIRE(decoded.is_ok());
    REQUIRE(decoded->header.kind == wire::MessageKind::result);
    const TensorView& got = decoded->tensors[0].view;
    Tensor want = *reference.forward(inputs[i], nullptr);
    REQUIRE(got.shape() == want.shape());
    for (int64_t k = 0; k < want.numel(); ++k) {
      CHECK(got.data<float>()[k] == doctest::Approx(want.data<float>()[k]).epsilon(1e-5));
    }
  }
  // Two stage calls served four requests: the first alone, then the other three stacked.
  std::lock_guard lock(gate.mu);
  CHECK(gate.forward_calls == 2);
  CHECK(gate.batch_rows == std::vector<int64_t>{1, 2 + 3 + 4});
  CHECK(peer.stats().forward_batches == 2);
  CHECK(peer.stats().forward == 4);
}

}  // namespace
}  // namespace swarm
