// Butterfly all-reduce among members in one process, each with a real in-process
// server feeding its inbox: every member ends with the same vector, equal to the
// sample-weighted mean; a member that dies half-way is dropped and the rest finish
// within the round's deadline, still identical.
#include <atomic>
#include <cmath>
#include <future>
#include <thread>

#include <doctest/doctest.h>

#include "swarm/averaging/all_reduce.h"
#include "transports/inproc/inproc_transport.h"
#include "transports/validating_handler.h"

namespace swarm {
namespace {

TEST_CASE("split_evenly covers the range in parts that differ by at most one") {
  auto parts = split_evenly(10, 3);
  REQUIRE(parts.size() == 3);
  CHECK(parts[0] == ElementRange{0, 4});
  CHECK(parts[1] == ElementRange{4, 7});
  CHECK(parts[2] == ElementRange{7, 10});
  auto tiny = split_evenly(2, 3);
  CHECK(tiny[2].size() == 0);
  CHECK(tiny[0].size() + tiny[1].size() == 2);
}

TEST_CASE("split_bounded cuts a part into chunks of at most the bound") {
  auto chunks = split_bounded({5, 15}, 4);
  REQUIRE(chunks.size() == 3);
  CHECK(chunks[0] == ElementRange{5, 9});
  CHECK(chunks[2] == ElementRange{13, 15});
  CHECK(split_bounded({3, 3}, 4).size() == 1);
}

TEST_CASE("group_digest depends on the step and the member set, not on their order") {
  std::vector<AllReduceMember> ab{{"a", "x"}, {"b", "y"}};
  std::vector<AllReduceMember> ba{{"b", "y"}, {"a", "x"}};
  CHECK(group_digest(3, ab) == group_digest(3, ba));
  CHECK(group_digest(3, ab) != group_digest(4, ab));
  CHECK(group_digest(3, ab) != group_digest(3, {{"a", "x"}}));
}

TEST_CASE("weighted_mean weighs by samples, skips missing and zero-weight members") {
  std::vector<float> a{1, 2}, b{3, 6};
  auto mean = all_reduce_detail::weighted_mean({&a, &b, nullptr}, {1, 3, 5}, 2);
  CHECK(mean[0] == doctest::Approx(2.5));
  CHECK(mean[1] == doctest::Approx(5.0));
  auto none = all_reduce_detail::weighted_mean({&a}, {0}, 2);
  CHECK(none[0] == 0.0f);
}

struct Member {
  std::string id;
  AllReduceInbox inbox;
  std::optional<InprocServer> server;
  std::shared_ptr<wire::ValidationCounters> counters = std::make_shared<wire::ValidationCounters>();
  ClientCache<InprocTransport> clients;

  explicit Member(std::string name) : id(std::move(name)) {
    auto bound = InprocTransport::bind("inproc://allreduce-" + id, ServerOptions{});
    REQUIRE(bound.is_ok());
    server.emplace(std::move(bound).value());
    REQUIRE(server->serve(validating_handler(wire::Limits{}, counters,
                                             [this](const PeerIdentity&, const wire::DecodedMessage& m) {
                                               if (m.header.kind == wire::MessageKind::ping) {
                                                 wire::MessageHeader h;
                                                 h.kind = wire::MessageKind::result;
                                                 return *wire::encode_message(h, {});
                                               }
                                               Status s = inbox.deliver(m);
                                               if (!s.is_ok()) return wire::make_error_reply(0, 0, s);
                                               wire::MessageHeader h;
                                               h.kind = wire::MessageKind::result;
                                               return *wire::encode_message(h, {});
                                             }))
                .is_ok());
  }
  std::string address() const { return "inproc://allreduce-" + id; }
};

std::vector<float> gradient_of(int member, int64_t size) {
  std::vector<float> g(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) g[i] = std::sin(0.37f * static_cast<float>(i) + static_cast<float>(member));
  return g;
}

TEST_CASE("three members with different weights end bit-identical, at the weighted mean") {
  const int64_t size = 1001;  // not a multiple of 3, and several chunks per part
  std::vector<std::unique_ptr<Member>> members;
  for (const char* id : {"m0", "m1", "m2"}) members.push_back(std::make_unique<Member>(std::string(id) + "-ok"));
  std::vector<AllReduceMember> group;
  for (auto& m : members) group.push_back({m->id, m->address()});
  const std::vector<double> weights{8, 16, 24};
  AllReduceConfig config;
  config.max_chunk_elements = 100;
  config.part_timeout_seconds = 5;
  std::vector<std::future<Result<AllReduceResult>>> results;
  std::vector<std::vector<float>> gradients;
  for (int i = 0; i < 3; ++i) gradients.push_back(gradient_of(i, size));
  for (int i = 0; i < 3; ++i) {
    results.push_back(std::async(std::launch::async, [&, i] {
      AllReduceRound round{0, 7, members[i]->id, group, weights[i], 0x1234};
      return butterfly_all_reduce(members[i]->clients, members[i]->inbox, round, gradients[i], config);
    }));
  }
  std::vector<AllReduceResult> out;
  for (auto& r : results) {
    auto got = r.get();
    REQUIRE_MESSAGE(got.is_ok(), got.status().to_string());
    out.push_back(std::move(got).value());
  }
  for (int i = 0; i < 3; ++i) {
    CHECK(out[i].averaged == out[0].averaged);  // bit-identical
    CHECK(out[i].attempts == 1);
    CHECK(out[i].params_hashes.size() == 3);
  }
  // Per element, the sample-weighted mean; float accumulation order differs from this double reference.
  double worst = 0;
  for (int64_t k = 0; k < size; ++k) {
    double expect = 0;
    for (int i = 0; i < 3; ++i) expect += weights[i] * gradients[i][k];
    expect /= 48.0;
    worst = std::max(worst, std::abs(expect - out[0].averaged[k]));
  }
  CHECK(worst < 1e-6);
  for (auto& m : members) CHECK(m->inbox.size() == 0);  // everything delivered was consumed
}

TEST_CASE("a member that dies in the middle of the round is dropped; the others finish identical") {
  const int64_t size = 600;
  std::vector<std::unique_ptr<Member>> members;
  for (const char* id : {"k0", "k1", "k2"}) members.push_back(std::make_unique<Member>(id));
  std::vector<AllReduceMember> group;
  for (auto& m : members) group.push_back({m->id, m->address()});
  AllReduceConfig config;
  config.max_chunk_elements = 50;
  config.part_timeout_seconds = 0.5;
  config.ping_timeout_seconds = 0.2;
  config.round_timeout_seconds = 10;
  std::vector<std::vector<float>> gradients;
  for (int i = 0; i < 3; ++i) gradients.push_back(gradient_of(i, size));
  // k1 dies after sending 2 of its reduce-scatter chunks: it stops its server, as a crash would.
  AllReduceHooks die;
  die.after_send = [&](int64_t sent) -> Status {
    if (sent < 2) return Status::ok();
    members[1]->server->stop();
    return cancelled("killed by the test");
  };
  const auto started = Clock::now();
  std::vector<std::future<Result<AllReduceResult>>> results;
  for (int i = 0; i < 3; ++i) {
    results.push_back(std::async(std::launch::async, [&, i] {
      AllReduceRound round{0, 1, members[i]->id, group, 10, 0x99};
      return butterfly_all_reduce(members[i]->clients, members[i]->inbox, round, gradients[i], config,
                                  i == 1 ? die : AllReduceHooks{});
    }));
  }
  auto r0 = results[0].get();
  auto r1 = results[1].get();
  auto r2 = results[2].get();
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  CHECK_FALSE(r1.is_ok());
  REQUIRE_MESSAGE(r0.is_ok(), r0.status().to_string());
  REQUIRE_MESSAGE(r2.is_ok(), r2.status().to_string());
  CHECK(r0->averaged == r2->averaged);
  REQUIRE(r0->members.size() == 2);
  CHECK(r0->members[0].peer_id == "k0");
  CHECK(r0->members[1].peer_id == "k2");
  CHECK(r0->attempts >= 2);
  CHECK(seconds < config.round_timeout_seconds);
  // Without k1, the mean of k0 and k2 (equal weights).
  for (int64_t k = 0; k < size; ++k) {
    INFO("element " << k);
    CHECK(r0->averaged[k] == doctest::Approx(0.5 * (gradients[0][k] + gradients[2][k])).epsilon(1e-6));
  }
  MESSAGE("round without the dead member took " << seconds << " s, " << r0->attempts << " attempts");
}

TEST_CASE("of two members, the one left alone drops the round instead of stepping by itself") {
  std::vector<std::unique_ptr<Member>> members;
  for (const char* id : {"pair0", "pair1"}) members.push_back(std::make_unique<Member>(id));
  std::vector<AllReduceMember> group;
  for (auto& m : members) group.push_back({m->id, m->address()});
  members[1]->server->stop();  // gone before the round: its stage-mate cannot know if it stalled or died
  AllReduceConfig config;
  config.part_timeout_seconds = 0.2;
  config.ping_timeout_seconds = 0.1;
  std::vector<float> g{1, 2, 3, 4};
  AllReduceRound round{0, 5, "pair0", group, 4, 1};
  auto r = butterfly_all_reduce(members[0]->clients, members[0]->inbox, round, g, config);
  REQUIRE_FALSE(r.is_ok());
  CHECK(r.status().code() == StatusCode::unavailable);
  CHECK(r.status().message().find("not a majority") != std::string::npos);
}

TEST_CASE("a group of one returns its own mean at once") {
  Member solo("solo");
  std::vector<float> g{1, 2, 3};
  AllReduceRound round{0, 0, "solo", {{"solo", solo.address()}}, 4, 1};
  auto r = butterfly_all_reduce(solo.clients, solo.inbox, round, g, AllReduceConfig{});
  REQUIRE(r.is_ok());
  CHECK(r->averaged == g);
}

TEST_CASE("the inbox refuses malformed parts and parts of finished steps") {
  AllReduceInbox inbox;
  std::vector<float> values{1, 2};
  auto frames = all_reduce_detail::encode_part(0, 42, 3, 0, 0, 0, 1, "x", 2.0, 7, values);
  REQUIRE(frames.is_ok());
  auto decoded = wire::decode_message(frames->views(), wire::Limits{});
  REQUIRE(decoded.is_ok());
  CHECK(inbox.deliver(*decoded).is_ok());
  CHECK(inbox.size() == 1);
  inbox.finish_step(3);
  CHECK(inbox.size() == 0);
  CHECK(inbox.deliver(*decoded).code() == StatusCode::failed_precondition);
  auto negative = all_reduce_detail::encode_part(0, 42, 9, 0, 0, 0, 1, "x", -1.0, 7, values);
  auto bad = wire::decode_message(negative->views(), wire::Limits{});
  CHECK(inbox.deliver(*bad).code() == StatusCode::invalid_argument);
}

}  // namespace
}  // namespace swarm
