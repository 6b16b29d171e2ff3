// State download between in-process donors: chunked, hash-verified, and resumed
// from another donor at the same offset when the first one dies.
#include <doctest/doctest.h>

#include "swarm/averaging/state_transfer.h"
#include "transports/inproc/inproc_transport.h"
#include "swarm/protocol/validating_handler.h"

namespace swarm {
namespace {

Checkpoint sample_state(int64_t step, float fill) {
  Checkpoint c;
  c.step = step;
  Tensor w = *Tensor::empty(Shape{300}, DType::f32);
  for (int i = 0; i < 300; ++i) w.data<float>()[i] = fill + static_cast<float>(i);
  c.tensors.push_back({"param/w", std::move(w)});
  return c;
}

struct Donor {
  std::string id;
  StateDonor donor;
  Checkpoint state;
  std::optional<InprocServer> server;
  std::shared_ptr<wire::ValidationCounters> counters = std::make_shared<wire::ValidationCounters>();

  Donor(std::string name, Checkpoint s) : id(std::move(name)), state(std::move(s)) {
    server.emplace(*InprocTransport::bind(address(), ServerOptions{}));
    REQUIRE(server
                ->serve(validating_handler(wire::Limits{}, counters,
                                           [this](const PeerIdentity&, const wire::DecodedMessage& m) {
                                             return donor.handle(m, 0, state.step, [this]() -> Result<Checkpoint> {
                                               return state;
                                             });
                                           }))
                .is_ok());
  }
  std::string address() const { return "inproc://state-" + id; }
  AllReduceMember member() const { return {id, address()}; }
};

TEST_CASE("a download in small chunks returns exactly the donor's state") {
  Donor d("one", sample_state(5, 1.0f));
  ClientCache<InprocTransport> clients;
  StateTransferConfig config{.chunk_bytes = 100};
  StateDownloadReport report;
  auto got = download_state(clients, 0, {d.member()}, config, &report);
  REQUIRE_MESSAGE(got.is_ok(), got.status().to_string());
  CHECK(got->step == 5);
  CHECK(content_hash(got->tensors) == content_hash(d.state.tensors));
  CHECK(report.donors_used == std::vector<std::string>{"one"});
  CHECK(report.bytes > 1200);
  CHECK(report.resumed_at == -1);
}

TEST_CASE("when the donor dies mid-download, the joiner finishes from another donor at the same offset") {
  Donor first("first", sample_state(9, 2.0f));
  Donor second("second", sample_state(9, 2.0f));  // a replica: the same state, byte for byte
  first.donor.after_chunk = [&](int64_t served) -> Status {
    if (served < 3) return Status::ok();
    return unavailable("donor died (test hook)");
  };
  ClientCache<InprocTransport> clients;
  StateTransferConfig config{.chunk_bytes = 128};
  StateDownloadReport report;
  auto got = download_state(clients, 0, {first.member(), second.member()}, config, &report);
  REQUIRE_MESSAGE(got.is_ok(), got.status().to_string());
  CHECK(content_hash(got->tensors) == content_hash(second.state.tensors));
  CHECK(report.donors_used == std::vector<std::string>{"first", "second"});
  CHECK(report.resumed_at == 2 * 128);  // two chunks kept; the third died with its donor
}

TEST_CASE("a second donor with other state makes the download start over, and still succeed") {
  Donor first("first-b", sample_state(9, 2.0f));
  Donor other("other-b", sample_state(10, 3.0f));
  first.donor.after_chunk = [&](int64_t served) -> Status { return unavailable("dies at once"); };
  ClientCache<InprocTransport> clients;
  StateDownloadReport report;
  auto got = download_state(clients, 0, {first.member(), other.member()}, StateTransferConfig{.chunk_bytes = 128},
                            &report);
  REQUIRE(got.is_ok());
  CHECK(got->step == 10);
  CHECK(report.resumed_at == -1);
}

TEST_CASE("no live donor is an unavailable error, not a hang") {
  ClientCache<InprocTransport> clients;
  auto got = download_state(clients, 0, {{"ghost", "inproc://state-nobody"}},
                            StateTransferConfig{.call_timeout_seconds = 0.2}, nullptr);
  CHECK_FALSE(got.is_ok());
}

TEST_CASE("a chunk request for a snapshot the donor no longer holds is refused") {
  Donor d("moving", sample_state(1, 0.0f));
  ClientCache<InprocTransport> clients;
  auto client = clients.get(d.address());
  auto frames = encode_state_request(0, {{"op", "chunk"}, {"hash", "0000000000000001"}, {"offset", 0}, {"length", 8}});
  auto reply = decode_result_reply(client->call(std::move(*frames), Clock::now() + std::chrono::seconds(2)).get());
  CHECK(reply.status().code() == StatusCode::failed_precondition);
}

}  // namespace
}  // namespace swarm
