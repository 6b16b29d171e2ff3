// Butterfly all-reduce among members in one process, each with a real in-process
// server feeding its inbox: every member ends with the same vector, equal to the
// sample-weighted mean; a member that dies half-way is dropped and the rest finish
// within the round's deadline, still identical. With every codec the parts travel
// encoded and the members still end bit-identical, within two quantizations of the
// exact mean.
#include <atomic>
#include <cmath>
#include <cstring>
#include <future>
#include <limits>
#include <regex>
#include <thread>

#include <doctest/doctest.h>

#include "swarm/averaging/all_reduce.h"
#include "swarm/compression/codecs.h"
#include "transports/inproc/inproc_transport.h"
#include "transports/zmq/curve_keys.h"
#include "transports/zmq/zmq_transport.h"
#include "swarm/protocol/validating_handler.h"

namespace swarm {
namespace {

using compression::StandardCodecs;

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
  CodecId codec;  // of the rounds its inbox takes parts for

  explicit Member(std::string name, CodecId round_codec = CodecId::none) : id(std::move(name)), codec(round_codec) {
    auto bound = InprocTransport::bind("inproc://allreduce-" + id, ServerOptions{});
    REQUIRE(bound.is_ok());
    server.emplace(std::move(bound).value());
    REQUIRE(server->serve(validating_handler(wire::Limits{}, counters,
                                             [this](const PeerIdentity& from, const wire::DecodedMessage& m) {
                                               if (m.header.kind == wire::MessageKind::ping) {
                                                 wire::MessageHeader h;
                                                 h.kind = wire::MessageKind::result;
                                                 return *wire::encode_message(h, {});
                                               }
                                               Status s = inbox.deliver<StandardCodecs>(m, codec, from);
                                               if (!s.is_ok()) return wire::make_error_reply(0, 0, s);
                                               wire::MessageHeader h;
                                               h.kind = wire::MessageKind::result;
                                               return *wire::encode_message(h, {});
                                             }))
                .is_ok());
  }
  std::string address() const { return "inproc://allreduce-" + id; }
  // Its inbox takes parts for rounds of `step` (and the next).
  void at_step(int64_t step) { inbox.finish_step(step - 1); }
};

const PeerIdentity kPlaintext{};  // what a transport without CURVE authenticates

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
  for (auto& m : members) m->at_step(7);
  AllReduceConfig config;
  config.max_chunk_elements = 100;
  config.part_timeout_seconds = 5;
  std::vector<std::future<Result<AllReduceResult>>> results;
  std::vector<std::vector<float>> gradients;
  for (int i = 0; i < 3; ++i) gradients.push_back(gradient_of(i, size));
  for (int i = 0; i < 3; ++i) {
    results.push_back(std::async(std::launch::async, [&, i] {
      AllReduceRound round{0, 7, members[i]->id, group, weights[i], 0x1234};
      return butterfly_all_reduce<StandardCodecs>(members[i]->clients, members[i]->inbox, round, gradients[i],
                                                  config);
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
      return butterfly_all_reduce<StandardCodecs>(members[i]->clients, members[i]->inbox, round, gradients[i],
                                                  config, i == 1 ? die : AllReduceHooks{});
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
  members[0]->at_step(5);
  AllReduceConfig config;
  config.part_timeout_seconds = 0.2;
  config.ping_timeout_seconds = 0.1;
  std::vector<float> g{1, 2, 3, 4};
  AllReduceRound round{0, 5, "pair0", group, 4, 1};
  auto r = butterfly_all_reduce<StandardCodecs>(members[0]->clients, members[0]->inbox, round, g, config);
  REQUIRE_FALSE(r.is_ok());
  CHECK(r.status().code() == StatusCode::unavailable);
  CHECK(r.status().message().find("not a majority") != std::string::npos);
}

TEST_CASE("a group of one returns its own mean at once") {
  Member solo("solo");
  std::vector<float> g{1, 2, 3};
  AllReduceRound round{0, 0, "solo", {{"solo", solo.address()}}, 4, 1};
  auto r = butterfly_all_reduce<StandardCodecs>(solo.clients, solo.inbox, round, g, AllReduceConfig{});
  REQUIRE(r.is_ok());
  CHECK(r->averaged == g);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// ---- The inbox: only the current and the next step, no duplicates, bounded. ----

// One raw-f32 part, decoded as a server would hand it over; keeps its frames alive.
struct WirePart {
  wire::Frames frames;
  wire::DecodedMessage message;
};

WirePart make_part(uint64_t digest, int64_t step, int phase, int part, int chunk, int from, const std::string& sender,
                   double weight, std::vector<float> values) {
  WirePart out;
  auto frames = all_reduce_detail::encode_part(0, digest, step, phase, part, chunk, from, sender, weight, 7, values);
  REQUIRE(frames.is_ok());
  out.frames = std::move(frames).value();
  auto decoded = wire::decode_message(out.frames.views(), wire::Limits{});
  REQUIRE(decoded.is_ok());
  out.message = std::move(decoded).value();
  return out;
}

// The same part with its control JSON replaced by `text` (kept alive by the caller).
wire::DecodedMessage with_meta(const WirePart& part, const std::string& text) {
  wire::DecodedMessage m = part.message;
  m.tensors[0].payload = text;
  m.tensors[0].shape = Shape{static_cast<int64_t>(text.size())};
  return m;
}

TEST_CASE("the inbox keeps the current and the next step only: far-future and stale parts are refused, counted") {
  AllReduceInbox inbox;
  inbox.finish_step(4);  // this peer is in step 5
  CHECK(inbox.deliver(make_part(1, 5, 0, 0, 0, 1, "x", 2, {1, 2}).message, kPlaintext).is_ok());
  CHECK(inbox.deliver(make_part(2, 6, 0, 0, 0, 1, "x", 2, {1, 2}).message, kPlaintext).is_ok());  // a mate a step ahead
  Status far = inbox.deliver(make_part(3, 7, 0, 0, 0, 1, "x", 2, {1, 2}).message, kPlaintext);
  CHECK(far.code() == StatusCode::out_of_range);
  // A step that would wrap any sum with the finished step: refused the same way.
  CHECK(inbox.deliver(make_part(4, INT64_MAX, 0, 0, 0, 1, "x", 2, {1}).message, kPlaintext).code() ==
        StatusCode::out_of_range);
  CHECK(inbox.counters().far_future == 2);
  CHECK(inbox.size() == 2);
  CHECK(inbox.values_held() == 4);

  inbox.finish_step(5);  // now in step 6: step 5's parts go, step 7 is the next one
  CHECK(inbox.size() == 1);
  CHECK(inbox.values_held() == 2);
  CHECK(inbox.deliver(make_part(1, 5, 0, 0, 0, 1, "x", 2, {1, 2}).message, kPlaintext).code() ==
        StatusCode::failed_precondition);
  CHECK(inbox.counters().stale == 1);
  CHECK(inbox.deliver(make_part(3, 7, 0, 0, 0, 1, "x", 2, {1, 2}).message, kPlaintext).is_ok());
  CHECK(inbox.refused() == 3);
}

TEST_CASE("a duplicate part is refused, counted, and the first one kept") {
  AllReduceInbox inbox;
  CHECK(inbox.deliver(make_part(9, 0, 0, 0, 0, 1, "m1", 4, {1, 2, 3}).message, kPlaintext).is_ok());
  Status again = inbox.deliver(make_part(9, 0, 0, 0, 0, 1, "m1", 4, {7, 8, 9}).message, kPlaintext);
  CHECK(again.code() == StatusCode::already_exists);
  CHECK(inbox.counters().duplicate == 1);
  CHECK(inbox.size() == 1);
  auto kept = inbox.take({9, 0, 0, 0, 1}, "m1");
  REQUIRE(kept.has_value());
  CHECK(kept->values == std::vector<float>{1, 2, 3});
  // A refused duplicate still counts as delivered for a round's sender: a retry of
  // the same group re-sends the same bytes, and the first copy is there.
  CHECK(all_reduce_detail::delivered(Result<ReceivedMessage>(again)));
  CHECK_FALSE(all_reduce_detail::delivered(Result<ReceivedMessage>(invalid_argument("no"))));
}

TEST_CASE("a part under a member's key sent as someone else never takes the member's place") {
  AllReduceInbox inbox;
  CHECK(inbox.deliver(make_part(9, 0, 0, 0, 0, 1, "intruder", 4, {100, 100}).message, kPlaintext).is_ok());
  CHECK(inbox.deliver(make_part(9, 0, 0, 0, 0, 1, "m1", 4, {1, 2}).message, kPlaintext).is_ok());  // not a duplicate
  auto part = inbox.take({9, 0, 0, 0, 1}, "m1");
  REQUIRE(part.has_value());
  CHECK(part->values == std::vector<float>{1, 2});
  CHECK(inbox.counters().wrong_sender == 1);  // dropped with it
  CHECK(inbox.size() == 0);
  CHECK(inbox.values_held() == 0);
}

TEST_CASE("the inbox is bounded: past its limits parts are refused and counted, and room comes back") {
  InboxLimits limits;
  limits.max_parts = 3;
  limits.max_values = 10;
  limits.max_chunk_elements = 8;
  limits.max_members = 4;
  AllReduceInbox inbox(AllReduceInbox::Options{limits, nullptr, nullptr});
  // Parts of made-up groups for an allowed step: the way mail could pile up.
  for (uint64_t group = 1; group <= 2; ++group) {
    CHECK(inbox.deliver(make_part(group, 0, 0, 0, 0, 1, "x", 1, std::vector<float>(4, 1.0f)).message, kPlaintext)
              .is_ok());
  }
  Status too_many_values = inbox.deliver(make_part(3, 0, 0, 0, 0, 1, "x", 1, std::vector<float>(4, 1.0f)).message,
                                         kPlaintext);
  CHECK(too_many_values.code() == StatusCode::resource_exhausted);
  CHECK(inbox.deliver(make_part(4, 0, 0, 0, 0, 1, "x", 1, {1.0f}).message, kPlaintext).is_ok());
  CHECK(inbox.deliver(make_part(5, 0, 0, 0, 0, 1, "x", 1, {1.0f}).message, kPlaintext).code() ==
        StatusCode::resource_exhausted);  // too many parts
  CHECK(inbox.counters().full == 2);
  CHECK(inbox.size() == 3);
  CHECK(inbox.values_held() == 9);
  // A chunk larger than any round sends, and indices past the group size: malformed.
  CHECK(inbox.deliver(make_part(6, 0, 0, 0, 0, 1, "x", 1, std::vector<float>(9, 1.0f)).message, kPlaintext).code() ==
        StatusCode::invalid_argument);
  CHECK(inbox.deliver(make_part(6, 0, 0, 4, 0, 1, "x", 1, {1.0f}).message, kPlaintext).code() ==
        StatusCode::invalid_argument);
  CHECK(inbox.deliver(make_part(6, 0, 1, 2, 0, 1, "x", 1, {1.0f}).message, kPlaintext).code() ==
        StatusCode::invalid_argument);  // phase 1 comes from the part's owner
  CHECK(inbox.counters().malformed == 3);
  REQUIRE(inbox.take({1, 0, 0, 0, 1}, "x").has_value());
  CHECK(inbox.deliver(make_part(5, 0, 0, 0, 0, 1, "x", 1, {1.0f}).message, kPlaintext).is_ok());
}

TEST_CASE("inbox limits derived from the config hold an honest round and are far below the defaults") {
  AllReduceConfig config;
  config.max_chunk_elements = 100;
  config.max_members = 8;
  const InboxLimits limits = inbox_limits(1001, config, 16);
  CHECK(limits.max_values == 8 * (1001 + 100));
  CHECK(limits.max_parts == 8 * (1001 / 100 + 1 + 8));
  CHECK(limits.max_chunk_elements == 100);
  CHECK(limits.max_weight == 16);
  // No overflow for absurd sizes.
  const InboxLimits huge = inbox_limits(INT64_MAX, config, 16);
  CHECK(huge.max_values == INT64_MAX);
  CHECK(huge.max_parts <= INT32_MAX);
}

TEST_CASE("weights: negative, huge, above the global batch or not a number are refused at the door") {
  InboxLimits limits;
  limits.max_weight = 16;  // the global batch
  AllReduceInbox inbox(AllReduceInbox::Options{limits, nullptr, nullptr});
  for (double weight : {-1.0, 17.0, 1e300}) {
    CAPTURE(weight);
    CHECK(inbox.deliver(make_part(2, 0, 0, 0, 0, 1, "x", weight, {1}).message, kPlaintext).code() ==
          StatusCode::invalid_argument);
  }
  CHECK(inbox.counters().bad_weight == 3);
  const WirePart honest = make_part(2, 0, 0, 0, 0, 1, "x", 16, {1});
  const std::string meta(honest.message.tensors[0].payload);
  // JSON has no NaN or infinity: a sender's NaN is written as null, and 1e999 does
  // not parse. Both are refused as malformed before any weight is read.
  const std::string as_null = std::regex_replace(meta, std::regex("\"weight\":[0-9.e+]+"), "\"weight\":null");
  const std::string as_inf = std::regex_replace(meta, std::regex("\"weight\":[0-9.e+]+"), "\"weight\":1e999");
  REQUIRE(as_null != meta);
  CHECK(inbox.deliver(with_meta(honest, as_null), kPlaintext).code() == StatusCode::invalid_argument);
  CHECK(inbox.deliver(with_meta(honest, as_inf), kPlaintext).code() == StatusCode::invalid_argument);
  CHECK(inbox.counters().malformed == 2);
  CHECK(inbox.counters().bad_weight == 3);
  // Fields of the wrong JSON type are refused, never truncated.
  const std::string fractional = std::regex_replace(meta, std::regex("\"chunk\":0"), "\"chunk\":0.5");
  REQUIRE(fractional != meta);
  CHECK(inbox.deliver(with_meta(honest, fractional), kPlaintext).code() == StatusCode::invalid_argument);
  CHECK(inbox.size() == 0);
  CHECK(inbox.deliver(honest.message, kPlaintext).is_ok());  // the global batch itself is fine
}

// ---- Rounds with hostile mail: owners use only what the members themselves sent. ----

TEST_CASE("an owner leaves out a contribution weighing more than its sender published; all end bit-identical") {
  const int64_t size = 900;
  std::vector<std::unique_ptr<Member>> members;
  for (const char* id : {"w0", "w1", "w2"}) members.push_back(std::make_unique<Member>(id));
  // As StageSync builds it: each member capped by the samples it published on joining.
  std::vector<AllReduceMember> group;
  const std::vector<double> published{16, 16, 8};
  for (int i = 0; i < 3; ++i) group.push_back({members[i]->id, members[i]->address(), 0, published[i]});
  const std::vector<double> claimed{16, 16, 24};  // w2 claims three times what it published
  AllReduceConfig config;
  config.max_chunk_elements = 100;  // three chunks a part
  std::vector<std::vector<float>> gradients;
  for (int i = 0; i < 3; ++i) gradients.push_back(gradient_of(i, size));
  std::vector<std::future<Result<AllReduceResult>>> futures;
  for (int i = 0; i < 3; ++i) {
    futures.push_back(std::async(std::launch::async, [&, i] {
      AllReduceRound round{0, 0, members[i]->id, group, claimed[i], 0x5};
      return butterfly_all_reduce<StandardCodecs>(members[i]->clients, members[i]->inbox, round, gradients[i], config);
    }));
  }
  std::vector<AllReduceResult> out;
  for (auto& f : futures) {
    auto got = f.get();
    REQUIRE_MESSAGE(got.is_ok(), got.status().to_string());
    out.push_back(std::move(got).value());
  }
  CHECK(same_bits(out[1].averaged, out[0].averaged));
  CHECK(same_bits(out[2].averaged, out[0].averaged));
  // The parts w0 and w1 own are the mean of w0 and w1 alone; w2's own part is its
  // owner's to compute, as every part is.
  const auto parts = split_evenly(size, 3);
  for (int64_t k = parts[0].begin; k < parts[1].end; ++k) {
    INFO("element " << k);
    CHECK(out[0].averaged[k] == doctest::Approx(0.5 * (gradients[0][k] + gradients[1][k])).epsilon(1e-6));
  }
  CHECK(members[0]->inbox.counters().over_published == 3);  // one per chunk of w0's part
  CHECK(members[1]->inbox.counters().over_published == 3);
  CHECK(members[2]->inbox.counters().over_published == 0);
  for (auto& m : members) CHECK(m->inbox.refused() == 0);
}

TEST_CASE("a forged contribution under a member's key, sent as someone else, is left out and counted") {
  Member a("fk0"), b("fk1");
  std::vector<AllReduceMember> group{{a.id, a.address()}, {b.id, b.address()}};
  const std::vector<float> ga{1, 2, 3, 4}, gb{3, 6, 9, 12};
  // Part 0 (a's) as member 1 would send it, but signed by an intruder, there first.
  const uint64_t digest = group_digest(0, group);
  CHECK(a.inbox.deliver(make_part(digest, 0, 0, 0, 0, 1, "intruder", 16, {1000, 1000}).message, kPlaintext).is_ok());
  auto fa = std::async(std::launch::async, [&] {
    return butterfly_all_reduce<StandardCodecs>(a.clients, a.inbox, {0, 0, a.id, group, 1, 1}, ga, AllReduceConfig{});
  });
  auto fb = std::async(std::launch::async, [&] {
    return butterfly_all_reduce<StandardCodecs>(b.clients, b.inbox, {0, 0, b.id, group, 1, 1}, gb, AllReduceConfig{});
  });
  auto ra = fa.get();
  auto rb = fb.get();
  REQUIRE_MESSAGE(ra.is_ok(), ra.status().to_string());
  REQUIRE_MESSAGE(rb.is_ok(), rb.status().to_string());
  CHECK(ra->averaged == std::vector<float>{2, 4, 6, 8});
  CHECK(rb->averaged == ra->averaged);
  CHECK(a.inbox.counters().wrong_sender == 1);
  CHECK(a.inbox.size() == 0);
}

// A member over real ZeroMQ sockets with CURVE: its own client key pair, servers
// presenting one swarm pair, and an inbox that asks speaks_for who may send as whom.
struct CurveMember {
  std::string id;
  CurveKeyPair client_keys;
  AllReduceInbox inbox;
  std::optional<ZmqServer> server;
  std::shared_ptr<wire::ValidationCounters> counters = std::make_shared<wire::ValidationCounters>();
  ClientCache<ZmqTransport> clients;

  CurveMember(std::string name, CurveKeyPair keys, const CurveKeyPair& swarm_server, AllReduceInbox::Options options)
      : id(std::move(name)), client_keys(std::move(keys)), inbox(std::move(options)),
        clients(ClientOptions{.security = client_security(client_keys, swarm_server)}) {
    ServerOptions server_options;
    server_options.worker_threads = 2;
    server_options.security.curve = true;
    server_options.security.keys = swarm_server;
    auto bound = ZmqTransport::bind("tcp://127.0.0.1:*", server_options);
    REQUIRE_MESSAGE(bound.is_ok(), bound.status().to_string());
    server.emplace(std::move(bound).value());
    REQUIRE(server->serve(validating_handler(wire::Limits{}, counters,
                                             [this](const PeerIdentity& from, const wire::DecodedMessage& m) {
                                               wire::MessageHeader h;
                                               h.kind = wire::MessageKind::result;
                                               if (m.header.kind == wire::MessageKind::ping) return *wire::encode_message(h, {});
                                               Status s = inbox.deliver(m, from);
                                               if (!s.is_ok()) return wire::make_error_reply(0, 0, s);
                                               return *wire::encode_message(h, {});
                                             }))
                .is_ok());
  }
  static SecurityOptions client_security(const CurveKeyPair& keys, const CurveKeyPair& swarm_server) {
    SecurityOptions security;
    security.curve = true;
    security.keys = keys;
    security.server_public_key = swarm_server.public_key;
    return security;
  }
  std::string address() const { return std::string(server->address()); }
};

TEST_CASE("over ZeroMQ with CURVE: an impostor's part and a non-member's are refused and counted; the round is clean") {
  auto swarm_server = zmq_transport::generate_curve_keypair();
  REQUIRE(swarm_server.is_ok());
  // Who holds which client key: what the application's speaks_for knows.
  std::map<std::string, CurveKeyPair> keys;
  for (const char* id : {"c0", "c1", "mallory", "outsider"}) {
    auto pair = zmq_transport::generate_curve_keypair();
    REQUIRE(pair.is_ok());
    keys[id] = *pair;
  }
  AllReduceInbox::Options options;
  options.speaks_for = [&](const std::string& peer_id, const PeerIdentity& identity) {
    auto it = keys.find(peer_id);
    return it != keys.end() && identity.id == "curve:" + it->second.public_key;
  };
  options.is_member = [](const std::string& peer_id) { return peer_id == "c0" || peer_id == "c1"; };
  CurveMember c0("c0", keys["c0"], *swarm_server, options);
  CurveMember c1("c1", keys["c1"], *swarm_server, options);
  std::vector<AllReduceMember> group{{c0.id, c0.address()}, {c1.id, c1.address()}};
  const uint64_t digest = group_digest(0, group);

  // Sends a contribution to c0's part, as member 1, from a connection holding `as`'s key.
  auto send_as = [&](const std::string& holder, const std::string& sender) {
    ClientCache<ZmqTransport> cache(ClientOptions{.security = CurveMember::client_security(keys[holder], *swarm_server)});
    auto client = cache.get(c0.address());
    REQUIRE(client != nullptr);
    WirePart part = make_part(digest, 0, 0, 0, 0, 1, sender, 16, {500, 500});
    return decode_result_reply(client->call(std::move(part.frames), Clock::now() + std::chrono::seconds(10)).get());
  };
  auto impostor = send_as("mallory", "c1");  // mallory's key, c1's name
  CHECK(impostor.status().code() == StatusCode::permission_denied);
  CHECK(c0.inbox.counters().impostor == 1);
  auto outsider = send_as("outsider", "outsider");  // authenticated, but no member
  CHECK(outsider.status().code() == StatusCode::permission_denied);
  CHECK(c0.inbox.counters().not_member == 1);
  CHECK(c0.inbox.size() == 0);

  const std::vector<float> g0{1, 2, 3, 4}, g1{3, 4, 5, 6};
  auto f0 = std::async(std::launch::async, [&] {
    return butterfly_all_reduce<StandardCodecs>(c0.clients, c0.inbox, {0, 0, c0.id, group, 8, 1}, g0, AllReduceConfig{});
  });
  auto f1 = std::async(std::launch::async, [&] {
    return butterfly_all_reduce<StandardCodecs>(c1.clients, c1.inbox, {0, 0, c1.id, group, 8, 1}, g1, AllReduceConfig{});
  });
  auto r0 = f0.get();
  auto r1 = f1.get();
  REQUIRE_MESSAGE(r0.is_ok(), r0.status().to_string());
  REQUIRE_MESSAGE(r1.is_ok(), r1.status().to_string());
  CHECK(r0->averaged == std::vector<float>{2, 3, 4, 5});
  CHECK(r1->averaged == r0->averaged);
  CHECK(c0.inbox.refused() == 2);  // the two above, nothing of the members'
  CHECK(c1.inbox.refused() == 0);
}

// ---- Codecs: the parts travel encoded; the replicas stay bit-identical. ----

// Gradients whose 4096-value blocks differ in scale, so each 8-bit block has its own absmax.
std::vector<float> scaled_gradient_of(int member, int64_t size) {
  std::vector<float> g = gradient_of(member, size);
  for (int64_t i = 0; i < size; ++i) g[i] *= 0.25f * static_cast<float>(1 + (i / 3000 + member) % 5);
  return g;
}

// Checks `averaged` against the exact weighted mean of `gradients` (in double) and
// returns the largest error seen as a fraction of its bound. The bound, for two
// quantizations: with A the largest |x| of any contribution (no block's absmax
// exceeds it), each decoded contribution of element k is off by at most
// e1 = max_abs_error(A, max_i |x_ik|) (fp16/bf16 errors grow with |value|), so their
// weighted mean m' is off by at most e1; the double mean rounded to float adds at
// most half an ulp, under |m'|·2^-23 (the double sums' own error included);
// quantizing the result adds at most max_abs_error(A', |m'|), where
// A' = (A + e1(A))(1 + 2^-20) bounds every block absmax of the results.
double check_within_codec_error(CodecId codec, const std::vector<std::vector<float>>& gradients,
                                const std::vector<double>& weights, const std::vector<float>& averaged) {
  const size_t size = averaged.size();
  float a = 0;
  for (const auto& g : gradients) {
    REQUIRE(g.size() == size);
    for (float x : g) a = std::max(a, std::abs(x));
  }
  const double e1_max = StandardCodecs::max_abs_error(codec, a, a);
  const float a_out = static_cast<float>((a + e1_max) * (1 + 0x1p-20));
  double total_weight = 0;
  for (double w : weights) total_weight += w;
  double worst_fraction = 0;
  int64_t over = 0;
  int64_t first_over = -1;
  for (size_t k = 0; k < size; ++k) {
    double mean = 0;
    float largest = 0;
    for (size_t i = 0; i < gradients.size(); ++i) {
      mean += weights[i] * gradients[i][k];
      largest = std::max(largest, std::abs(gradients[i][k]));
    }
    mean /= total_weight;
    const double e1 = StandardCodecs::max_abs_error(codec, a, largest);
    const double m_prime = std::abs(mean) + e1;
    const double bound = e1 + StandardCodecs::max_abs_error(codec, a_out, static_cast<float>(m_prime)) +
                         m_prime * 0x1p-23 + 1e-30;
    const double error = std::abs(static_cast<double>(averaged[k]) - mean);
    worst_fraction = std::max(worst_fraction, error / bound);
    if (error > bound) {
      ++over;
      if (first_over < 0) first_over = static_cast<int64_t>(k);
    }
  }
  INFO("codec " << codec_name(codec) << ": first element over its bound: " << first_over);
  CHECK(over == 0);
  return worst_fraction;
}

struct CodecRoundOutcome {
  std::vector<std::vector<float>> gradients;
  std::vector<double> weights;
  std::vector<AllReduceResult> results;
};

// One round of n members, all in `codec`, over the in-process transport.
CodecRoundOutcome run_codec_round(CodecId codec, int n, int64_t size, const AllReduceConfig& base, const std::string& tag) {
  std::vector<std::unique_ptr<Member>> members;
  for (int i = 0; i < n; ++i) members.push_back(std::make_unique<Member>(tag + "-" + std::to_string(i), codec));
  for (auto& m : members) m->at_step(11);
  std::vector<AllReduceMember> group;
  for (auto& m : members) group.push_back({m->id, m->address()});
  AllReduceConfig config = base;
  config.codec = codec;
  CodecRoundOutcome outcome;
  for (int i = 0; i < n; ++i) {
    outcome.gradients.push_back(scaled_gradient_of(i, size));
    outcome.weights.push_back(8.0 * (i + 1));
  }
  std::vector<std::future<Result<AllReduceResult>>> futures;
  for (int i = 0; i < n; ++i) {
    futures.push_back(std::async(std::launch::async, [&, i] {
      AllReduceRound round{0, 11, members[i]->id, group, outcome.weights[i], 0x51};
      return butterfly_all_reduce<StandardCodecs>(members[i]->clients, members[i]->inbox, round,
                                                  outcome.gradients[i], config);
    }));
  }
  for (auto& f : futures) {
    auto got = f.get();
    REQUIRE_MESSAGE(got.is_ok(), got.status().to_string());
    outcome.results.push_back(std::move(got).value());
  }
  for (auto& m : members) {
    CHECK(m->inbox.size() == 0);
    CHECK(m->inbox.refused() == 0);
  }
  return outcome;
}

// What member `me` of n sends: its chunks of every other part, then its own part to every other member.
int64_t expected_values_sent(int64_t size, int n, int me) {
  const auto parts = split_evenly(size, n);
  int64_t values = 0;
  for (int j = 0; j < n; ++j) values += j == me ? (n - 1) * parts[j].size() : parts[j].size();
  return values;
}

double bytes_per_value(const AllReduceResult& r) {
  return static_cast<double>(r.payload_bytes_sent) / static_cast<double>(r.payload_values_sent);
}

void check_bytes_per_value(CodecId codec, const AllReduceResult& r) {
  REQUIRE(r.payload_values_sent > 0);
  switch (codec) {
    case CodecId::none: CHECK(r.payload_bytes_sent == 4 * r.payload_values_sent); break;
    case CodecId::fp16:
    case CodecId::bf16: CHECK(r.payload_bytes_sent == 2 * r.payload_values_sent); break;
    case CodecId::blockwise8:
      CHECK(r.payload_bytes_sent > r.payload_values_sent);  // the absmax of each block
      CHECK(bytes_per_value(r) <= 1.02);
      break;
    case CodecId::blockwise4:
      // 4.5 bits a value in whole blocks of 64; a chunk's short last block and
      // odd count add at most 4.5 bytes (<= 0.57 for chunks of 600 values or more).
      CHECK(bytes_per_value(r) >= 0.5625);
      CHECK(bytes_per_value(r) <= 0.57);
      break;
  }
}

TEST_CASE("with every codec, 2 and 3 members end bit-identical, within two quantizations of the weighted mean") {
  AllReduceConfig config;
  config.max_chunk_elements = 3000;  // several chunks per part; blocks that end short of 4096
  config.part_timeout_seconds = 5;
  const int64_t size = 10007;
  for (CodecId codec : kAllCodecIds) {
    for (int n : {2, 3}) {
      CAPTURE(codec_name(codec));
      CAPTURE(n);
      auto outcome = run_codec_round(codec, n, size, config,
                                     "codec-" + std::string(codec_name(codec)) + "-" + std::to_string(n));
      const auto& results = outcome.results;
      for (int i = 0; i < n; ++i) {
        CHECK(same_bits(results[i].averaged, results[0].averaged));
        CHECK(results[i].attempts == 1);
        CHECK(results[i].params_hashes.size() == static_cast<size_t>(n));
        CHECK(results[i].payload_values_sent == expected_values_sent(size, n, i));
        check_bytes_per_value(codec, results[i]);
      }
      const double worst = check_within_codec_error(codec, outcome.gradients, outcome.weights, results[0].averaged);
      if (codec != CodecId::none) {
        // Lossy indeed: the result is not the f32 mean.
        auto exact = run_codec_round(CodecId::none, n, size, config,
                                     "exact-" + std::string(codec_name(codec)) + "-" + std::to_string(n));
        CHECK_FALSE(same_bits(exact.results[0].averaged, results[0].averaged));
      }
      MESSAGE(codec_name(codec) << ", " << n << " members: worst error " << worst << " of its bound");
    }
  }
}

TEST_CASE("bytes per value on a real-size round: none 4, fp16 and bf16 2, 8bit at most 1.02, 4bit 0.5625 to 0.57") {
  AllReduceConfig config;  // default chunks (2^18 values)
  config.part_timeout_seconds = 10;
  config.round_timeout_seconds = 60;
  const int64_t size = 400000;
  for (CodecId codec : kAllCodecIds) {
    for (int n : {2, 3}) {
      CAPTURE(codec_name(codec));
      CAPTURE(n);
      auto outcome = run_codec_round(codec, n, size, config,
                                     "size-" + std::string(codec_name(codec)) + "-" + std::to_string(n));
      for (int i = 0; i < n; ++i) {
        const auto& r = outcome.results[i];
        CHECK(same_bits(r.averaged, outcome.results[0].averaged));
        CHECK(r.payload_values_sent == expected_values_sent(size, n, i));
        check_bytes_per_value(codec, r);
      }
      check_within_codec_error(codec, outcome.gradients, outcome.weights, outcome.results[0].averaged);
      MESSAGE(codec_name(codec) << ", " << n << " members x " << size << " floats: "
                                << outcome.results[0].payload_bytes_sent << " bytes for "
                                << outcome.results[0].payload_values_sent << " values = "
                                << bytes_per_value(outcome.results[0]) << " bytes/value");
    }
  }
}

TEST_CASE("the inbox decodes a part with its codec and refuses another codec, a wrong size, a forged NaN") {
  AllReduceInbox inbox;
  inbox.finish_step(2);  // the parts are of step 3
  const int64_t count = 5000;  // two 8-bit blocks
  std::vector<float> values = gradient_of(3, count);
  auto encoded = all_reduce_detail::encode_values<StandardCodecs>(CodecId::blockwise8, values);
  REQUIRE(encoded.is_ok());
  auto frames = all_reduce_detail::encode_part(0, 42, 3, 0, 0, 0, 1, "x", 2.0, 7, CodecId::blockwise8, count, *encoded);
  REQUIRE(frames.is_ok());
  CHECK(frames->parts[2].data() == encoded->data());  // the encoded payload is shared, not copied
  auto decoded = wire::decode_message(frames->views(), wire::Limits{});
  REQUIRE(decoded.is_ok());
  CHECK(decoded->tensors[1].codec == CodecId::blockwise8);

  // The round's codec: stored decoded, exactly as the sender's own round trip decodes it.
  REQUIRE(inbox.deliver<StandardCodecs>(*decoded, CodecId::blockwise8, kPlaintext).is_ok());
  auto part = inbox.take({42, 0, 0, 0, 1}, "x");
  REQUIRE(part.has_value());
  std::vector<float> expected(static_cast<size_t>(count));
  REQUIRE(all_reduce_detail::decode_frame<StandardCodecs>(CodecId::blockwise8, *encoded, expected).is_ok());
  CHECK(same_bits(part->values, expected));
  CHECK(part->weight == 2.0);
  CHECK(inbox.refused() == 0);

  // Another codec than the round's: refused, whichever way round.
  auto fp16 = all_reduce_detail::encode_values<StandardCodecs>(CodecId::fp16, values);
  auto fp16_frames = all_reduce_detail::encode_part(0, 42, 3, 0, 0, 0, 1, "x", 2.0, 7, CodecId::fp16, count, *fp16);
  auto fp16_decoded = wire::decode_message(fp16_frames->views(), wire::Limits{});
  REQUIRE(fp16_decoded.is_ok());
  Status mismatch = inbox.deliver<StandardCodecs>(*fp16_decoded, CodecId::blockwise8, kPlaintext);
  CHECK(mismatch.code() == StatusCode::invalid_argument);
  CHECK(mismatch.message().find("codec fp16") != std::string::npos);
  CHECK(inbox.refused() == 1);
  CHECK(inbox.deliver<StandardCodecs>(*decoded, CodecId::none, kPlaintext).code() == StatusCode::invalid_argument);
  CHECK(inbox.deliver(*decoded, kPlaintext).code() == StatusCode::invalid_argument);  // the table-less inbox: none only
  CHECK(inbox.refused() == 3);
  CHECK(inbox.size() == 0);

  // A forged NaN absmax: the wire decoder refuses it (and counts it) before any handler sees it...
  std::string forged = encoded->str();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(forged.data(), &nan, sizeof(float));
  wire::Frames forged_frames = *frames;
  forged_frames.parts[2] = wire::Frame(forged);
  wire::ValidationCounters counters;
  auto on_wire = wire::decode_message(forged_frames.views(), wire::Limits{}, counters);
  CHECK(on_wire.status().code() == StatusCode::invalid_argument);
  CHECK(counters.non_finite == 1);
  // ...and the inbox refuses it too when handed it directly.
  wire::DecodedMessage direct = *decoded;
  direct.tensors[1].payload = forged;
  CHECK(inbox.deliver<StandardCodecs>(direct, CodecId::blockwise8, kPlaintext).code() == StatusCode::invalid_argument);
  CHECK(inbox.refused() == 4);
  // An fp16 infinity, handed directly.
  std::string inf16 = fp16->str();
  inf16[0] = '\x00';
  inf16[1] = '\x7c';
  wire::DecodedMessage direct16 = *fp16_decoded;
  direct16.tensors[1].payload = inf16;
  CHECK(inbox.deliver<StandardCodecs>(direct16, CodecId::fp16, kPlaintext).code() == StatusCode::invalid_argument);
  CHECK(inbox.refused() == 5);
  // A size that is not the codec's for the element count.
  wire::DecodedMessage short_payload = *decoded;
  short_payload.tensors[1].payload = short_payload.tensors[1].payload.substr(0, forged.size() - 1);
  CHECK(inbox.deliver<StandardCodecs>(short_payload, CodecId::blockwise8, kPlaintext).code() == StatusCode::invalid_argument);
  wire::DecodedMessage more_values = *decoded;
  more_values.tensors[1].shape = Shape{count + 1};
  CHECK(inbox.deliver<StandardCodecs>(more_values, CodecId::blockwise8, kPlaintext).code() == StatusCode::invalid_argument);
  CHECK(inbox.refused() == 7);
  CHECK(inbox.size() == 0);  // nothing refused was stored
}

TEST_CASE("members in different codecs never average each other's parts: the round fails, the refusals counted") {
  Member a("mix-8bit", CodecId::blockwise8);
  Member b("mix-fp16", CodecId::fp16);
  a.at_step(2);
  b.at_step(2);
  std::vector<AllReduceMember> group{{a.id, a.address()}, {b.id, b.address()}};
  AllReduceConfig config;
  config.part_timeout_seconds = 0.3;
  config.ping_timeout_seconds = 0.2;
  config.round_timeout_seconds = 10;
  std::vector<float> ga = gradient_of(0, 500), gb = gradient_of(1, 500);
  auto fa = std::async(std::launch::async, [&] {
    AllReduceConfig c = config;
    c.codec = CodecId::blockwise8;
    return butterfly_all_reduce<StandardCodecs>(a.clients, a.inbox, {0, 2, a.id, group, 1, 1}, ga, c);
  });
  auto fb = std::async(std::launch::async, [&] {
    AllReduceConfig c = config;
    c.codec = CodecId::fp16;
    return butterfly_all_reduce<StandardCodecs>(b.clients, b.inbox, {0, 2, b.id, group, 1, 1}, gb, c);
  });
  auto ra = fa.get();
  auto rb = fb.get();
  CHECK_FALSE(ra.is_ok());
  CHECK_FALSE(rb.is_ok());
  CHECK(a.inbox.refused() > 0);
  CHECK(b.inbox.refused() > 0);
  CHECK(a.inbox.size() == 0);  // nothing of the other codec was kept
  CHECK(b.inbox.size() == 0);
  MESSAGE("mixed codecs: " << ra.status().to_string() << "; refused " << a.inbox.refused() << " and "
                           << b.inbox.refused() << " parts");
}

TEST_CASE("a codec the table lacks is refused before anything is sent") {
  Member solo("no-codec");
  AllReduceConfig config;
  config.codec = static_cast<CodecId>(9);
  std::vector<float> g{1, 2};
  auto r = butterfly_all_reduce<StandardCodecs>(solo.clients, solo.inbox, {0, 0, "no-codec", {{"no-codec", solo.address()}}, 1, 1},
                                                g, config);
  CHECK(r.status().code() == StatusCode::invalid_argument);
}

TEST_CASE("8bit: a member that dies in the middle of the round is dropped; the others finish bit-identical") {
  const int64_t size = 6000;
  std::vector<std::unique_ptr<Member>> members;
  for (const char* id : {"q0", "q1", "q2"}) members.push_back(std::make_unique<Member>(id, CodecId::blockwise8));
  std::vector<AllReduceMember> group;
  for (auto& m : members) group.push_back({m->id, m->address()});
  AllReduceConfig config;
  config.max_chunk_elements = 500;
  config.part_timeout_seconds = 0.5;
  config.ping_timeout_seconds = 0.2;
  config.round_timeout_seconds = 10;
  config.codec = CodecId::blockwise8;
  std::vector<std::vector<float>> gradients;
  for (int i = 0; i < 3; ++i) gradients.push_back(scaled_gradient_of(i, size));
  AllReduceHooks die;
  die.after_send = [&](int64_t sent) -> Status {
    if (sent < 2) return Status::ok();
    members[1]->server->stop();
    return cancelled("killed by the test");
  };
  std::vector<std::future<Result<AllReduceResult>>> results;
  for (int i = 0; i < 3; ++i) {
    results.push_back(std::async(std::launch::async, [&, i] {
      AllReduceRound round{0, 1, members[i]->id, group, 10, 0x99};
      return butterfly_all_reduce<StandardCodecs>(members[i]->clients, members[i]->inbox, round, gradients[i],
                                                  config, i == 1 ? die : AllReduceHooks{});
    }));
  }
  auto r0 = results[0].get();
  auto r1 = results[1].get();
  auto r2 = results[2].get();
  CHECK_FALSE(r1.is_ok());
  REQUIRE_MESSAGE(r0.is_ok(), r0.status().to_string());
  REQUIRE_MESSAGE(r2.is_ok(), r2.status().to_string());
  CHECK(same_bits(r0->averaged, r2->averaged));
  REQUIRE(r0->members.size() == 2);
  CHECK(r0->members[0].peer_id == "q0");
  CHECK(r0->members[1].peer_id == "q2");
  CHECK(r0->attempts >= 2);
  // Without q1: the equal-weight mean of q0 and q2, within two 8-bit quantizations.
  check_within_codec_error(CodecId::blockwise8, {gradients[0], gradients[2]}, {10, 10}, r0->averaged);
  // Counted over every attempt: more than the last attempt's own values.
  CHECK(r0->payload_values_sent > expected_values_sent(size, 2, 0));
  CHECK(bytes_per_value(*r0) < 1.02);
}

}  // namespace
}  // namespace swarm
