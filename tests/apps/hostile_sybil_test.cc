// A member with ten identities against a swarm with an owner, over real processes
// and sockets (the swarm, the windows and the checks: hostile_rounds_fixture.h).
// Every peer, and the attacking member, holds one certificate from the owner
// (`swarm keygen`, `swarm admit`). The member mints ten more identities with the
// secret, as join_swarm does at every start, and has each announce in stage 0's
// progress key what a Sybil majority would need to take the stage over: a committed
// membership of the ten (so theirs prevails, ten namers against two), a state a few
// steps ahead with a forged hash (so the stage would download it from the member's
// server), and a ban of every honest peer (so trainers would route nothing to them).
// In a swarm of the secret alone every one of those records opens, and stage 0 fell
// from 1.89 to 0.45 global steps/s while they were announced (the skipped case
// below). Here none may: each is refused and counted, nobody asks the member's
// server for anything, and the stage's rate, its replicas' agreement and the final
// loss hold.
#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <doctest/doctest.h>

#include "swarm/averaging/state_transfer.h"
#include "swarm/peer/periodic_task.h"
#include "tests/apps/hostile_rounds_fixture.h"

namespace swarm {
namespace {

using namespace hostile_rounds;
using namespace std::chrono_literals;

constexpr int kIdentities = 10;
constexpr uint64_t kForgedHash = 0x5eedbadc0ffee;

// One registry node that announces as each minted identity: its seal is the one
// that identity's own process would make (join_swarm: no certificate).
struct Sybils {
  std::vector<security::SwarmCredentials> identities;
  std::vector<std::string> ids;  // sorted
  std::optional<DhtRegistry> node;

  Sybils(uint16_t bootstrap_port, int count) {
    std::map<std::string, RecordSealer> sealers;
    for (int i = 0; i < count; ++i) {
      auto credentials = security::join_swarm(kSecret);
      REQUIRE(credentials.is_ok());
      auto id = security::peer_id_bound_to(fmt::format("sybil{}", i), credentials->self);
      REQUIRE(id.is_ok());
      sealers[*id] = security::make_record_sealer(*credentials);
      identities.push_back(*credentials);
      ids.push_back(*id);
    }
    std::sort(ids.begin(), ids.end());
    auto shared = std::make_shared<std::map<std::string, RecordSealer>>(std::move(sealers));
    DhtRegistryOptions options;
    options.per_address_rate_limit = false;
    options.sealer.seal = [shared](const StoredRecord& r) -> Result<std::string> {
      auto it = shared->find(r.subkey);
      if (it == shared->end()) return invalid_argument("not a sybil: {}", r.subkey);
      return it->second.seal(r);
    };
    options.sealer.open = [shared](const StoredRecord& r) { return shared->begin()->second.open(r); };
    auto started = DhtRegistry::start(0, {fmt::format("127.0.0.1:{}", bootstrap_port)}, options);
    REQUIRE(started.is_ok());
    node.emplace(std::move(started).value());
    REQUIRE(node->wait_connected(10s).is_ok());
  }

  // The stage's step as its honest peers publish it (this node opens their records).
  int64_t stage_step(const std::set<std::string>& honest) {
    int64_t step = 0;
    auto records = node->get(progress_registry_key(0));
    if (!records.is_ok()) return step;
    for (const auto& record : *records) {
      auto r = ProgressRecord::from_json(record.value);
      if (r.is_ok() && honest.count(r->peer_id) != 0) step = std::max(step, r->step);
    }
    return step;
  }

  // Each identity's record: the ten as the committed membership, ahead of the stage
  // with the forged state, every honest peer banned.
  void announce(const std::string& address, const std::set<std::string>& honest) {
    const int64_t stage_step = this->stage_step(honest);
    for (const auto& id : ids) {
      ProgressRecord r;
      r.peer_id = id;
      r.address = address;
      r.stage = 0;
      r.step = stage_step + 3;
      r.params_hash = kForgedHash;
      r.samples = 16;
      r.samples_per_second = 1000;
      r.state = ProgressRecord::State::serving;
      r.committed_group = 0xb0b;
      r.committed_members = ids;
      r.stage_mates_seen = static_cast<int>(ids.size() + honest.size());
      r.recent_hashes = {{r.step, kForgedHash}};
      r.banned.assign(honest.begin(), honest.end());
      r.published_at = node->now();
      (void)node->announce(progress_registry_key(0), id, r.to_json(), node->now() + 5);
    }
  }

  // Whether none of their records is left in the key (they expire 5 s after the last announce).
  bool lapsed() {
    auto records = node->get(progress_registry_key(0));
    if (!records.is_ok()) return false;
    return std::none_of(records->begin(), records->end(),
                        [&](const Record& r) { return std::binary_search(ids.begin(), ids.end(), r.subkey); });
  }
};

int64_t registry_records_refused(const std::string& trainer_log) {
  const std::string marker = " registry records refused";
  const size_t at = trainer_log.rfind(marker);
  if (at == std::string::npos) return -1;
  const size_t start = trainer_log.rfind(' ', at - 1) + 1;
  return std::stoll(trainer_log.substr(start, at - start));
}

// What the attack did: the stage's windows, the requests the member's server got,
// and the records refused by a reader that holds a certificate (none without an owner).
struct SybilOutcome {
  Window before, during, after;
  int64_t served = 0;
  uint64_t refused = 0;
};

SybilOutcome attack_with_ten_identities(HostileRun& run) {
  Attacker& attacker = *run.attacker;
  MalloryServer mallory(attacker.credentials, /*answer_ok=*/false);
  Sybils sybils(run.port, kIdentities);
  std::set<std::string> sybil_ids(sybils.ids.begin(), sybils.ids.end());
  SybilOutcome out;
  run.wait_until_steady();
  out.before = run.measure("before");
  const uint64_t refused_at_start = attacker.registry.refused_seals();
  {
    PeriodicTask announcer;
    announcer.start(0.5, [&] { sybils.announce(mallory.server->address(), run.watched); });
    // Landed once a member's node has read every identity's record: refused where the
    // swarm has an owner, opened where it has none.
    const bool landed = run.wait([&] {
      if (attacker.registry.refused_seals() - refused_at_start >= kIdentities) return true;
      return attacker.progress_of(0, sybil_ids).size() == sybil_ids.size();
    }, 15s);
    REQUIRE_MESSAGE(landed, "no member's node read the minted identities' records");
    out.during = run.measure("during");
  }
  REQUIRE_MESSAGE(run.wait([&] { return sybils.lapsed(); }, 15s), "the minted identities' records never lapsed");
  out.after = run.measure("after");
  out.served = mallory.served.load();
  out.refused = attacker.registry.refused_seals() - refused_at_start;
  MESSAGE("a member's node refused " << out.refused << " records; the attacker's server was asked " << out.served
                                     << " times");
  return out;
}

TEST_CASE("in a swarm with an owner, a member's ten minted identities supply no state, ban nobody, and are refused; a minted caller gets no compute, info or state") {
  const RunEnd& clean = clean_run();
  HostileRun run("hostile-sybil", 2, 0, {}, /*owned=*/true);
  const SybilOutcome attack = attack_with_ten_identities(run);
  CHECK(attack.refused >= static_cast<uint64_t>(kIdentities));
  CHECK(attack.served == 0);  // no state downloaded from it, no round JOINed there
  // One more identity, minted by a secret holder, calls a stage-0 peer's compute as a
  // trainer would, asks for its info, and for its state as a joiner would: each
  // refused and counted, while the certified trainer and stage-mates are served.
  Attacker minted = Attacker::join(run.port, kSecret);
  const LivePeer& stage0 = run.peers.at(*run.watched.begin());
  const int64_t callers_before = refusals_of(*run.attacker, stage0)["callers"];
  auto refused = [](const Result<wire::Frames>& reply) {
    REQUIRE(reply.is_ok());
    auto decoded = wire::decode_message(reply->views(), wire::Limits{});
    REQUIRE(decoded.is_ok());
    CHECK(decoded->header.kind == wire::MessageKind::error);
    CHECK(decoded->header.error_code == static_cast<uint16_t>(StatusCode::permission_denied));
  };
  refused(minted.call(stage0.compute, hostile::must(protocol::encode_request(forward_of(8, 4242), 0, CodecId::blockwise8))));
  refused(minted.call(stage0.compute, hostile::must(protocol::encode_info_request(stage0.stage))));
  refused(minted.call(stage0.control, hostile::must(encode_state_request(0, {{"op", "info"}}))));
  CHECK(refusals_of(*run.attacker, stage0)["callers"] == callers_before + 3);
  const RunEnd end = run.finish_training();
  const int64_t trainer_refused = registry_records_refused(read_all(run.dir / "trainer.log"));
  MESSAGE("the trainer's registry refused " << trainer_refused << " records");
  CHECK(trainer_refused >= kIdentities);
  for (const auto& r : read_metrics(run.dir / "run")) {
    if (r["kind"] == "replica") CHECK(r["hash"] != fmt::format("{:016x}", kForgedHash));
  }
  check_rates(attack.before, attack.during, attack.after);
  run.check_rss();
  run.check_replicas_agree();
  check_loss(end, clean);
}

// The same attack in a swarm of the secret alone, where every identity a secret
// holder mints counts: what docs/TRUST.md says such a member can do.
// Skipped in the suite (a run of a minute); run with --no-skip.
TEST_CASE("in a swarm of the secret alone, a member's ten minted identities take its stage over" * doctest::skip()) {
  HostileRun run("hostile-sybil-open");
  const SybilOutcome attack = attack_with_ten_identities(run);
  const RunEnd end = run.finish_training();
  for (const Window* w : {&attack.before, &attack.during, &attack.after}) {
    MESSAGE(fmt::format("stage 0 {:>6}: {:.2f} global steps/s", w->name, w->rate()));
  }
  MESSAGE("validation loss " << end.validation_loss);
  CHECK(attack.refused == 0);
  // Their membership prevails (ten namers against two): the stage stalls while they announce.
  CHECK(attack.during.rate() < kHeldFraction * attack.before.rate());
}

}  // namespace
}  // namespace swarm
