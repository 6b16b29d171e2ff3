// The global-batch tracker is pure: these drive it with records and a fake clock.
#include <doctest/doctest.h>

#include "swarm/averaging/progress.h"

namespace swarm {
namespace {

ProgressRecord at(std::string id, int64_t step, int64_t samples, double rate, double published) {
  ProgressRecord r;
  r.peer_id = std::move(id);
  r.address = "inproc://" + r.peer_id;
  r.step = step;
  r.samples = samples;
  r.samples_per_second = rate;
  r.published_at = published;
  return r;
}

TEST_CASE("ready when the samples published at this step reach the target") {
  GlobalBatchConfig config{.target_samples = 64, .stale_after_seconds = 5, .use_estimated_arrival = false};
  std::vector<ProgressRecord> records{at("a", 3, 30, 10, 100), at("b", 3, 20, 10, 100)};
  auto d = decide_global_batch(config, 3, records, 100.5);
  CHECK_FALSE(d.ready);
  CHECK(d.reported_samples == 50);
  CHECK(d.peers_counted == 2);
  records[1].samples = 34;
  CHECK(decide_global_batch(config, 3, records, 100.5).ready);
}

TEST_CASE("the estimated arrival starts the round before the last records arrive") {
  GlobalBatchConfig config{.target_samples = 64};
  std::vector<ProgressRecord> records{at("a", 0, 24, 10, 10), at("b", 0, 24, 10, 10)};
  auto now = decide_global_batch(config, 0, records, 10.0);
  CHECK_FALSE(now.ready);
  CHECK(now.estimated_arrival == doctest::Approx(10.8));  // 16 more samples at 20/s
  CHECK_FALSE(decide_global_batch(config, 0, records, 10.7).ready);
  CHECK(decide_global_batch(config, 0, records, 10.9).ready);
  config.use_estimated_arrival = false;
  CHECK_FALSE(decide_global_batch(config, 0, records, 10.9).ready);
}

TEST_CASE("stale records and records of other steps are not counted") {
  GlobalBatchConfig config{.target_samples = 10, .stale_after_seconds = 5};
  std::vector<ProgressRecord> records{at("dead", 2, 100, 50, 0), at("old", 1, 100, 0, 19), at("me", 2, 4, 0, 19)};
  auto d = decide_global_batch(config, 2, records, 20);
  CHECK(d.reported_samples == 4);
  CHECK(d.peers_counted == 1);
  CHECK_FALSE(d.ready);
  CHECK_FALSE(d.behind);
}

TEST_CASE("a fresh stage-mate at a later step means this peer is behind, and not ready") {
  GlobalBatchConfig config{.target_samples = 10};
  std::vector<ProgressRecord> records{at("ahead", 5, 0, 0, 9), at("me", 4, 50, 0, 9)};
  auto d = decide_global_batch(config, 4, records, 10);
  CHECK(d.behind);
  CHECK(d.newest_step == 5);
  CHECK_FALSE(d.ready);
  records[0].published_at = 1;  // once stale, it no longer counts
  CHECK_FALSE(decide_global_batch(config, 4, records, 10).behind);
}

TEST_CASE("round members are the fresh peers at the step, by id; the group waits for all of them") {
  auto a = at("b", 1, 5, 0, 10);
  a.averaging = true;
  auto b = at("a", 1, 5, 0, 10);
  auto c = at("c", 0, 5, 0, 10);  // still finishing step 0's round: it will be at step 1 soon
  std::vector<ProgressRecord> records{a, b, c};
  CHECK(group_readiness(records, 1, 10, 5) == GroupReadiness::waiting);
  records[1].averaging = true;
  CHECK(group_readiness(records, 1, 10, 5) == GroupReadiness::waiting);  // c is not there yet
  records[2].published_at = 1;  // c went silent: not waited for
  CHECK(group_readiness(records, 1, 10, 5) == GroupReadiness::complete);
  records.push_back(at("d", 2, 0, 0, 10));
  CHECK(group_readiness(records, 1, 10, 5) == GroupReadiness::someone_ahead);
  records.pop_back();
  auto members = round_members(records, 1, 10, 5);
  REQUIRE(members.size() == 2);
  CHECK(members[0].peer_id == "a");
  CHECK(members[1].peer_id == "b");
  CHECK(round_members(records, 1, 100, 5).empty());  // all stale by then
  records[1].averaging = false;  // not joined yet, but at the step: still in the group
  CHECK(round_members(records, 1, 10, 5).size() == 2);
}

TEST_CASE("consensus_hash takes the majority, and breaks ties by the lowest peer id") {
  CHECK(consensus_hash({{"a", 1}, {"b", 2}, {"c", 2}}) == 2);
  CHECK(consensus_hash({{"b", 7}, {"a", 9}}) == 9);
  CHECK(consensus_hash({}) == 0);
}

TEST_CASE("progress records round-trip through JSON, 64-bit hashes intact, and bad ones are refused") {
  auto r = at("p", 12, 34, 5.5, 77.25);
  r.averaging = true;
  r.params_hash = 0xfedcba9876543210ull;
  r.recent_hashes = {{11, 0xffffffffffffffffull}, {12, 0xfedcba9876543210ull}};
  auto back = ProgressRecord::from_json(r.to_json());
  REQUIRE(back.is_ok());
  CHECK(back->peer_id == "p");
  CHECK(back->step == 12);
  CHECK(back->samples == 34);
  CHECK(back->averaging);
  CHECK(back->params_hash == r.params_hash);
  CHECK(back->recent_hashes == r.recent_hashes);
  CHECK_FALSE(ProgressRecord::from_json("{}").is_ok());
  CHECK_FALSE(ProgressRecord::from_json("not json").is_ok());
  CHECK_FALSE(ProgressRecord::from_json(R"({"peer":"x","step":-1,"time":0})").is_ok());
  CHECK_FALSE(ProgressRecord::from_json(R"({"peer":"x","step":1,"time":0,"hash":"zz"})").is_ok());
}

TEST_CASE("progress records refuse fields of the wrong type instead of truncating them") {
  const auto r = ProgressRecord::from_json(at("p", 3, 8, 1, 10).to_json());
  REQUIRE(r.is_ok());
  for (const char* bad : {
           R"({"peer":"x","step":1.5,"time":0})",                       // a fractional step
           R"({"peer":"x","step":18446744073709551615,"time":0})",      // 2^64-1, once read as -1
           R"({"peer":"x","step":1,"time":0,"samples":"8"})",
           R"({"peer":"x","step":1,"time":0,"samples":2.5})",
           R"({"peer":7,"step":1,"time":0})",
           R"({"peer":"x","step":1,"time":"now"})",
           R"({"peer":"x","step":1,"time":0,"averaging":1})",
           R"({"peer":"x","step":1,"time":0,"hash":12})",
           R"({"peer":"x","step":1,"time":0,"hashes":[[1]]})",
           R"({"peer":"x","step":1,"time":0,"hashes":[[1.5,"00"]]})",
           R"({"peer":"x","step":1,"time":0,"hashes":{"1":"00"}})",
       }) {
    INFO(bad);
    CHECK(ProgressRecord::from_json(bad).status().code() == StatusCode::invalid_argument);
  }
  std::string many = R"({"peer":"x","step":1,"time":0,"hashes":[)";
  for (size_t i = 0; i <= ProgressRecord::kMaxRecentHashes; ++i) many += (i ? "," : "") + std::string(R"([1,"ab"])");
  CHECK_FALSE(ProgressRecord::from_json(many + "]}").is_ok());
}

ProgressRecord with_hashes(std::string id, int64_t step, uint64_t hash, double published,
                           std::vector<std::pair<int64_t, uint64_t>> recent = {}) {
  ProgressRecord r = at(std::move(id), step, 0, 0, published);
  r.params_hash = hash;
  r.recent_hashes = std::move(recent);
  return r;
}

TEST_CASE("majority_hash: a strict majority of the fresh stage-mates must have published it for that step") {
  // a and b at step 5 agree; c is a step behind and cannot vouch for step 5.
  std::vector<ProgressRecord> mates{with_hashes("a", 5, 0xaa, 10, {{4, 0x44}, {5, 0xaa}}),
                                    with_hashes("b", 5, 0xaa, 10), with_hashes("c", 4, 0x44, 10)};
  CHECK(majority_hash(mates, 5, 10, 5) == std::optional<uint64_t>(0xaa));  // 2 of 3
  CHECK(majority_hash(mates, 4, 10, 5) == std::optional<uint64_t>(0x44));  // a's recent hash and c's current one
  CHECK_FALSE(majority_hash(mates, 6, 10, 5).has_value());
  // A lone donor ahead of stage-mates that do not know its step vouches for nothing.
  mates.push_back(with_hashes("forger", 9, 0xff, 10));
  CHECK_FALSE(majority_hash(mates, 9, 10, 5).has_value());
  // Two against two is no strict majority.
  mates.push_back(with_hashes("d", 5, 0xdd, 10));
  mates.push_back(with_hashes("e", 5, 0xdd, 10));
  CHECK_FALSE(majority_hash(mates, 5, 10, 5).has_value());
  // Stale records neither vote nor count; a peer's newest record is its only vote.
  std::vector<ProgressRecord> later{with_hashes("a", 5, 0xaa, 10), with_hashes("b", 5, 0xbb, 1),
                                    with_hashes("c", 5, 0xcc, 9), with_hashes("c", 5, 0xaa, 9.5)};
  CHECK(majority_hash(later, 5, 10, 5) == std::optional<uint64_t>(0xaa));
  CHECK(published_hash(later[0], 4) == std::nullopt);
}

TEST_CASE("donors are tried freshest first: the highest step, then the most recent record, then by id") {
  std::vector<ProgressRecord> donors{with_hashes("old", 7, 1, 5.0), with_hashes("ahead", 8, 1, 1.0),
                                     with_hashes("recent", 7, 1, 9.0), with_hashes("b-tie", 7, 1, 5.0),
                                     with_hashes("a-tie", 7, 1, 5.0)};
  std::vector<std::string> order;
  for (const auto& d : donors_freshest_first(donors)) order.push_back(d.peer_id);
  CHECK(order == std::vector<std::string>{"ahead", "recent", "a-tie", "b-tie", "old"});
}

TEST_CASE("a global batch below one sample is refused") {
  CHECK_FALSE(GlobalBatchConfig{.target_samples = 0}.validate().is_ok());
  CHECK(GlobalBatchConfig{.target_samples = 1}.validate().is_ok());
}

}  // namespace
}  // namespace swarm
