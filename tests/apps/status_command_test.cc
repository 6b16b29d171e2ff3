// `swarm status`'s pure part: registry records in, a SwarmStatus and its text and
// JSON out, with every record from a stranger checked and every refusal counted.
#include "apps/status_command.h"

#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <doctest/doctest.h>

#include "swarm/averaging/progress.h"
#include "swarm/protocol/records.h"

namespace swarm::apps {
namespace {

constexpr double kNow = 1'700'000'000.0;

Record announcement(const std::string& id, int stage, double throughput, int64_t queue = 0, bool serving = true,
                    double expires_in = 5) {
  PeerAnnouncementRecord a{id, "tcp://127.0.0.1:" + std::to_string(40000 + stage * 10 + int(id.back() - '0')), stage,
                           throughput, queue, serving, "cpu"};
  return Record{stage_registry_key(stage), id, a.to_json(), kNow + expires_in};
}

Record progress(const std::string& id, int stage, int64_t step, uint64_t hash, double age = 0.5,
                bool departed = false) {
  ProgressRecord p;
  p.peer_id = id;
  p.address = "tcp://127.0.0.1:50000";
  p.stage = stage;
  p.step = step;
  p.samples = 8;
  p.samples_per_second = 12.5;
  p.published_at = kNow - age;
  p.params_hash = hash;
  p.departed = departed;
  return Record{progress_registry_key(stage), id, p.to_json(), kNow + 5};
}

RegistryRead two_stage_swarm() {
  RegistryRead read;
  read.bootstrap = "127.0.0.1:4222";
  read.now = kNow;
  read.announcements = {{announcement("s0p0", 0, 20.5, 1), announcement("s0p1", 0, 19.5)},
                        {announcement("s1p0", 1, 30), announcement("s1p1", 1, 10, 2)}};
  read.progress = {{progress("s0p0", 0, 7, 0xabcdef0123456789), progress("s0p1", 0, 7, 0xabcdef0123456789)},
                   {progress("s1p0", 1, 6, 0x42)}};  // s1p1 has published no progress yet
  return read;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST_CASE("a 2-stage swarm: stages, peers with their steps and hashes, one peer without a progress record") {
  const SwarmStatus status = summarize(two_stage_swarm());
  REQUIRE(status.stages.size() == 2);
  REQUIRE(status.peers.size() == 4);
  CHECK(status.refused.empty());
  CHECK(status.stages[0].peers == 2);
  CHECK(status.stages[0].serving == 2);
  CHECK(status.stages[0].throughput == doctest::Approx(40));
  CHECK(status.stages[0].global_step == 7);
  CHECK(status.stages[0].hashes_agree == true);
  CHECK(status.stages[1].global_step == 6);
  CHECK_FALSE(status.stages[1].hashes_agree.has_value());  // one peer at step 6
  CHECK(status.peers[0].peer_id == "s0p0");
  CHECK(status.peers[0].queue_length == 1);
  CHECK(status.peers[0].expires_in_seconds == doctest::Approx(5));
  REQUIRE(status.peers[0].progress.has_value());
  CHECK(status.peers[0].progress->params_hash == 0xabcdef0123456789);
  CHECK(status.peers[0].progress->age_seconds == doctest::Approx(0.5).scale(0));
  CHECK(status.peers[3].peer_id == "s1p1");
  CHECK_FALSE(status.peers[3].progress.has_value());

  const std::string text = status_text(status);
  INFO(text);
  CHECK(contains(text, "swarm via 127.0.0.1:4222 (plaintext): 2 stages, 4 peers (4 serving)"));
  CHECK(contains(text, "stage 0: 2 peers (2 serving) | 40.0 samples/s | global step 7 | hashes agree"));
  CHECK(contains(text, "stage 1: 2 peers (2 serving) | 40.0 samples/s | global step 6\n"));
  CHECK(contains(text, "PEER  ADDRESS"));
  CHECK(contains(text, "s0p0  tcp://127.0.0.1:40000       20.5      1       7  abcdef0123456789  serving"));
  CHECK(contains(text, "s1p1  tcp://127.0.0.1:40011       10.0      2       -  -                 serving, no progress record"));
  CHECK(contains(text, "trainers: not announced in the registry"));
  CHECK(contains(text, "refused records: 0"));

  const auto j = nlohmann::json::parse(status_json_text(status));
  CHECK(j["bootstrap"] == "127.0.0.1:4222");
  CHECK(j["secured"] == false);
  CHECK(j["stages_read"] == 2);
  REQUIRE(j["stages"].size() == 2);
  CHECK(j["stages"][0]["global_step"] == 7);
  CHECK(j["stages"][0]["hashes_agree"] == true);
  CHECK(j["stages"][1]["hashes_agree"].is_null());
  REQUIRE(j["peers"].size() == 4);
  const auto& first = j["peers"][0];
  CHECK(first["peer"] == "s0p0");
  CHECK(first["stage"] == 0);
  CHECK(first["address"] == "tcp://127.0.0.1:40000");
  CHECK(first["throughput"] == 20.5);
  CHECK(first["queue"] == 1);
  CHECK(first["serving"] == true);
  CHECK(first["device"] == "cpu");
  CHECK(first["step"] == 7);
  CHECK(first["hash"] == "abcdef0123456789");
  CHECK(first["samples"] == 8);
  CHECK(first["samples_per_s"] == 12.5);
  CHECK(first["averaging"] == false);
  const auto& silent = j["peers"][3];
  CHECK(silent["peer"] == "s1p1");
  CHECK(silent["step"].is_null());
  CHECK(silent["hash"].is_null());
  CHECK(silent["progress_age"].is_null());
  CHECK(j["trainers"]["announced"] == false);
  CHECK(j["refused"]["count"] == 0);
  CHECK(j["unmatched_progress"] == 0);
}

TEST_CASE("refused records are counted and named, expired ones dropped, nothing from a record reaches the terminal") {
  RegistryRead read = two_stage_swarm();
  auto& stage0 = read.announcements[0];
  auto& progress0 = read.progress[0];
  const double live = kNow + 5;
  stage0.push_back({stage_registry_key(0), "junk", "{not json", live});
  stage0.push_back({stage_registry_key(0), "types", R"({"peer":"types","address":"a","stage":"0"})", live});
  stage0.push_back({stage_registry_key(0), "fast", R"({"peer":"fast","address":"a","stage":0,"throughput":1e300})", live});
  stage0.push_back(announcement("s1p9", 1, 5));  // a stage-1 announcement under stage 0's key
  stage0.back().key = stage_registry_key(0);
  stage0.push_back(announcement("s0p0", 0, 5));  // claims to be s0p0 under another subkey
  stage0.back().subkey = "impostor\x1b[2J\xff";
  stage0.push_back(announcement("s0p7", 0, 5, 0, true, -1));  // expired: neither shown nor refused
  progress0.push_back({progress_registry_key(0), "neg", R"({"peer":"neg","step":-3,"time":1})", live});
  progress0.push_back({progress_registry_key(0), "x", R"({"peer":"x","step":1,"time":1,"hash":")" +
                                                          std::string(100000, 'f') + "\"}",
                       live});
  progress0.push_back(progress("s0p1", 0, 9, 1, -3600));  // an hour in the future
  progress0.back().subkey = "s0p1";
  progress0.push_back(progress("s1p0", 1, 9, 1));  // stage 1's progress under stage 0's key
  progress0.back().key = progress_registry_key(0);
  const int64_t kRefused = 9;

  const SwarmStatus status = summarize(read);
  CHECK(status.refused.size() == kRefused);
  CHECK(status.peers.size() == 4);  // the honest four, nothing else
  CHECK(status.stages[0].global_step == 7);  // the future record did not count
  for (const auto& r : status.refused) CHECK(r.reason.size() <= 303);

  const std::string text = status_text(status);
  INFO(text);
  CHECK(contains(text, "refused records: 9"));
  CHECK(contains(text, "swarm/stage/0 'junk': malformed peer announcement"));
  CHECK(contains(text, "'types': malformed peer announcement: record: 'stage' must be an integer"));
  CHECK(contains(text, "announces stage 1 under stage 0's key"));
  CHECK(contains(text, "'impostor\\x1b[2J\\xff': its 'peer' is not the subkey"));
  CHECK(contains(text, "published 3600 s in the future"));
  CHECK_FALSE(contains(text, "s0p7"));
  CHECK_FALSE(contains(text, "\x1b"));
  for (unsigned char c : text) CHECK((c == '\n' || (c >= 0x20 && c < 0x7f)));

  const auto j = nlohmann::json::parse(status_json_text(status));  // invalid UTF-8 replaced, not thrown
  CHECK(j["refused"]["count"] == kRefused);
  CHECK(j["refused"]["records"].size() == kRefused);
  CHECK(j["peers"].size() == 4);
}

TEST_CASE("a forged progress record at step 2^40 is refused as unvouched: the stage shows the step its members vouch") {
  const int64_t far = int64_t{1} << 40;
  RegistryRead read = two_stage_swarm();
  auto members = [](Record record, std::vector<std::string> ids) {
    ProgressRecord p = *ProgressRecord::from_json(record.value);
    p.committed_members = std::move(ids);
    p.committed_group = 0x9;
    record.value = p.to_json();
    return record;
  };
  read.progress[0] = {members(progress("s0p0", 0, 40, 0x40), {"s0p0", "s0p1"}),
                      members(progress("s0p1", 0, 40, 0x40), {"s0p0", "s0p1"}),
                      members(progress("s0p9", 0, far, 0xbad), {"s0p0", "s0p1", "s0p9"})};
  read.announcements[0].push_back(announcement("s0p9", 0, 5));

  const SwarmStatus status = summarize(read);
  CHECK(status.stages[0].global_step == 40);
  CHECK(status.stages[0].hashes_agree == true);
  REQUIRE(status.refused.size() == 1);
  CHECK(status.refused[0].subkey == "s0p9");
  CHECK(status.refused[0].reason.rfind("unvouched", 0) == 0);
  REQUIRE(status.peers.size() == 5);
  CHECK_FALSE(status.peers[2].progress.has_value());  // s0p9: refused, so not shown

  const std::string text = status_text(status);
  INFO(text);
  CHECK(contains(text, "stage 0: 3 peers (3 serving) | 45.0 samples/s | global step 40 | hashes agree\n"));
  CHECK(text.find(std::to_string(far)) > text.find("refused records: 1"));  // named in its refusal only
  CHECK(contains(text, "refused records: 1\n  swarm/progress/0 's0p9': unvouched"));
  const auto j = nlohmann::json::parse(status_json_text(status));
  CHECK(j["stages"][0]["global_step"] == 40);
  CHECK(j["refused"]["count"] == 1);
  CHECK(j["peers"][2]["step"].is_null());
}

TEST_CASE("a peer that moved counts once, at its newest stage; its departed record is not unmatched") {
  RegistryRead read = two_stage_swarm();
  read.announcements[0].push_back(announcement("s1p1", 0, 10, 0, true, 2));  // older: expires sooner
  read.progress[0].push_back(progress("s1p1", 0, 3, 5, 1, /*departed=*/true));
  read.progress[1].push_back(progress("s1p1", 1, 6, 0x42));
  read.progress[1].push_back(progress("ghost", 1, 6, 0x42));  // no announcement
  const SwarmStatus status = summarize(read);
  REQUIRE(status.peers.size() == 4);
  CHECK(status.peers[3].peer_id == "s1p1");
  CHECK(status.peers[3].stage == 1);
  REQUIRE(status.peers[3].progress.has_value());
  CHECK(status.stages[1].hashes_agree == true);
  CHECK(status.unmatched_progress == 1);  // the ghost
  CHECK(contains(status_text(status), "progress records of peers not announced at their stage: 1"));
}

TEST_CASE("differing hashes, a syncing peer and an empty stage are shown") {
  RegistryRead read = two_stage_swarm();
  read.progress[0][1] = progress("s0p1", 0, 7, 0x1111);
  read.announcements[1][0] = announcement("s1p0", 1, 30, 0, /*serving=*/false);
  read.progress[1].push_back(progress("s1p1", 1, 2, 0x9));  // left behind at step 2
  read.announcements.emplace_back();  // stage 2: read, empty
  read.progress.emplace_back();
  const SwarmStatus status = summarize(read);
  REQUIRE(status.stages.size() == 3);
  CHECK(status.stages[0].hashes_agree == false);
  CHECK(status.stages[1].serving == 1);
  CHECK(status.stages[1].throughput == doctest::Approx(10));
  CHECK(status.stages[2].peers == 0);
  const std::string text = status_text(status);
  INFO(text);
  // Two replicas of two at step 7 with two hashes: neither is vouched (a strict majority).
  CHECK(contains(text, "global step none vouched (peers at 7) | HASHES DIFFER"));
  CHECK(contains(text, "syncing, progress 0.5 s old"));
  CHECK(contains(text, "stage 2: no peer\n"));
  // One of two at step 6 and one at 2 (and no hash for 2 from the first): neither vouched.
  CHECK(contains(text, "stage 1: 2 peers (1 serving) | 10.0 samples/s | global step none vouched (peers at 2 to 6)\n"));
  const auto j = nlohmann::json::parse(status_json_text(status));
  CHECK(j["stages"][0]["hashes_agree"] == false);
  CHECK(j["stages"][2]["peers"] == 0);
  CHECK(j["stages"][2]["global_step"].is_null());
  CHECK(j["stages"][0]["global_step"].is_null());
  CHECK(j["stages"][1]["lowest_step"] == 2);
  CHECK(j["stages"][1]["highest_step"] == 6);
  CHECK(j["stages"][0]["lowest_step"] == 7);
  CHECK(j["peers"][2]["serving"] == false);
}

TEST_CASE("records that cannot be opened say why, as swarm trainer does") {
  RegistryRead read;
  read.bootstrap = "127.0.0.1:4222";
  read.now = kNow;
  read.announcements = {{Record{stage_registry_key(0), "s0p0.ab", R"({"value":"{}","key":"00","signature":"00"})",
                                kNow + 5}}};
  SwarmStatus status = summarize(read);
  REQUIRE(status.refused.size() == 1);
  CHECK(status.refused[0].sealed);
  Status readable = check_readable(status);
  CHECK(readable.code() == StatusCode::permission_denied);
  CHECK(contains(readable.message(), "the swarm's records are sealed: pass its --secret"));

  RegistryRead secured;
  secured.secured = true;
  secured.refused_seals = 3;
  secured.announcements = {{}};
  status = summarize(secured);
  readable = check_readable(status);
  CHECK(readable.code() == StatusCode::permission_denied);
  CHECK(contains(readable.message(), "is --secret the swarm's?"));
  CHECK(contains(status_text(status), "refusals by this DHT node (each lookup counts again): 3 seals"));

  CHECK(check_readable(summarize(two_stage_swarm())).is_ok());
}

TEST_CASE("random bytes and mutated records never crash the summary or its renderers") {
  std::mt19937_64 random(17);
  const RegistryRead honest = two_stage_swarm();
  for (int round = 0; round < 2000; ++round) {
    RegistryRead read = honest;
    for (auto* records : {&read.announcements, &read.progress}) {
      for (auto& stage : *records) {
        for (auto& record : stage) {
          if (random() % 4 == 0) {
            record.value.assign(random() % 64, '\0');
            for (char& c : record.value) c = static_cast<char>(random());
          } else {
            for (int flips = int(random() % 4); flips > 0 && !record.value.empty(); --flips) {
              record.value[random() % record.value.size()] = static_cast<char>(random());
            }
          }
          if (random() % 8 == 0) record.subkey.push_back(static_cast<char>(random()));
        }
      }
    }
    const SwarmStatus status = summarize(read);
    CHECK(status.peers.size() + status.refused.size() <= 8);
    (void)status_text(status);
    CHECK(nlohmann::json::accept(status_json_text(status)));
    (void)check_readable(status);
  }
}

}  // namespace
}  // namespace swarm::apps
