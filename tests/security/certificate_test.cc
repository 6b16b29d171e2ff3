// Certificates from a swarm's owner: what one admits, what it refuses (another key,
// another owner, an edited field, an expired one, malformed text), key files, and
// sealed records in a swarm with an owner, opened without a network.
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include <doctest/doctest.h>

#include "swarm/security/certificate.h"
#include "swarm/security/record_seal.h"

namespace swarm::security {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kNow = 1'800'000'000;
constexpr const char* kSecret = "certificate test secret";

SwarmIdentity fresh() {
  auto credentials = join_swarm(kSecret);
  REQUIRE(credentials.is_ok());
  return credentials->self;
}

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::path(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") / "certificate_test";
  fs::create_directories(dir);
  fs::remove(dir / name);
  return dir / name;
}

TEST_CASE("a certificate admits the key it names, from its owner, until it expires") {
  const SwarmIdentity owner = fresh(), member = fresh(), other = fresh();
  const Certificate c = admit(owner, member.signing_public, MemberRole::peer, kNow + 60);
  CHECK(check_certificate(c, owner.signing_public, member.signing_public, kNow).is_ok());
  CHECK(check_certificate(c, owner.signing_public, member.signing_public, kNow + 59).is_ok());
  CHECK(check_certificate(c, owner.signing_public, member.signing_public, kNow + 60).code() ==
        StatusCode::permission_denied);
  CHECK(check_certificate(c, owner.signing_public, other.signing_public, kNow).code() == StatusCode::permission_denied);
  CHECK(check_certificate(c, other.signing_public, member.signing_public, kNow).code() == StatusCode::permission_denied);
  // Signed by a member, not the owner: the member cannot admit others.
  const Certificate self_made = admit(member, other.signing_public, MemberRole::peer, kNow + 60);
  CHECK_FALSE(check_certificate(self_made, owner.signing_public, other.signing_public, kNow).is_ok());
}

TEST_CASE("a certificate's text round-trips, and an edited field breaks its signature") {
  const SwarmIdentity owner = fresh(), member = fresh();
  const Certificate c = admit(owner, member.signing_public, MemberRole::trainer, kNow + 3600);
  const std::string text = to_text(c);
  auto parsed = certificate_from_text(text);
  REQUIRE(parsed.is_ok());
  CHECK(parsed->role == MemberRole::trainer);
  CHECK(parsed->expires_at == kNow + 3600);
  CHECK(check_certificate(*parsed, owner.signing_public, member.signing_public, kNow).is_ok());

  std::string promoted = text;
  promoted.replace(promoted.find(" trainer "), 9, " peer ");
  auto as_peer = certificate_from_text(promoted);
  REQUIRE(as_peer.is_ok());
  CHECK(check_certificate(*as_peer, owner.signing_public, member.signing_public, kNow).code() ==
        StatusCode::permission_denied);
  std::string extended = text;
  extended.replace(extended.find(std::to_string(kNow + 3600)), 10, std::to_string(kNow + 9999));
  auto longer = certificate_from_text(extended);
  REQUIRE(longer.is_ok());
  CHECK_FALSE(check_certificate(*longer, owner.signing_public, member.signing_public, kNow).is_ok());
}

TEST_CASE("malformed certificate text is refused before anything is checked") {
  const SwarmIdentity owner = fresh(), member = fresh();
  const std::string good = to_text(admit(owner, member.signing_public, MemberRole::peer, kNow + 60));
  const std::string hex64(64, 'a');
  const std::string cases[] = {
      "",
      "swarm-certificate-v1",
      good + " extra",
      "swarm-certificate-v0" + good.substr(good.find(' ')),
      "swarm-certificate-v1 " + hex64.substr(2) + " peer 1 " + std::string(128, '0'),
      "swarm-certificate-v1 " + hex64 + " admin 1 " + std::string(128, '0'),
      "swarm-certificate-v1 " + hex64 + " peer -1 " + std::string(128, '0'),
      "swarm-certificate-v1 " + hex64 + " peer 99999999999999999999 " + std::string(128, '0'),
      "swarm-certificate-v1 " + hex64 + " peer 1 " + std::string(127, '0'),
      std::string(kMaxCertificateChars + 1, 'x'),
  };
  for (const auto& text : cases) {
    INFO(text);
    CHECK(certificate_from_text(text).status().code() == StatusCode::invalid_argument);
  }
}

// The key a ZeroMQ server authenticates for a client of this identity.
PeerIdentity caller(const SwarmIdentity& identity) { return PeerIdentity{"curve:" + identity.curve.public_key}; }

TEST_CASE("a peer serves a caller whose request carries a certificate for the key that called, and no other") {
  const SwarmIdentity owner = fresh(), trainer = fresh(), peer = fresh(), stranger = fresh();
  const std::string as_trainer = to_text(admit(owner, trainer.signing_public, MemberRole::trainer, kNow + 60));
  const std::string as_peer = to_text(admit(owner, peer.signing_public, MemberRole::peer, kNow + 60));
  CHECK(check_caller(owner.signing_public, caller(trainer), as_trainer, kNow).is_ok());
  CHECK(check_caller(owner.signing_public, caller(peer), as_peer, kNow).is_ok());
  auto refused = [&](const PeerIdentity& from, const std::string& credential, int64_t now = kNow) {
    return check_caller(owner.signing_public, from, credential, now).code() == StatusCode::permission_denied;
  };
  CHECK(refused(caller(stranger), ""));                  // none: a secret holder it never admitted
  CHECK(refused(caller(stranger), as_trainer));          // another member's certificate, replayed
  CHECK(refused(caller(trainer), as_trainer, kNow + 60));  // expired
  CHECK(refused(caller(trainer), "not a certificate"));
  CHECK(refused(PeerIdentity{"tcp://127.0.0.1"}, as_trainer));  // no authenticated key at all
  // Admitted by someone else (a member posing as owner): not this swarm's certificate.
  CHECK(refused(caller(stranger), to_text(admit(trainer, stranger.signing_public, MemberRole::trainer, kNow + 60))));
}

TEST_CASE("a key file makes the same identity every time, is never overwritten, and must be private") {
  const fs::path path = scratch("member.key");
  auto made = create_key_file(path.string());
  REQUIRE(made.is_ok());
  CHECK((fs::status(path).permissions() & (fs::perms::group_all | fs::perms::others_all)) == fs::perms::none);
  auto loaded = load_key_file(path.string());
  REQUIRE(loaded.is_ok());
  CHECK(loaded->fingerprint == made->fingerprint);
  CHECK(loaded->curve.public_key == made->curve.public_key);
  CHECK(create_key_file(path.string()).status().code() == StatusCode::failed_precondition);
  ::chmod(path.c_str(), 0644);
  CHECK(load_key_file(path.string()).status().code() == StatusCode::permission_denied);
  CHECK(load_key_file(scratch("absent.key").string()).status().code() == StatusCode::not_found);
}

TEST_CASE("joining a swarm with an owner checks this identity's certificate from that owner") {
  const SwarmIdentity owner = fresh(), member = fresh(), other = fresh();
  const Certificate mine = admit(owner, member.signing_public, MemberRole::peer, kNow + 60);
  auto joined = join_swarm_as(kSecret, {member, owner.signing_public, mine}, kNow);
  REQUIRE(joined.is_ok());
  CHECK(joined->self.fingerprint == member.fingerprint);
  CHECK(joined->certificate == to_text(mine));
  // A reader (swarm status, a trainer): the owner's key, no certificate of its own.
  auto reader = join_swarm_as(kSecret, {member, owner.signing_public, std::nullopt}, kNow);
  REQUIRE(reader.is_ok());
  CHECK(reader->owner.has_value());
  CHECK(reader->certificate.empty());
  CHECK(join_swarm_as(kSecret, {other, owner.signing_public, mine}, kNow).status().code() ==
        StatusCode::permission_denied);
  CHECK(join_swarm_as(kSecret, {member, owner.signing_public, mine}, kNow + 61).status().code() ==
        StatusCode::permission_denied);
  CHECK(join_swarm_as(kSecret, {member, std::nullopt, mine}, kNow).status().code() == StatusCode::invalid_argument);
}

// Sealing and opening without a network: what a reader in a swarm with an owner keeps.
struct OwnedSwarm {
  SwarmIdentity owner = fresh();
  int64_t now = kNow;

  SwarmCredentials member(MemberRole role, int64_t expires_at = kNow + 600) {
    const SwarmIdentity identity = fresh();
    auto joined =
        join_swarm_as(kSecret, {identity, owner.signing_public, admit(owner, identity.signing_public, role, expires_at)},
                      now);
    REQUIRE(joined.is_ok());
    return *joined;
  }
  StoredRecord sealed_by(const SwarmCredentials& credentials, const std::string& name) {
    StoredRecord record;
    record.scope = "swarm/progress/0";
    record.subkey = *peer_id_bound_to(name, credentials.self);
    record.seq = 1;
    record.expires_at = 100;
    record.value = "{}";
    auto sealed = make_record_sealer(credentials, [this] { return now; }).seal(record);
    REQUIRE(sealed.is_ok());
    record.value = *sealed;
    return record;
  }
  Result<std::string> open(const StoredRecord& record) {
    return make_record_sealer(member(MemberRole::peer), [this] { return now; }).open(record);
  }
};

TEST_CASE("in a swarm with an owner, only certified peers' records open") {
  OwnedSwarm swarm;
  CHECK(swarm.open(swarm.sealed_by(swarm.member(MemberRole::peer), "p")).is_ok());

  // A secret holder's minted identity: a valid seal, no certificate.
  auto minted = join_swarm(kSecret);
  REQUIRE(minted.is_ok());
  CHECK(swarm.open(swarm.sealed_by(*minted, "sybil")).status().code() == StatusCode::permission_denied);
  // A trainer's certificate announces nothing.
  CHECK(swarm.open(swarm.sealed_by(swarm.member(MemberRole::trainer), "t")).status().code() ==
        StatusCode::permission_denied);
  // A certificate lent to another key: the minted identity shows a real member's certificate.
  SwarmCredentials lender = swarm.member(MemberRole::peer);
  SwarmCredentials borrower = *minted;
  borrower.certificate = lender.certificate;
  CHECK(swarm.open(swarm.sealed_by(borrower, "borrower")).status().code() == StatusCode::permission_denied);
  // Expired by the time it is read.
  const StoredRecord late = swarm.sealed_by(swarm.member(MemberRole::peer, kNow + 10), "late");
  swarm.now = kNow + 10;
  CHECK(swarm.open(late).status().code() == StatusCode::permission_denied);
}

TEST_CASE("a swarm of the secret alone still opens every member's records, certified or not") {
  auto reader = join_swarm(kSecret);
  auto writer = join_swarm(kSecret);
  REQUIRE(reader.is_ok());
  REQUIRE(writer.is_ok());
  OwnedSwarm swarm;
  const StoredRecord record = swarm.sealed_by(*writer, "w");
  CHECK(make_record_sealer(*reader).open(record).is_ok());
  const StoredRecord certified = swarm.sealed_by(swarm.member(MemberRole::peer), "c");
  CHECK(make_record_sealer(*reader).open(certified).is_ok());
}

}  // namespace
}  // namespace swarm::security
