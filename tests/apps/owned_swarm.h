// owned_swarm: a swarm's owner for process tests: its key and, for each member, a
// key file and a certificate, made by the real `swarm keygen` and `swarm admit`.
//
//   OwnedSwarm owner(dir / "keys");
//   args += owner.member_flags("p00");  // --owner-key, --identity, --certificate
//   trainer_args += owner.member_flags("trainer", "trainer");
#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <doctest/doctest.h>

#include "swarm/security/certificate.h"
#include "tests/apps/swarm_process.h"

namespace swarm::test_apps {

struct OwnedSwarm {
  std::filesystem::path keys;
  std::string public_hex;  // the owner's, as `swarm keygen` printed it

  explicit OwnedSwarm(std::filesystem::path keys_dir) : keys(std::move(keys_dir)) {
    std::filesystem::create_directories(keys);
    public_hex = keygen("owner");
  }

  // A member's public key, from a new key file keys/NAME.key.
  std::string keygen(const std::string& name) const {
    const Run made = run_command(fmt::format("{} keygen --out {} 2>&1", kSwarmBinary, (keys / (name + ".key")).string()));
    REQUIRE_MESSAGE(made.exit_code == 0, made.output);
    std::string hex = made.output;
    while (!hex.empty() && (hex.back() == '\n' || hex.back() == '\r')) hex.pop_back();
    REQUIRE(hex.size() == 64);
    return hex;
  }

  // NAME admitted in ROLE (peer or trainer): its key file and certificate, for a day.
  void admit(const std::string& name, const std::string& role = "peer") const {
    const std::string member = keygen(name);
    const Run admitted = run_command(fmt::format("{} admit --owner {} --member {} --role {} --days 1 --out {} 2>&1",
                                                 kSwarmBinary, (keys / "owner.key").string(), member, role,
                                                 (keys / (name + ".cert")).string()));
    REQUIRE_MESSAGE(admitted.exit_code == 0, admitted.output);
  }

  std::vector<std::string> member_flags(const std::string& name, const std::string& role = "peer") const {
    admit(name, role);
    return {"--owner-key", public_hex, "--identity", (keys / (name + ".key")).string(), "--certificate",
            (keys / (name + ".cert")).string()};
  }

  // For a member in this process (a test's attacker): admitted as NAME.
  security::Membership membership_for(const std::string& name) const {
    admit(name);
    auto identity = security::load_key_file((keys / (name + ".key")).string());
    auto certificate = security::load_certificate_file((keys / (name + ".cert")).string());
    auto owner = security::signing_key_from_hex(public_hex);
    REQUIRE(identity.is_ok());
    REQUIRE(certificate.is_ok());
    REQUIRE(owner.is_ok());
    return {*identity, *owner, *certificate};
  }
};

}  // namespace swarm::test_apps
