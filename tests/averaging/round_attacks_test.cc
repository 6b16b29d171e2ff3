// StageRounds under a member's attacks on its round protocol:
//   - early parts (contributions to its leader's round that come before this peer's
//     BEGIN) from identities minted in the registry: any member of a swarm can
//     publish records under fresh ids, so what a peer holds must be bounded by its
//     configuration, not by how many stage-mates it sees;
//   - JOINs from identities with no record in the stage's view;
//   - a reduced part in a robust round, where no member reduces for another.
// Peers are stepped by hand on a fake clock; messages go through the real encode,
// decode and parse.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "swarm/averaging/round_protocol.h"
#include "swarm/wire/wire.h"

namespace swarm {
namespace {

constexpr int kMinted = 100;
constexpr double kTick = 0.01;

// A few parameters whose hash follows them, so replicas that step together agree.
class TinyReplica final : public RoundReplica {
 public:
  TinyReplica() { rehash(); }
  int64_t step() const override { return step_; }
  uint64_t params_hash() const override { return hash_; }
  std::vector<std::pair<int64_t, uint64_t>> recent_hashes() const override { return {}; }
  int64_t pending_samples() const override { return pending_; }
  Result<Taken> take_gradients() override {
    Taken t{std::vector<float>(params_.size(), 0.5f), std::exchange(pending_, 0)};
    return t;
  }
  Status apply_step(std::span<const float> averaged, int64_t steps) override {
    for (size_t i = 0; i < params_.size() && i < averaged.size(); ++i) params_[i] -= 0.1f * averaged[i];
    step_ += steps;
    rehash();
    return Status::ok();
  }
  void lose_round_samples() override {}
  void add_samples(int64_t n) { pending_ += n; }

 private:
  void rehash() {  // FNV-1a over the parameters' bytes
    hash_ = 0xcbf29ce484222325ull;
    for (float p : params_) {
      uint32_t bits = 0;
      std::memcpy(&bits, &p, sizeof bits);
      for (int b = 0; b < 4; ++b) hash_ = (hash_ ^ ((bits >> (8 * b)) & 0xff)) * 0x100000001b3ull;
    }
  }

  std::vector<float> params_ = std::vector<float>(4, 1.0f);
  int64_t step_ = 0;
  uint64_t hash_ = 0;
  int64_t pending_ = 0;
};

// A gradient of 2^16 values, and a bound of 2^20 that holds the whole share of
// every member a round of max_members can take (8 x (2^16 + overhead)): the
// bound the test holds the peer to, whatever the registry shows.
RoundsConfig config_for(const std::string& id) {
  RoundsConfig c;
  c.peer_id = id;
  c.address = "sim://" + id;
  c.global_batch_samples = 16;
  c.max_members = 8;
  c.max_early_values = int64_t{1} << 20;
  c.gradient_values = int64_t{1} << 16;
  return c;
}

ProgressRecord record_of(const std::string& id, const RoundReplica& at, double now) {
  ProgressRecord r;
  r.peer_id = id;
  r.address = "sim://" + id;
  r.step = at.step();
  r.params_hash = at.params_hash();
  r.published_at = now;
  return r;
}

std::string minted_id(int i) {
  std::string id = "x";
  id += std::to_string(100 + i);
  return id;
}

// Records that look like stage-mates at `at`'s state, ids above "p*" so none leads.
std::vector<ProgressRecord> minted_records(const RoundReplica& at, double now) {
  std::vector<ProgressRecord> out;
  for (int i = 0; i < kMinted; ++i) out.push_back(record_of(minted_id(i), at, now));
  return out;
}

// A contribution of a whole gradient to `leader`'s round at `step`.
RoundMessage whole_part(const std::string& sender, const std::string& leader, const RoundReplica& at) {
  RoundMessage m;
  m.op = RoundOp::part;
  m.step = at.step();
  m.sender = sender;
  m.leader = leader;
  m.group = make_group_id(at.step(), leader, 99);
  m.params_hash = at.params_hash();
  m.samples = 16;
  m.values.assign(static_cast<size_t>(config_for(sender).gradient_values), 0.25f);
  return m;
}

// Stage-mates in memory: each tick they read each other's records, tick, and
// hand each other what their outboxes hold, until the outboxes are empty.
class Stage {
 public:
  explicit Stage(const std::vector<std::string>& ids, const std::function<void(RoundsConfig&)>& adjust = {}) {
    for (const auto& id : ids) {
      RoundsConfig config = config_for(id);
      if (adjust) adjust(config);
      addresses_.push_back(config.address);
      replicas_.push_back(std::make_unique<TinyReplica>());
      rounds_.push_back(std::make_unique<StageRounds>(config, replicas_.back().get(), RoundCodec::raw(), 0));
    }
    held_.resize(ids.size());
    seen_.resize(ids.size());
  }
  // Sees every message delivered, after its receiver took it: an attacker's hand.
  std::function<void(const RoundMessage&, StageRounds& to, double now)> tap;
  // The network's hand: a message it holds back is delivered, in order, once it
  // stops holding that pair's messages; one it drops is lost.
  enum class Route { deliver, hold, drop };
  std::function<Route(const RoundMessage&, const std::string& to)> route;
  // The registry's hand: a peer whose view is frozen sees the records it saw last.
  std::function<bool(size_t peer)> view_frozen;

  TinyReplica& replica(size_t i) { return *replicas_[i]; }
  StageRounds& rounds(size_t i) { return *rounds_[i]; }
  double now() const { return now_; }

  void run_until(const std::function<bool()>& done, double seconds) {
    for (const double end = now_ + seconds; now_ < end && !done(); now_ += kTick) tick_once();
  }

 private:
  void tick_once() {
    std::vector<ProgressRecord> records;
    for (auto& r : rounds_) {
      records.push_back(r->progress(now_));
      r->published(now_);
    }
    for (size_t i = 0; i < rounds_.size(); ++i) {
      if (!view_frozen || !view_frozen(i) || seen_[i].empty()) seen_[i] = records;
      rounds_[i]->observe(seen_[i], now_);
    }
    for (auto& r : rounds_) r->tick(now_);
    while (deliver_once()) {
    }
  }

  bool deliver_once() {
    bool any = false;
    for (size_t i = 0; i < rounds_.size(); ++i) {
      std::vector<Outgoing> outbox = std::exchange(held_[i], {});
      for (auto& out : rounds_[i]->take_outbox()) outbox.push_back(std::move(out));
      for (auto& out : outbox) {
        Result<RoundMessage> m = parse(out);
        const Route r = route && m.is_ok() ? route(m.value(), out.to) : Route::deliver;
        // Held: so is every later message of the pair, as on one connection.
        const bool queued_behind = std::any_of(held_[i].begin(), held_[i].end(), [&](const Outgoing& h) { return h.to == out.to; });
        if (r == Route::hold || queued_behind) {
          held_[i].push_back(std::move(out));
          continue;
        }
        any = true;
        if (r == Route::drop) continue;
        StageRounds* to = find(out.address);
        Status status = to == nullptr ? unavailable("nobody at {}", out.address) : deliver(*to, std::move(m));
        if (!status.is_ok()) rounds_[i]->delivery_failed(out, status, now_);
      }
    }
    return any;
  }

  static Result<RoundMessage> parse(const Outgoing& out) {
    SWARM_ASSIGN_OR_RETURN(wire::DecodedMessage decoded, wire::decode_message(out.frames.views(), wire::Limits{}));
    return parse_round_message(decoded, RoundCodec::raw(), RoundMessageLimits{});
  }

  Status deliver(StageRounds& to, Result<RoundMessage> parsed) {
    SWARM_ASSIGN_OR_RETURN(RoundMessage m, std::move(parsed));
    Status status = to.receive(m, now_);
    if (tap) tap(m, to, now_);
    return status;
  }

  StageRounds* find(const std::string& address) {
    for (size_t i = 0; i < rounds_.size(); ++i) {
      if (addresses_[i] == address) return rounds_[i].get();
    }
    return nullptr;
  }

  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<TinyReplica>> replicas_;
  std::vector<std::unique_ptr<StageRounds>> rounds_;
  std::vector<std::vector<Outgoing>> held_;  // per sender, in order
  std::vector<std::vector<ProgressRecord>> seen_;  // per peer, what it observed last
  double now_ = 0;
};

// Every minted identity sends one whole gradient's part: none is evicted later
// (a part only ever evicts its own sender's), so what was taken is still held.
int flood(StageRounds& rounds, const std::string& leader, const RoundReplica& at, double now) {
  int taken = 0;
  for (int i = 0; i < kMinted; ++i) taken += rounds.receive(whole_part(minted_id(i), leader, at), now).is_ok();
  return taken;
}

// The bound is max(max_early_values, max_members whole shares), both set by
// configuration: max_early_values here. Counted from the records' stage-mates, it
// was 101 whole shares, and every one of the 100 parts was held (6,579,200
// values' worth against 1,048,576).
TEST_CASE("early parts from 100 minted stage-mates are held within a bound set by configuration") {
  const RoundsConfig config = config_for("p1");
  // A whole share (its values and a part's overhead) is under twice the gradient:
  // max_early_values holds max_members of them, the most a round ever takes.
  REQUIRE(2 * config.gradient_values * config.max_members <= config.max_early_values);

  SUBCASE("before any round committed: each sender a share, max_members shares at most") {
    TinyReplica replica;
    StageRounds rounds(config, &replica, RoundCodec::raw(), 0);
    double now = 0;
    for (; !rounds.serving() || rounds.leader() != "p0"; now += kTick) {
      REQUIRE(now < 3);
      std::vector<ProgressRecord> records = minted_records(replica, now);
      records.push_back(record_of("p0", replica, now));
      rounds.observe(records, now);
      rounds.tick(now);
    }
    const int taken = flood(rounds, "p0", replica, now);
    MESSAGE("first round: ", taken, " of ", kMinted, " minted parts taken; ", rounds.early_held(), " values held");
    CHECK(rounds.early_held() <= config.max_early_values);
    CHECK(rounds.counters().refused_full > 0);
  }

  SUBCASE("after a round committed: members a share each, every other sender one between them") {
    Stage stage({"p0", "p1", "p2"});
    for (size_t i = 0; i < 3; ++i) stage.replica(i).add_samples(16);
    stage.run_until([&] { return stage.rounds(1).membership().size() == 3 && !stage.rounds(1).in_round(); }, 5);
    REQUIRE(stage.rounds(1).membership() == std::set<std::string>{"p0", "p1", "p2"});
    REQUIRE(stage.replica(1).step() > 0);

    // p1 alone from here: its leader p0 has not begun the next round.
    StageRounds& rounds = stage.rounds(1);
    const TinyReplica& replica = stage.replica(1);
    double now = stage.now();
    std::vector<ProgressRecord> records = minted_records(replica, now);
    for (size_t i : {0, 2}) records.push_back(stage.rounds(i).progress(now));
    rounds.observe(records, now);
    rounds.tick(now);
    REQUIRE(rounds.leader() == "p0");

    const int taken = flood(rounds, "p0", replica, now);
    MESSAGE("committed: ", taken, " of ", kMinted, " minted parts taken; ", rounds.early_held(), " values held");
    CHECK(rounds.early_held() <= config.max_early_values);
    CHECK(rounds.counters().refused_full > 0);
    // The members' real parts still find room: the flood crowds out no member.
    CHECK(rounds.receive(whole_part("p2", "p0", replica), now).is_ok());
    CHECK(rounds.receive(whole_part("p0", "p0", replica), now).is_ok());
    CHECK(rounds.early_held() <= config.max_early_values);
  }
}

// A round takes members from the stage's view: in a swarm with an owner that view
// holds certified peers only (their records), so an identity minted with the
// secret, which has no record there, cannot JOIN its way into the round's average.
TEST_CASE("a JOIN from an identity with no record in the stage's view is refused and counted") {
  TinyReplica replica;
  StageRounds rounds(config_for("p0"), &replica, RoundCodec::raw(), 0);
  TinyReplica mate;
  double now = 0;
  auto observe = [&](bool with_minted) {
    std::vector<ProgressRecord> records = {record_of("p0", replica, now), record_of("p1", mate, now)};
    if (with_minted) records.push_back(record_of("x1", mate, now));
    rounds.observe(records, now);
    rounds.tick(now);
  };
  for (; !rounds.serving() || rounds.leader() != "p0"; now += kTick) {
    REQUIRE(now < 3);
    observe(false);
  }
  auto join_from = [&](const std::string& sender) {
    RoundMessage m;
    m.op = RoundOp::join;
    m.step = replica.step();
    m.sender = sender;
    m.address = "sim://" + sender;
    m.params_hash = replica.params_hash();
    m.samples = 8;
    return rounds.receive(m, now);
  };
  const int64_t refused_before = rounds.counters().joins_refused;
  const Status minted = join_from("x1");
  CHECK(minted.code() == StatusCode::permission_denied);
  CHECK(rounds.counters().joins_refused == refused_before + 1);
  CHECK(join_from("p1").is_ok());
  // Once its record is in the view, it is a stage-mate like any other.
  observe(true);
  CHECK(join_from("x1").is_ok());
}

// A member of a round of three that hands the others a "reduced" part: in a robust
// round nobody reduces for another, so the part is refused and its sender banned by
// every member it reached, at once (a wrong average it could not pass off anyway).
TEST_CASE("a reduced part in a round of three is refused, and its sender banned") {
  Stage stage({"p0", "p1", "p2"});
  int forged = 0, refused = 0;
  stage.tap = [&](const RoundMessage& m, StageRounds& to, double now) {
    if (m.sender != "p2" || m.op != RoundOp::part || m.phase != 0) return;
    RoundMessage reduced = m;  // its own contribution, passed off as the average
    reduced.phase = 1;
    for (float& v : reduced.values) v *= 100;
    ++forged;
    refused += !to.receive(reduced, now).is_ok();
  };
  for (size_t i = 0; i < 3; ++i) stage.replica(i).add_samples(16);
  stage.run_until([&] { return stage.rounds(0).bans().count("p2") && stage.rounds(1).bans().count("p2"); }, 5);
  MESSAGE(forged, " reduced parts forged, ", refused, " refused");
  CHECK(forged > 0);
  CHECK(refused == forged);
  for (size_t i : {0, 1}) {
    INFO("p" << i);
    REQUIRE(stage.rounds(i).bans().count("p2") == 1);
    CHECK(stage.rounds(i).bans().at("p2").find("reduced part") != std::string::npos);
    CHECK(stage.rounds(i).counters().banned == 1);
    CHECK(stage.rounds(i).counters().refused_bad_part >= 1);
  }
  // The honest two go on stepping together without it.
  const int64_t step = stage.replica(0).step();
  for (size_t i : {0, 1}) stage.replica(i).add_samples(16);
  stage.run_until([&] { return stage.replica(0).step() > step && stage.replica(1).step() > step; }, 10);
  CHECK(stage.replica(0).step() > step);
  CHECK(stage.replica(0).params_hash() == stage.replica(1).params_hash());
}

// The same, through the attack tests' hook: the peer sends its forged parts when
// its group starts, before some of its mates have the BEGIN.
TEST_CASE("a stage-mate whose hook forges reduced parts is banned by both honest members") {
  Stage stage({"p0", "p1", "p2"}, [](RoundsConfig& c) {
    if (c.peer_id == "p2") c.test_forge_reduced_part_from = 0;
  });
  int phase1 = 0, parts = 0;
  stage.tap = [&](const RoundMessage& m, StageRounds&, double) {
    if (m.sender == "p2" && m.op == RoundOp::part) ++(m.phase == 1 ? phase1 : parts);
  };
  for (size_t i = 0; i < 3; ++i) stage.replica(i).add_samples(16);
  stage.run_until([&] { return stage.rounds(0).bans().count("p2") && stage.rounds(1).bans().count("p2"); }, 5);
  MESSAGE("p2 sent ", parts, " contributions and ", phase1, " reduced parts");
  CHECK(phase1 >= 2);
  for (size_t i : {0, 1}) {
    INFO("p" << i << " counters: refused_no_begin " << stage.rounds(i).counters().refused_no_begin
              << ", refused_bad_part " << stage.rounds(i).counters().refused_bad_part);
    CHECK(stage.rounds(i).bans().count("p2") == 1);
  }
}

// Over a real network a mate may take its forgery only after it left the round
// (the leader aborted it, say, on banning the forger): the proof holds all the
// same, since the group was one of three. Before, refused as a finished group's
// part, it was no proof there, and the forger rounded on with that mate (CI's
// hostile_averaging_test: one honest peer of two banned it).
TEST_CASE("a forged reduced part that comes after its round ended still bans its sender") {
  Stage stage({"p0", "p1", "p2"}, [](RoundsConfig& c) {
    if (c.peer_id == "p2") c.test_forge_reduced_part_from = 0;
  });
  int forged_to_p1 = 0;
  auto p1_left_a_round = [&] {
    return stage.rounds(1).counters().rounds_committed + stage.rounds(1).counters().rounds_aborted > 0;
  };
  stage.route = [&](const RoundMessage& m, const std::string& to) {
    using Route = Stage::Route;
    if (to != "p1" || m.sender != "p2" || m.op != RoundOp::part || m.phase != 1) return Route::deliver;
    if (!p1_left_a_round()) return Route::hold;
    return ++forged_to_p1 == 1 ? Route::deliver : Route::drop;  // the one proof p1 gets
  };
  for (size_t i = 0; i < 3; ++i) stage.replica(i).add_samples(6);  // a global batch in all
  stage.run_until([&] { return stage.rounds(0).bans().count("p2") && stage.rounds(1).bans().count("p2"); }, 5);
  INFO("p1: refused_no_begin " << stage.rounds(1).counters().refused_no_begin << ", rounds committed "
                               << stage.rounds(1).counters().rounds_committed << ", aborted "
                               << stage.rounds(1).counters().rounds_aborted);
  CHECK(forged_to_p1 >= 1);
  CHECK(stage.rounds(0).bans().count("p2") == 1);
  REQUIRE(stage.rounds(1).bans().count("p2") == 1);
  CHECK(stage.rounds(1).bans().at("p2").find("reduced part") != std::string::npos);
}
}  // namespace
}  // namespace swarm
