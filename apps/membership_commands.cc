#include "apps/membership_commands.h"

#include <cstdio>
#include <fstream>
#include <memory>

#include <fmt/format.h>

#include "swarm/security/certificate.h"

namespace swarm::apps {
namespace {

struct AdmitOptions {
  std::string owner;  // the owner's key file
  std::string member;  // the member's public key, hex
  std::string role = "peer";
  double days = 30;
  std::string out;  // empty: stdout
};

int keygen(const std::string& out) {
  auto identity = security::create_key_file(out);
  if (!identity.is_ok()) {
    fmt::print(stderr, "swarm keygen: {}\n", identity.status().message());
    return 1;
  }
  fmt::print("{}\n", security::to_hex(identity->signing_public.data(), identity->signing_public.size()));
  return 0;
}

int admit(const AdmitOptions& o) {
  auto fail = [](const std::string& why) {
    fmt::print(stderr, "swarm admit: {}\n", why);
    return 1;
  };
  auto owner = security::load_key_file(o.owner);
  if (!owner.is_ok()) return fail(owner.status().message());
  auto member = security::signing_key_from_hex(o.member);
  if (!member.is_ok()) return fail("--member: " + member.status().message());
  auto role = security::role_from_name(o.role);
  if (!role.is_ok()) return fail("--role: " + role.status().message());
  const int64_t expires_at = security::wall_clock_seconds() + static_cast<int64_t>(o.days * 86400);
  const std::string text = security::to_text(security::admit(*owner, *member, *role, expires_at)) + "\n";
  if (o.out.empty()) {
    fmt::print("{}", text);
    return 0;
  }
  std::ofstream file(o.out, std::ios::trunc);
  if (!(file << text) || !file.flush()) return fail("cannot write " + o.out);
  return 0;
}

}  // namespace

void add_membership_options(CLI::App* command, MembershipOptions* membership) {
  command->add_option("--owner-key", membership->owner_key,
                      "The swarm owner's public key (hex; default: $SWARM_OWNER_KEY): only records of peers it "
                      "certified count");
  command->add_option("--identity", membership->identity,
                      "Key file of this process's lasting identity (swarm keygen; default: a fresh one each start)");
  command->add_option("--certificate", membership->certificate,
                      "The owner's certificate for --identity (swarm admit)");
}

void add_keygen_command(CLI::App& app, int* exit_code) {
  auto out = std::make_shared<std::string>();
  CLI::App* command = app.add_subcommand(
      "keygen", "Make a key file (mode 0600) for an owner or a member; prints its public key");
  command->add_option("--out", *out, "The key file to create (never overwritten)")->required();
  command->callback([out, exit_code] { *exit_code = keygen(*out); });
}

void add_admit_command(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<AdmitOptions>();
  CLI::App* command = app.add_subcommand(
      "admit", "As the swarm's owner, sign a member's public key into a certificate (role, expiry)");
  command->add_option("--owner", o->owner, "The owner's key file (swarm keygen)")->required();
  command->add_option("--member", o->member, "The member's public key (hex, as swarm keygen printed it)")->required();
  command->add_option("--role", o->role, "peer (its records count) or trainer")
      ->check(CLI::IsMember({"peer", "trainer"}))
      ->capture_default_str();
  command->add_option("--days", o->days, "Days until the certificate expires")
      ->check(CLI::Range(0.001, 3650.0))
      ->capture_default_str();
  command->add_option("--out", o->out, "Write the certificate here (default: print it)");
  command->callback([o, exit_code] { *exit_code = admit(*o); });
}

}  // namespace swarm::apps
