// A swarm's owner on the real binary: `swarm keygen` and `swarm admit`, a peer that
// refuses to start without a valid certificate, and `swarm local --certified`
// admitting each peer it starts.
#include <sys/stat.h>

#include <filesystem>
#include <string>

#include <fmt/format.h>

#include <doctest/doctest.h>

#include "swarm/security/certificate.h"
#include "tests/apps/swarm_process.h"

namespace {

namespace fs = std::filesystem;
using namespace swarm::test_apps;
namespace security = swarm::security;

std::string trimmed(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  return text;
}

std::string keygen(const fs::path& path) {
  const Run made = run_command(fmt::format("{} keygen --out {} 2>&1", kSwarmBinary, path.string()));
  REQUIRE_MESSAGE(made.exit_code == 0, made.output);
  return trimmed(made.output);
}

int64_t now_seconds() { return security::wall_clock_seconds(); }

TEST_CASE("swarm keygen and swarm admit make a private key and a certificate the owner's key checks") {
  const fs::path dir = temp_dir("membership-cli");
  fs::create_directories(dir);
  const std::string owner = keygen(dir / "owner.key");
  const std::string member = keygen(dir / "member.key");
  CHECK(owner.size() == 64);
  CHECK(owner != member);
  CHECK((fs::status(dir / "member.key").permissions() & (fs::perms::group_all | fs::perms::others_all)) ==
        fs::perms::none);
  const Run again = run_command(fmt::format("{} keygen --out {} 2>&1", kSwarmBinary, (dir / "member.key").string()));
  CHECK(again.exit_code == 1);
  CHECK(again.output.find("File exists") != std::string::npos);

  const Run admitted = run_command(fmt::format("{} admit --owner {} --member {} --role peer --days 2 --out {} 2>&1",
                                               kSwarmBinary, (dir / "owner.key").string(), member,
                                               (dir / "member.cert").string()));
  REQUIRE_MESSAGE(admitted.exit_code == 0, admitted.output);
  auto certificate = security::load_certificate_file((dir / "member.cert").string());
  REQUIRE(certificate.is_ok());
  auto owner_key = security::signing_key_from_hex(owner);
  auto member_key = security::signing_key_from_hex(member);
  REQUIRE(owner_key.is_ok());
  REQUIRE(member_key.is_ok());
  CHECK(security::check_certificate(*certificate, *owner_key, *member_key, now_seconds()).is_ok());
  CHECK(security::check_certificate(*certificate, *owner_key, *member_key, now_seconds() + 2 * 86400 + 60).code() ==
        swarm::StatusCode::permission_denied);
  CHECK(certificate->role == security::MemberRole::peer);

  const Run bad_member = run_command(
      fmt::format("{} admit --owner {} --member 1234 2>&1", kSwarmBinary, (dir / "owner.key").string()));
  CHECK(bad_member.exit_code == 1);
  CHECK(bad_member.output.find("--member") != std::string::npos);
  ::chmod((dir / "owner.key").c_str(), 0644);
  const Run exposed = run_command(fmt::format("{} admit --owner {} --member {} 2>&1", kSwarmBinary,
                                              (dir / "owner.key").string(), member));
  CHECK(exposed.exit_code == 1);
  CHECK(exposed.output.find("chmod 600") != std::string::npos);
}

TEST_CASE("a peer of a swarm with an owner will not start without its own valid certificate") {
  const fs::path dir = temp_dir("membership-peer");
  fs::create_directories(dir);
  const std::string owner = keygen(dir / "owner.key");
  const std::string member = keygen(dir / "member.key");
  keygen(dir / "other.key");
  REQUIRE(run_command(fmt::format("{} admit --owner {} --member {} --out {} 2>&1", kSwarmBinary,
                                  (dir / "owner.key").string(), member, (dir / "member.cert").string()))
              .exit_code == 0);
  // Nothing listens at port 9: each case must stop before it looks for the swarm.
  const std::string peer = fmt::format("SWARM_SECRET=s {} peer --bootstrap 127.0.0.1:9 --stages 2 --stage 0", kSwarmBinary);
  const Run uncertified = run_command(fmt::format("{} --owner-key {} 2>&1", peer, owner));
  CHECK(uncertified.exit_code == 1);
  CHECK(uncertified.output.find("this swarm has an owner") != std::string::npos);
  const Run borrowed = run_command(fmt::format("{} --owner-key {} --identity {} --certificate {} 2>&1", peer, owner,
                                               (dir / "other.key").string(), (dir / "member.cert").string()));
  CHECK(borrowed.exit_code == 1);
  CHECK(borrowed.output.find("admits another key") != std::string::npos);
  const Run other_owner = run_command(fmt::format("{} --owner-key {} --identity {} --certificate {} 2>&1", peer, member,
                                                  (dir / "member.key").string(), (dir / "member.cert").string()));
  CHECK(other_owner.exit_code == 1);
  CHECK(other_owner.output.find("not signed by this swarm's owner") != std::string::npos);
  const Run no_secret = run_command(fmt::format("env -u SWARM_SECRET {} peer --bootstrap 127.0.0.1:9 --owner-key {} 2>&1",
                                                kSwarmBinary, owner));
  CHECK(no_secret.exit_code == 1);
  CHECK(no_secret.output.find("need the swarm's --secret") != std::string::npos);
  // A trainer too: the peers would refuse its every request.
  const Run trainer = run_command(fmt::format("SWARM_SECRET=s {} trainer --bootstrap 127.0.0.1:9 --owner-key {} --run-dir {} 2>&1",
                                              kSwarmBinary, owner, (dir / "trainer-run").string()));
  CHECK(trainer.exit_code != 0);
  CHECK(trainer.output.find("serve certified callers only") != std::string::npos);
}

TEST_CASE("swarm local --certified admits each peer it starts and its trainer, and every record it reads is certified") {
  const fs::path dir = temp_dir("membership-local");
  const Run run = run_swarm(
      "--secret membership-test --certified --d-model 32 --layers 2 --heads 2 --seq-len 32 --steps 30 "
      "--eval-windows 4 --peers-per-stage 2",
      dir);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(run.output.find(" 0 abandoned") != std::string::npos);
  CHECK(run.output.find("| 0 registry records refused") != std::string::npos);
  CHECK(read_all(dir / "config.json").find("\"certified\": true") != std::string::npos);
  auto owner = security::load_key_file((dir / "keys" / "owner.key").string());
  REQUIRE(owner.is_ok());
  int admitted = 0;
  for (const auto& entry : fs::directory_iterator(dir / "keys")) {
    if (entry.path().extension() != ".cert") continue;
    fs::path key = entry.path();
    key.replace_extension(".key");
    auto member = security::load_key_file(key.string());
    auto certificate = security::load_certificate_file(entry.path().string());
    REQUIRE(member.is_ok());
    REQUIRE(certificate.is_ok());
    CHECK(security::check_certificate(*certificate, owner->signing_public, member->signing_public, now_seconds()).is_ok());
    ++admitted;
  }
  CHECK(admitted == 5);  // four peers and the run's trainer
  const Run plain = run_command(fmt::format("env -u SWARM_SECRET {} local --certified --steps 1 --run-dir {} 2>&1",
                                            kSwarmBinary, (dir / "plain").string()));
  CHECK(plain.exit_code != 0);
  CHECK(plain.output.find("--certified needs the swarm's --secret") != std::string::npos);
}

}  // namespace
