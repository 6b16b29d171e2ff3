// The global-batch tracker is pure: these drive it with records and a fake clock.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "swarm/averaging/progress.h"
#include "swarm/averaging/stage_view.h"

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

TEST_CASE("consensus_hash takes the majority, and breaks ties by the lowest peer id") {
  CHECK(consensus_hash({{"a", 1}, {"b", 2}, {"c", 2}}) == 2);
  CHECK(consensus_hash({{"b", 7}, {"a", 9}}) == 9);
  CHECK(consensus_hash({}) == 0);
}

TEST_CASE("progress records round-trip through JSON, 64-bit hashes intact, and bad ones are refused") {
  auto r = at("p", 12, 34, 5.5, 77.25);
  r.state = ProgressRecord::State::averaging;
  r.params_hash = 0xfedcba9876543210ull;
  r.committed_group = 0xffffffffffffffffull;
  r.committed_members = {"a", "b", "p"};
  r.stage_mates_seen = 2;
  r.recent_hashes = {{11, 0xffffffffffffffffull}, {12, 0xfedcba9876543210ull}};
  auto back = ProgressRecord::from_json(r.to_json());
  REQUIRE(back.is_ok());
  CHECK(back->peer_id == "p");
  CHECK(back->step == 12);
  CHECK(back->samples == 34);
  CHECK(back->state == ProgressRecord::State::averaging);
  CHECK(back->params_hash == r.params_hash);
  CHECK(back->committed_group == r.committed_group);
  CHECK(back->committed_members == r.committed_members);
  CHECK(back->stage_mates_seen == 2);
  CHECK(back->recent_hashes == r.recent_hashes);
  for (auto state : {ProgressRecord::State::serving, ProgressRecord::State::averaging,
                     ProgressRecord::State::resyncing, ProgressRecord::State::looking}) {
    r.state = state;
    auto again = ProgressRecord::from_json(r.to_json());
    REQUIRE(again.is_ok());
    CHECK(again->state == state);
  }
  // Absent, the state is serving, the group 0 and the membership empty.
  auto bare = ProgressRecord::from_json(R"({"peer":"x","step":1,"time":0})");
  REQUIRE(bare.is_ok());
  CHECK(bare->state == ProgressRecord::State::serving);
  CHECK(bare->committed_group == 0);
  CHECK(bare->committed_members.empty());
  CHECK_FALSE(ProgressRecord::from_json("{}").is_ok());
  CHECK_FALSE(ProgressRecord::from_json("not json").is_ok());
  CHECK_FALSE(ProgressRecord::from_json(R"({"peer":"x","step":-1,"time":0})").is_ok());
  CHECK_FALSE(ProgressRecord::from_json(R"({"peer":"x","step":1,"time":0,"hash":"zz"})").is_ok());
}

TEST_CASE("a progress record's state is one of four names, and its members are distinct ids in order") {
  CHECK(ProgressRecord::from_json(R"({"peer":"x","step":1,"time":0,"state":"resyncing"})")->state ==
        ProgressRecord::State::resyncing);
  CHECK(ProgressRecord::from_json(R"({"peer":"x","step":1,"time":0,"state":"looking"})")->state ==
        ProgressRecord::State::looking);
  CHECK(ProgressRecord::from_json(R"({"peer":"x","step":1,"time":0,"group":"ab","members":["a","b"]})")
            ->committed_group == 0xab);
  for (const char* bad : {
           R"({"peer":"x","step":1,"time":0,"state":"idle"})",
           R"({"peer":"x","step":1,"time":0,"state":"Serving"})",
           R"({"peer":"x","step":1,"time":0,"state":""})",
           R"({"peer":"x","step":1,"time":0,"state":1})",
           R"({"peer":"x","step":1,"time":0,"state":true})",
           R"({"peer":"x","step":1,"time":0,"group":"xyz"})",
           R"({"peer":"x","step":1,"time":0,"group":"12345678901234567"})",
           R"({"peer":"x","step":1,"time":0,"members":["b","a"]})",      // not in order
           R"({"peer":"x","step":1,"time":0,"members":["a","c","b"]})",
           R"({"peer":"x","step":1,"time":0,"members":["a","a"]})",      // twice
           R"({"peer":"x","step":1,"time":0,"members":["a","b","b"]})",
           R"({"peer":"x","step":1,"time":0,"members":[""]})",           // an empty id
           R"({"peer":"x","step":1,"time":0,"members":["","a"]})",
           R"({"peer":"x","step":1,"time":0,"members":[7]})",            // not text
           R"({"peer":"x","step":1,"time":0,"members":["a",null]})",
           R"({"peer":"x","step":1,"time":0,"members":[["a"]]})",
           R"({"peer":"x","step":1,"time":0,"members":"a"})",            // not an array
           R"({"peer":"x","step":1,"time":0,"members":{"a":1}})",
       }) {
    INFO(bad);
    CHECK(ProgressRecord::from_json(bad).status().code() == StatusCode::invalid_argument);
  }
  // At most kMaxMembers ids, each at most 256 bytes.
  auto members_doc = [](size_t n, size_t id_bytes) {
    std::vector<std::string> ids;
    for (size_t i = 0; i < n; ++i) {
      std::string id = std::to_string(1000 + i);  // four digits: in order as text too
      id.resize(std::max(id_bytes, id.size()), 'x');
      ids.push_back(id);
    }
    std::string doc = R"({"peer":"x","step":1,"time":0,"members":[)";
    for (size_t i = 0; i < ids.size(); ++i) doc += (i ? ",\"" : "\"") + ids[i] + "\"";
    return doc + "]}";
  };
  const auto full = ProgressRecord::from_json(members_doc(ProgressRecord::kMaxMembers, 256));
  REQUIRE(full.is_ok());
  CHECK(full->committed_members.size() == ProgressRecord::kMaxMembers);
  CHECK(full->committed_members.back().size() == 256);
  CHECK(ProgressRecord::from_json(members_doc(ProgressRecord::kMaxMembers + 1, 4)).status().code() ==
        StatusCode::invalid_argument);
  CHECK(ProgressRecord::from_json(members_doc(1, 257)).status().code() == StatusCode::invalid_argument);
}

TEST_CASE("a progress record's banned stage-mates round-trip, and are distinct ids in order like its members") {
  ProgressRecord r;
  r.peer_id = "a";
  r.banned = {"m1", "m2"};
  const auto back = ProgressRecord::from_json(r.to_json());
  REQUIRE(back.is_ok());
  CHECK(back->banned == r.banned);
  CHECK(ProgressRecord::from_json(R"({"peer":"x","step":1,"time":0})")->banned.empty());
  for (const char* bad : {
           R"({"peer":"x","step":1,"time":0,"banned":["b","a"]})",
           R"({"peer":"x","step":1,"time":0,"banned":["a","a"]})",
           R"({"peer":"x","step":1,"time":0,"banned":[""]})",
           R"({"peer":"x","step":1,"time":0,"banned":[3]})",
           R"({"peer":"x","step":1,"time":0,"banned":"a"})",
       }) {
    INFO(bad);
    CHECK(ProgressRecord::from_json(bad).status().code() == StatusCode::invalid_argument);
  }
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
           R"({"peer":"x","step":1,"time":0,"state":1})",
           R"({"peer":"x","step":1,"time":0,"group":12})",
           R"({"peer":"x","step":1,"time":0,"members":[1]})",
           R"({"peer":"x","step":1,"time":0,"departed":1})",
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

// ------------------------------------------------------------- stage_view ---
// One peer's view of its stage-mates and the one trust rule: a state ahead counts
// only when a strict majority (of the committed membership, or for a newcomer of
// the fresh records) vouches for it.

using State = ProgressRecord::State;

// A fresh record (published at 10) of `id` at (step, hash), committed to `members`.
ProgressRecord mate(std::string id, int64_t step, uint64_t hash, std::vector<std::string> members = {},
                    State state = State::serving, double published = 10) {
  ProgressRecord r = with_hashes(std::move(id), step, hash, published);
  r.state = state;
  r.committed_members = std::move(members);
  if (!r.committed_members.empty()) r.committed_group = 0x9;
  return r;
}

constexpr double kNow = 10;
constexpr double kStale = 5;

StageView view_of(const std::vector<ProgressRecord>& records, const std::string& me = "m") {
  return StageView::from(records, me, kNow, kStale);
}

std::vector<std::string> ids_of(const std::vector<ProgressRecord>& records) {
  std::vector<std::string> ids;
  for (const auto& r : records) ids.push_back(r.peer_id);
  return ids;
}

TEST_CASE("a stage view holds the newest fresh record of each other peer, by id; not its own, departed or stale ones") {
  auto departed = mate("d", 5, 1);
  departed.departed = true;
  std::vector<ProgressRecord> records{mate("c", 5, 1, {}, State::serving, 9), mate("m", 9, 9), mate("a", 4, 1),
                                      mate("c", 6, 2, {}, State::serving, 9.5), mate("stale", 5, 1, {}, State::serving, 4),
                                      departed, mate("b", 5, 1, {}, State::serving, 5)};
  const StageView view = view_of(records);
  CHECK(ids_of(view.mates) == std::vector<std::string>{"a", "b", "c"});
  REQUIRE(view.find("c") != nullptr);
  CHECK(view.find("c")->step == 6);  // its newer record
  CHECK(view.find("m") == nullptr);
  CHECK(view.find("d") == nullptr);
  CHECK(view.find("stale") == nullptr);
  CHECK(view.find("zz") == nullptr);
  // A peer's newest record decides: departed last, it is gone even if an older one is fresh.
  auto gone = mate("a", 4, 1, {}, State::serving, 10.5);
  gone.departed = true;
  records.push_back(gone);
  CHECK(view_of(records).find("a") == nullptr);
}

TEST_CASE("vouched_state: two of three committed members ahead with the same hash are followed") {
  const std::set<std::string> membership{"a", "b", "m"};
  const std::vector<std::string> committed{"a", "b", "m"};
  const StageView view = view_of({mate("a", 7, 0x77, committed), mate("b", 7, 0x77, committed)});
  const auto v = vouched_state(view, membership, "m", 5, 0x55);
  REQUIRE(v.has_value());
  CHECK(v->step == 7);
  CHECK(v->hash == 0x77);
  CHECK(ids_of(v->donors) == std::vector<std::string>{"a", "b"});
  CHECK(v->members == committed);
  CHECK(is_vouched(view, membership, "m", 7, 0x77));
  CHECK_FALSE(is_vouched(view, membership, "m", 7, 0x78));
  CHECK_FALSE(is_vouched(view, membership, "m", 5, 0x55));  // its own state: only its own vote
  // Already there: nothing to follow.
  CHECK_FALSE(vouched_state(view, membership, "m", 7, 0x77).has_value());
  // At the same step with another hash, the majority's state is followed.
  const auto other = vouched_state(view, membership, "m", 7, 0x70);
  REQUIRE(other.has_value());
  CHECK(other->hash == 0x77);
}

TEST_CASE("vouched_state: a lone forged record far ahead is vouched by nobody") {
  const int64_t far = int64_t{1} << 40;
  const std::set<std::string> membership{"a", "b", "m"};
  // From a non-member: not a voter at all.
  StageView view = view_of({mate("x", far, 0xff, {"x"}), mate("a", 5, 0x55), mate("b", 5, 0x55)});
  CHECK_FALSE(vouched_state(view, membership, "m", 5, 0x55).has_value());
  CHECK_FALSE(is_vouched(view, membership, "m", far, 0xff));
  // From a single member: one vote of three.
  view = view_of({mate("a", far, 0xff, {"a"}), mate("b", 5, 0x55)});
  CHECK_FALSE(vouched_state(view, membership, "m", 5, 0x55).has_value());
  CHECK_FALSE(is_vouched(view, membership, "m", far, 0xff));
  // Nor of two: one of two is no strict majority (this peer votes for its own state).
  CHECK_FALSE(vouched_state(view, {"a", "m"}, "m", 5, 0x55).has_value());
  // A newcomer sees it too, and follows the majority instead.
  view = view_of({mate("x", far, 0xff), mate("a", 6, 0x66), mate("b", 6, 0x66)});
  const auto v = vouched_state(view, {}, "m", 0, 0);
  REQUIRE(v.has_value());
  CHECK(v->step == 6);
  CHECK(v->hash == 0x66);
  CHECK_FALSE(is_vouched(view, {}, "m", far, 0xff));
}

TEST_CASE("vouched_state: a newcomer counts a strict majority of the fresh records, its own state not among them") {
  // The newcomer holds 0xaa like a; b and c hold 0xbb: 2 of the 3 fresh records.
  const StageView view = view_of({mate("a", 5, 0xaa), mate("b", 5, 0xbb), mate("c", 5, 0xbb)});
  const auto v = vouched_state(view, {}, "m", 5, 0xaa);
  REQUIRE(v.has_value());
  CHECK(v->step == 5);
  CHECK(v->hash == 0xbb);
  CHECK(ids_of(v->donors) == std::vector<std::string>{"b", "c"});
  // A member of those four counts itself among the electorate: 2 of 4 vouch for nothing.
  CHECK_FALSE(vouched_state(view, {"a", "b", "c", "m"}, "m", 5, 0xaa).has_value());
  // Half is not a majority, for a newcomer either.
  const StageView split = view_of({mate("a", 5, 0xaa), mate("b", 5, 0xbb)});
  CHECK_FALSE(vouched_state(split, {}, "m", 4, 0x44).has_value());
  CHECK_FALSE(is_vouched(split, {}, "m", 5, 0xbb));
  // An empty stage vouches for nothing.
  CHECK_FALSE(vouched_state(view_of({}), {}, "m", 0, 0).has_value());
  // Stale records are not counted: then b alone is the fresh stage.
  const StageView one = view_of({mate("a", 5, 0xaa, {}, State::serving, 1), mate("b", 5, 0xbb)});
  REQUIRE(vouched_state(one, {}, "m", 0, 0).has_value());
  CHECK(vouched_state(one, {}, "m", 0, 0)->hash == 0xbb);
}

TEST_CASE("vouched_state: the newest vouched state that somebody holds now, and only holders serving it donate") {
  const std::set<std::string> membership{"a", "b", "c", "m"};
  // a, b and c all published step 7's hash; c moved on alone to step 8.
  auto a = mate("a", 7, 0x77, {"a", "b", "c", "m"});
  auto b = mate("b", 7, 0x77, {"a", "b", "c", "m"}, State::resyncing);  // holds it, but serves nothing
  auto c = mate("c", 8, 0x88, {"c"});
  c.recent_hashes = {{7, 0x77}};
  auto v = vouched_state(view_of({a, b, c}), membership, "m", 5, 0x55);
  REQUIRE(v.has_value());
  CHECK(v->step == 7);
  CHECK(ids_of(v->donors) == std::vector<std::string>{"a"});
  CHECK(v->members == a.committed_members);
  // Vouched by recent hashes only, with nobody serving it now: the next older vouched state.
  const std::set<std::string> five{"a", "b", "c", "d", "m"};
  a = mate("a", 8, 0x89);
  a.recent_hashes = {{6, 0x66}, {7, 0x77}};
  b = mate("b", 7, 0x77, {}, State::resyncing);
  b.recent_hashes = {{6, 0x66}};
  c = mate("c", 8, 0x88);
  c.recent_hashes = {{6, 0x66}, {7, 0x77}};
  auto d = mate("d", 6, 0x66);
  CHECK(is_vouched(view_of({a, b, c, d}), five, "m", 7, 0x77));  // 3 of 5
  v = vouched_state(view_of({a, b, c, d}), five, "m", 5, 0x55);
  REQUIRE(v.has_value());
  CHECK(v->step == 6);
  CHECK(v->hash == 0x66);
  CHECK(ids_of(v->donors) == std::vector<std::string>{"d"});
  // A holder without an address cannot donate.
  d.address.clear();
  CHECK_FALSE(vouched_state(view_of({a, b, c, d}), five, "m", 5, 0x55).has_value());
}

TEST_CASE("dropped_from_membership: a member at a later step committed a membership without this peer") {
  const std::set<std::string> membership{"a", "b", "m"};
  CHECK(dropped_from_membership(view_of({mate("a", 6, 1, {"a", "b"})}), membership, "m", 5));
  CHECK_FALSE(dropped_from_membership(view_of({mate("a", 6, 1, {"a", "b", "m"})}), membership, "m", 5));
  CHECK_FALSE(dropped_from_membership(view_of({mate("a", 5, 1, {"a", "b"})}), membership, "m", 5));  // not later
  CHECK_FALSE(dropped_from_membership(view_of({mate("a", 6, 1)}), membership, "m", 5));  // committed nothing
  CHECK_FALSE(dropped_from_membership(view_of({mate("x", 9, 1, {"x"})}), membership, "m", 5));  // not a member
  CHECK_FALSE(dropped_from_membership(view_of({mate("a", 6, 1, {"a", "b"}, State::serving, 1)}), membership, "m",
                                      5));  // stale
  CHECK_FALSE(dropped_from_membership(view_of({mate("a", 6, 1, {"a", "b"})}), {}, "m", 5));  // no membership
}

TEST_CASE("outweighed_by_split: the larger side of a split stage wins, equals by step then hash, both agreeing") {
  // Two peers that each stepped alone: "a" at 8, "m" at 5. Each side is one peer.
  const ProgressRecord a8 = mate("a", 8, 0xa, {"a"});
  const ProgressRecord m5 = mate("m", 5, 0xb, {"m"});
  CHECK(outweighed_by_split(view_of({a8}, "m"), {"m"}, {"a", "m"}, "m", 5, 0xb));
  CHECK_FALSE(outweighed_by_split(view_of({m5}, "a"), {"a"}, {"a", "m"}, "a", 8, 0xa));
  // At one step the lower hash wins, on both sides.
  CHECK(outweighed_by_split(view_of({mate("a", 5, 0x1, {"a"})}, "m"), {"m"}, {"a"}, "m", 5, 0x2));
  CHECK_FALSE(outweighed_by_split(view_of({mate("m", 5, 0x2, {"m"})}, "a"), {"a"}, {"m"}, "a", 5, 0x1));
  // The larger side wins though it is behind: two members stepping together against one.
  const std::vector<ProgressRecord> pair{mate("a", 4, 0xa, {"a", "b"}), mate("b", 4, 0xa, {"a", "b"})};
  CHECK(outweighed_by_split(view_of(pair, "m"), {"m"}, {"a", "b"}, "m", 9, 0xc));
  CHECK_FALSE(outweighed_by_split(view_of({mate("m", 9, 0xc, {"m"}), mate("b", 4, 0xa, {"a", "b"})}, "a"), {"a", "b"},
                                  {"m"}, "a", 4, 0xa));
  // No split: a peer never committed with (a stranger, a forged record), one whose
  // membership names this peer, one at this very state, or one that serves nothing.
  CHECK_FALSE(outweighed_by_split(view_of({mate("x", 1000, 0xf, {"x"})}, "m"), {"m"}, {"a"}, "m", 5, 0xb));
  CHECK_FALSE(outweighed_by_split(view_of({mate("a", 8, 0xa, {"a", "m"})}, "m"), {"m"}, {"a"}, "m", 5, 0xb));
  CHECK_FALSE(outweighed_by_split(view_of({mate("a", 5, 0xb, {"a"})}, "m"), {"m"}, {"a"}, "m", 5, 0xb));
  CHECK_FALSE(outweighed_by_split(view_of({mate("a", 8, 0xa, {"a"}, State::looking)}, "m"), {"m"}, {"a"}, "m", 5, 0xb));
}

TEST_CASE("choose_leader: the lowest id among the serving mates at the step with the same hash") {
  const uint64_t h = 0x55;
  std::vector<ProgressRecord> records{mate("a", 5, h, {}, State::resyncing),  // downloading: left out
                                      mate("b", 5, 0x66),                      // another hash
                                      mate("c", 4, h),                         // another step
                                      mate("d", 5, h, {}, State::looking),     // starting up
                                      mate("e", 5, h),
                                      mate("f", 5, h, {}, State::averaging)};
  CHECK(choose_leader(view_of(records), "m", 5, h, {}) == "e");
  CHECK(choose_leader(view_of(records), "m", 5, 0x66, {}) == "b");
  CHECK(choose_leader(view_of(records), "m", 4, h, {}) == "c");
  CHECK(choose_leader(view_of(records), "m", 6, h, {}) == "m");  // nobody else there
  CHECK(choose_leader(view_of(records, "0"), "0", 5, h, {}) == "0");  // the lowest itself
  records[4].state = State::resyncing;
  CHECK(choose_leader(view_of(records), "m", 5, h, {}) == "f");  // averaging still takes part
  records[4].published_at = 1;
  records[4].state = State::serving;
  CHECK(choose_leader(view_of(records), "m", 5, h, {}) == "f");  // stale: left out
  // Peers that joined this one lately count too.
  CHECK(choose_leader(view_of(records), "m", 5, h, {"c2", "z"}) == "c2");
  CHECK(choose_leader(view_of(records), "m", 5, h, {"z"}) == "f");
}

TEST_CASE("present_members and is_majority: a round needs more than half of the members still present") {
  const std::set<std::string> membership{"a", "b", "c", "m"};
  const StageView view = view_of({mate("a", 5, 1), mate("b", 5, 1, {}, State::serving, 1), mate("x", 5, 1)});
  // m itself, a in the view, c heard from; b is stale and silent; x and z are not members.
  const auto present = present_members(view, membership, "m", {"c", "z"});
  CHECK(present == std::set<std::string>{"a", "c", "m"});
  CHECK(present_members(view, membership, "m", {}) == std::set<std::string>{"a", "m"});
  CHECK(present_members(view, {}, "m", {"c"}).empty());
  CHECK(is_majority({"a", "m"}, present));
  CHECK(is_majority({"a", "c", "m"}, present));
  CHECK_FALSE(is_majority({"m"}, present));
  CHECK_FALSE(is_majority({"m", "x", "y", "z"}, present));  // outsiders do not count
  CHECK_FALSE(is_majority({"a", "b"}, {"a", "b", "c", "m"}));  // half is not a majority
  CHECK(is_majority({"a", "b", "c"}, {"a", "b", "c", "m"}));
  CHECK_FALSE(is_majority({"a"}, {}));
  CHECK(is_majority({"a"}, {"a"}));
}

}  // namespace
}  // namespace swarm
