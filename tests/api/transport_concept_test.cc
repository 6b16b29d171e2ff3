// Which types model the Transport concept, and which do not.
#include <doctest/doctest.h>

#include "swarm/api/transport.h"
#include "transports/inproc/inproc_transport.h"

namespace swarm {
namespace {

// Every member a transport needs, but no opt-in tag: not a transport.
struct LooksLikeATransport : InprocTransport {
  using transport_concept = void;
};

// Opted in, but with nothing behind the tag.
struct TaggedButEmpty {
  using transport_concept = transport_t;
  using server_type = int;
  using client_type = int;
  using address_type = std::string;
};

// A client whose call() answers synchronously is not a Call handle.
struct BlockingClient : InprocClient {
  wire::Frames call(wire::Frames request, Deadline deadline) { return request; }
};
struct BlockingTransport : InprocTransport {
  using client_type = BlockingClient;
  static Result<BlockingClient> connect(const std::string&, ClientOptions);
};

static_assert(Transport<InprocTransport>);
static_assert(CallHandle<Call>);
static_assert(!Transport<LooksLikeATransport>);
static_assert(!Transport<TaggedButEmpty>);
static_assert(!Transport<BlockingTransport>);
static_assert(!Transport<int>);
static_assert(!CallHandle<wire::Frames>);

template <Transport T>
Result<wire::Frames> ping(typename T::client_type& client, Deadline deadline) {
  return client.call(wire::Frames{{"ping"}}, deadline).get();
}

TEST_CASE("code written against the concept runs on the in-process transport") {
  auto server = InprocTransport::bind("inproc://concept-ping", {});
  REQUIRE(server.is_ok());
  REQUIRE(server->serve([](const PeerIdentity&, wire::Frames f) {
    f.parts.push_back("pong");
    return f;
  }).is_ok());
  auto client = InprocTransport::connect(server->address(), {});
  REQUIRE(client.is_ok());
  auto reply = ping<InprocTransport>(*client, Clock::now() + std::chrono::seconds(10));
  REQUIRE(reply.is_ok());
  REQUIRE(reply->parts.size() == 2);
  CHECK(reply->parts[0] == "ping");
  CHECK(reply->parts[1] == "pong");
}

}  // namespace
}  // namespace swarm
