// RoundGroup: one agreed group's all-reduce, its members wired to each other in
// memory through the real encode, decode and parse of every PART.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "swarm/averaging/round_group.h"
#include "swarm/averaging/round_messages.h"
#include "swarm/wire/wire.h"

namespace swarm {
namespace {

struct Contribution {
  std::string id;
  float value = 0;  // every element of its mean gradient
  int64_t samples = 0;
};

GroupSpec spec_for(const std::vector<Contribution>& contributions, const std::string& me, int64_t max_samples) {
  GroupSpec spec;
  spec.step = 7;
  spec.leader = contributions.front().id;
  spec.group = make_group_id(7, spec.leader, 1);
  spec.me = me;
  spec.max_chunk_elements = 3;  // several chunks per part
  spec.max_member_samples = max_samples;
  for (const auto& c : contributions) spec.members.push_back({c.id, "inproc://" + c.id});
  return spec;
}

Result<RoundMessage> through_the_wire(const Outgoing& out) {
  SWARM_ASSIGN_OR_RETURN(wire::DecodedMessage decoded, wire::decode_message(out.frames.views(), wire::Limits{}));
  return parse_round_message(decoded, RoundCodec::raw(), RoundMessageLimits{});
}

// Runs the group to completion; every member's averaged gradient.
std::map<std::string, std::vector<float>> run_group(const std::vector<Contribution>& contributions, int64_t max_samples,
                                                    size_t length = 10) {
  std::map<std::string, RoundGroup> groups;
  for (const auto& c : contributions) {
    groups.emplace(c.id, RoundGroup(spec_for(contributions, c.id, max_samples), RoundCodec::raw()));
  }
  std::vector<Outgoing> in_flight;
  for (const auto& c : contributions) {
    REQUIRE(groups.at(c.id).start(std::vector<float>(length, c.value), c.samples).is_ok());
    for (auto& out : groups.at(c.id).take_outgoing()) in_flight.push_back(std::move(out));
  }
  while (!in_flight.empty()) {
    Outgoing out = std::move(in_flight.back());
    in_flight.pop_back();
    auto message = through_the_wire(out);
    REQUIRE(message.is_ok());
    RoundGroup& to = groups.at(out.to);
    REQUIRE(to.receive(*message).is_ok());
    for (auto& next : to.take_outgoing()) in_flight.push_back(std::move(next));
  }
  std::map<std::string, std::vector<float>> averaged;
  for (auto& [id, group] : groups) {
    REQUIRE(group.complete());
    averaged[id] = group.averaged();
  }
  return averaged;
}

TEST_CASE("contributions are weighted by the samples each member took, whatever the leader heard") {
  // c took 24 samples, b none: the mean is (8*1 + 0*5 + 24*3) / 32 = 2.5 on every member.
  const auto averaged = run_group({{"a", 1.0f, 8}, {"b", 5.0f, 0}, {"c", 3.0f, 24}}, 128);
  for (const auto& [id, values] : averaged) {
    INFO(id);
    for (float v : values) CHECK(v == doctest::Approx(2.5).epsilon(1e-6));
  }
  CHECK(averaged.at("a") == averaged.at("b"));
  CHECK(averaged.at("a") == averaged.at("c"));
}

TEST_CASE("a member's samples count only up to the cap, so it cannot outweigh the others by claiming more") {
  // b claims 10^6 samples; capped at 16 it weighs as much as a.
  const auto averaged = run_group({{"a", 1.0f, 16}, {"b", 3.0f, 1000000}}, 16);
  for (float v : averaged.at("a")) CHECK(v == doctest::Approx(2.0).epsilon(1e-6).scale(0));
}

TEST_CASE("a group of one is its own mean, and one whose members hold no samples averages to zero") {
  CHECK(run_group({{"a", 4.0f, 8}}, 128).at("a") == std::vector<float>(10, 4.0f));
  const auto nothing = run_group({{"a", 4.0f, 0}, {"b", 2.0f, 0}}, 128);
  for (float v : nothing.at("b")) CHECK(v == 0.0f);
}

TEST_CASE("chunks of one contribution that claim different samples are refused") {
  const std::vector<Contribution> members{{"a", 1.0f, 8}, {"b", 2.0f, 8}};
  RoundGroup a(spec_for(members, "a", 128), RoundCodec::raw());
  RoundGroup b(spec_for(members, "b", 128), RoundCodec::raw());
  REQUIRE(a.start(std::vector<float>(10, 1.0f), 8).is_ok());
  REQUIRE(b.start(std::vector<float>(10, 2.0f), 8).is_ok());
  std::vector<RoundMessage> to_a;
  for (const auto& out : b.take_outgoing()) {
    if (out.to != "a") continue;
    auto m = through_the_wire(out);
    REQUIRE(m.is_ok());
    to_a.push_back(*m);
  }
  REQUIRE(to_a.size() >= 2);  // part 0 of 5 values in chunks of 3
  REQUIRE(a.receive(to_a[0]).is_ok());
  to_a[1].samples = 9;
  const Status refused = a.receive(to_a[1]);
  CHECK(refused.code() == StatusCode::invalid_argument);
  CHECK(!a.complete());
}

TEST_CASE("a group of three sends every member the whole gradient, and one member's x100 is clipped alike by all") {
  // c sends its gradient x100. A plain mean would be (1 + 1.2 + 110) / 3 = 37.4.
  std::vector<Contribution> members{{"a", 1.0f, 8}, {"b", 1.2f, 8}, {"c", 110.0f, 8}};
  std::map<std::string, RoundGroup> groups;
  for (const auto& m : members) groups.emplace(m.id, RoundGroup(spec_for(members, m.id, 128), RoundCodec::raw()));
  std::vector<Outgoing> in_flight;
  for (const auto& m : members) {
    RoundGroup& g = groups.at(m.id);
    REQUIRE(g.robust());
    REQUIRE(g.start(std::vector<float>(10, m.value), m.samples).is_ok());
    for (auto& out : g.take_outgoing()) in_flight.push_back(std::move(out));
  }
  // Each member sends the whole gradient (10 values in chunks of 3: 4 chunks) to each other member, and nothing more.
  CHECK(in_flight.size() == 3 * 2 * 4);
  for (auto& out : in_flight) {
    auto m = through_the_wire(out);
    REQUIRE(m.is_ok());
    CHECK(m->phase == 0);
    RoundGroup& to = groups.at(out.to);
    REQUIRE(to.receive(*m).is_ok());
    CHECK(to.take_outgoing().empty());
  }
  for (auto& [id, g] : groups) {
    INFO(id);
    REQUIRE(g.complete());
    CHECK(g.averaged() == groups.at("a").averaged());
    for (float v : g.averaged()) CHECK(std::abs(v - 1.1f) < 0.3f);
    // Each member judged the other two (and itself): c far outside its radius.
    std::map<std::string, ContributionJudgement> judged(g.judgements().begin(), g.judgements().end());
    REQUIRE(judged.size() == 3);
    CHECK(judged.at("c").spread > 8.0);
    CHECK(judged.at("a").spread <= 1.0);
  }
}

TEST_CASE("a group of three takes no reduced part: there is none to forge") {
  const std::vector<Contribution> members{{"a", 1.0f, 8}, {"b", 2.0f, 8}, {"c", 3.0f, 8}};
  RoundGroup a(spec_for(members, "a", 128), RoundCodec::raw());
  REQUIRE(a.start(std::vector<float>(10, 1.0f), 8).is_ok());
  RoundMessage forged;
  forged.op = RoundOp::part;
  forged.step = 7;
  forged.group = a.spec().group;
  forged.sender = "c";
  forged.from = 2;
  forged.phase = 1;
  forged.part = 2;
  forged.chunk = 0;
  forged.values.assign(3, 1e6f);
  const Status refused = a.receive(forged);
  CHECK(refused.code() == StatusCode::invalid_argument);
  CHECK(refused.message().find("reduces the whole gradient itself") != std::string::npos);
  CHECK(!a.complete());
}

}  // namespace
}  // namespace swarm
