// What the router learns of a peer from one answered call: its round trip less the
// time the call queued behind this trainer's earlier calls there and, bounded, the
// wait the peer reports. Before, the router saw whole round trips, and the waits of
// --forward-hold and --round-wait, as long on a fast peer as on a slow one, gave a
// 2x faster peer 0.52 of its stage's work instead of 2/3.
#include "swarm/trainer/serving_time.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "swarm/api/router.h"
#include "swarm/compression/codecs.h"
#include "swarm/protocol/records.h"
#include "swarm/protocol/stage_protocol.h"
#include "swarm/protocol/validating_handler.h"
#include "swarm/registry/in_process_registry.h"
#include "swarm/trainer/trainer.h"
#include "transports/inproc/inproc_transport.h"

namespace swarm {
namespace {

constexpr uint32_t kNever = std::numeric_limits<uint32_t>::max();

doctest::Approx near(double value) { return doctest::Approx(value).epsilon(1e-9).scale(0); }

TEST_CASE("with nothing ahead of it and no wait reported, a call measures the peer by its whole round trip") {
  const ServingTime t = serving_time({10.0, 10.5});
  CHECK(t.seconds == near(0.5));
  CHECK_FALSE(t.wait_refused);
}

TEST_CASE("the time a call queued behind this trainer's earlier calls to the peer is not the peer's") {
  CHECK(serving_time({10.0, 10.5, 10.25}).seconds == near(0.25));  // taken up when the one ahead was answered
  CHECK(serving_time({10.0, 10.5, 9.0}).seconds == near(0.5));     // answered before this call was sent
}

TEST_CASE("the wait a peer reports is taken out, at most 90% of the call; one longer than the round trip is refused") {
  CHECK(serving_time({10.0, 10.5, -1, 300'000}).seconds == near(0.2));
  // Claiming to have waited throughout (to draw work) buys at most 10x.
  CHECK(serving_time({10.0, 10.5, -1, 500'000}).seconds == near(0.05));
  // Longer than the trainer waited for the reply: impossible, so the round trip stands.
  const ServingTime impossible = serving_time({10.0, 10.5, -1, 500'001});
  CHECK(impossible.wait_refused);
  CHECK(impossible.seconds == near(0.5));
  CHECK(serving_time({10.0, 10.5, -1, kNever}).wait_refused);
  // Queued, then held: the bound is of the time left at the peer.
  CHECK(serving_time({10.0, 10.5, 10.4, 300'000}).seconds == near(0.01));
}

TEST_CASE("whatever a peer reports, a call measures it within [0, its round trip]") {
  for (const double previous : {-1.0, 10.0, 10.2, 10.5, 11.0}) {
    for (const uint32_t waited : {0u, 1u, 100'000u, 499'999u, 500'000u, 700'000u, kNever}) {
      CAPTURE(previous);
      CAPTURE(waited);
      const double seconds = serving_time({10.0, 10.5, previous, waited}).seconds;
      CHECK(seconds >= 0);
      CHECK(seconds <= 0.5);
    }
  }
}

// ---- through a trainer: the reported wait comes off the wire ----

// Sends every task to the first peer it knows, and keeps the seconds each success reported.
struct RecordingRouter {
  using router_concept = router_t;
  std::shared_ptr<std::vector<double>> reported = std::make_shared<std::vector<double>>();
  std::vector<PeerAnnouncement> peers;

  void set_peers(const std::vector<PeerAnnouncement>& known, double) { peers = known; }
  std::optional<PeerId> choose(TaskKind kind, int64_t size, double now) { return choose(kind, size, now, {}); }
  std::optional<PeerId> choose(TaskKind, int64_t, double, const std::vector<PeerId>& exclude) {
    for (const auto& peer : peers) {
      if (std::find(exclude.begin(), exclude.end(), peer.id) == exclude.end()) return peer.id;
    }
    return std::nullopt;
  }
  void report(const PeerId&, TaskKind, int64_t, Outcome outcome, double seconds, double) {
    if (outcome == Outcome::success) reported->push_back(seconds);
  }
  size_t usable_peers() const { return peers.size(); }
};
static_assert(Router<RecordingRouter>);

using RecordingTrainer = Trainer<RecordingRouter, InprocTransport, InProcessRegistry, compression::StandardCodecs>;

// The one stage of a one-stage swarm: answers every request with a loss and a wait it makes up.
struct LyingPeer {
  LyingPeer(InProcessRegistry* registry, uint32_t claimed_wait_us)
      : server(*InprocTransport::bind("inproc://lying-peer", ServerOptions{})) {
    REQUIRE(server
                .serve(validating_handler(wire::Limits{}, std::make_shared<wire::ValidationCounters>(),
                                          [claimed_wait_us](const PeerIdentity&, const wire::DecodedMessage& m) {
                                            protocol::StageReply reply{std::nullopt, 1.0f, claimed_wait_us};
                                            return *protocol::encode_reply(m.header.request_id, 0, reply);
                                          }))
                .is_ok());
    const PeerAnnouncementRecord record{"liar", server.address(), 0, 1.0, 0};
    REQUIRE(registry->announce(stage_registry_key(0), "liar", record.to_json(), registry->now() + 60).is_ok());
  }
  InprocServer server;
};

TEST_CASE("a trainer refuses, and counts, a reported wait longer than its round trip") {
  InProcessRegistry registry;
  LyingPeer liar(&registry, kNever);
  TrainerConfig config;
  config.num_stages = 1;
  RecordingRouter router;
  const auto reported = router.reported;
  RecordingTrainer trainer(config, {router}, &registry);
  const Tensor tokens = *Tensor::zeros(Shape{2, 4}, DType::i32);

  const auto started = std::chrono::steady_clock::now();
  const MicrobatchOutcome outcome = trainer.run_microbatch(tokens, tokens);
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  REQUIRE(outcome.completed);
  CHECK(trainer.refused_waits() == 1);
  REQUIRE(reported->size() == 1);
  CHECK(reported->front() > 0);  // the round trip, not a wait-shortened one
  CHECK(reported->front() <= elapsed);
}

}  // namespace
}  // namespace swarm
