// A peer with an admission rule (a swarm with an owner: certified callers only)
// serves nothing to a caller the rule refuses, its info included, and counts each
// refusal; an admitted caller is served as before.
#include <doctest/doctest.h>

#include "models/mlp/mlp_stage.h"
#include "swarm/compression/codecs.h"
#include "swarm/peer/peer.h"
#include "swarm/protocol/stage_protocol.h"
#include "swarm/registry/in_process_registry.h"
#include "transports/inproc/inproc_transport.h"

namespace swarm {
namespace {

using namespace std::chrono_literals;

constexpr std::string_view kAdmitted = "a certificate the rule accepts";

wire::Frames forward_request(std::string_view credential) {
  Tensor x = *Tensor::empty(Shape{2, 3}, DType::f32);
  for (float& v : x.span<float>()) v = 0.5f;
  wire::MessageHeader header;
  header.kind = wire::MessageKind::forward;
  header.stage = 0;
  header.request_id = 1;
  header.microbatch_id = 7;
  header.deadline_unix_ms = protocol::unix_millis_now() + 60'000;
  header.credential = std::string(credential);
  std::vector<TensorView> views{x};
  return *wire::encode_message(header, views);
}

// The reply's kind and, for an error, its code.
std::pair<wire::MessageKind, StatusCode> answer(InprocClient& client, wire::Frames request) {
  auto reply = client.call(std::move(request), Clock::now() + 10s).get();
  REQUIRE_MESSAGE(reply.is_ok(), reply.status().to_string());
  auto decoded = wire::decode_message(reply->views(), wire::Limits{});
  REQUIRE(decoded.is_ok());
  const StatusCode code = decoded->header.kind == wire::MessageKind::error
                              ? wire::status_from_error_reply(decoded->header).code()
                              : StatusCode::ok;
  return {decoded->header.kind, code};
}

TEST_CASE("a peer with an admission rule serves a refused caller nothing, not even its info, and counts each refusal") {
  InProcessRegistry registry;
  PeerConfig config;
  config.stage_index = 0;
  config.peer_id = "admitting-peer";
  config.bind_address = "inproc://admitting-peer";
  config.codec = CodecId::none;  // the requests below are raw f32
  config.admit_caller = [](const PeerIdentity&, std::string_view credential) {
    return credential == kAdmitted ? Status::ok() : permission_denied("uncertified caller");
  };
  const mlp::MlpLayerConfig layer{.in = 3, .out = 5, .gelu = true};
  Peer<mlp::MlpStage, InprocTransport, InProcessRegistry, compression::StandardCodecs> peer(
      config, *mlp::MlpStage::create(layer, 11), &registry);
  REQUIRE(peer.start().is_ok());
  auto client = InprocTransport::connect(peer.address(), {});
  REQUIRE(client.is_ok());

  const auto refused = std::pair{wire::MessageKind::error, StatusCode::permission_denied};
  CHECK(answer(*client, *protocol::encode_info_request(0)) == refused);
  CHECK(answer(*client, *protocol::encode_info_request(0, "a forged certificate")) == refused);
  CHECK(answer(*client, forward_request("")) == refused);
  CHECK(peer.stats().callers_refused == 3);

  CHECK(answer(*client, *protocol::encode_info_request(0, kAdmitted)).first == wire::MessageKind::result);
  CHECK(answer(*client, forward_request(kAdmitted)).first == wire::MessageKind::result);
  CHECK(peer.stats().callers_refused == 3);
  peer.stop();
}

}  // namespace
}  // namespace swarm
