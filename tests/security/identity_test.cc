// Identities of a secured swarm: one secret gives every member the same swarm
// keys, each process its own key pair, and a peer id that names that pair.
#include <doctest/doctest.h>

#include "swarm/security/identity.h"

namespace swarm::security {
namespace {

SwarmCredentials join(const std::string& secret) {
  auto credentials = join_swarm(secret);
  REQUIRE_MESSAGE(credentials.is_ok(), credentials.status().to_string());
  return std::move(credentials).value();
}

TEST_CASE("members of one swarm share its server key and its membership key, but not their own pairs") {
  SwarmCredentials a = join("correct horse"), b = join("correct horse"), other = join("battery staple");
  CHECK(a.swarm_server.public_key == b.swarm_server.public_key);
  CHECK(a.membership_key == b.membership_key);
  CHECK(a.swarm_server.public_key != other.swarm_server.public_key);
  CHECK(a.membership_key != other.membership_key);
  CHECK(a.self.curve.public_key != b.self.curve.public_key);
  CHECK(a.self.fingerprint != b.self.fingerprint);
  CHECK(a.self.fingerprint.size() == kFingerprintHexChars);

  SecurityOptions server = a.server_options(), client = a.client_options();
  CHECK(server.curve);
  CHECK(server.keys.public_key == a.swarm_server.public_key);
  CHECK(server.allowed_client_keys.empty());
  CHECK(client.keys.public_key == a.self.curve.public_key);
  CHECK(client.server_public_key == a.swarm_server.public_key);
}

TEST_CASE("an empty secret is refused") { CHECK(join_swarm("").status().code() == StatusCode::invalid_argument); }

TEST_CASE("a bound peer id speaks only for the key it names") {
  SwarmCredentials a = join("s"), b = join("s");
  auto id = peer_id_bound_to("stage0", a.self);
  REQUIRE(id.is_ok());
  CHECK(fingerprint_in(*id) == a.self.fingerprint);
  CHECK(speaks_for(*id, PeerIdentity{"curve:" + a.self.curve.public_key}));
  CHECK_FALSE(speaks_for(*id, PeerIdentity{"curve:" + b.self.curve.public_key}));
  // Unauthenticated senders, unbound ids and junk keys never pass.
  CHECK_FALSE(speaks_for(*id, PeerIdentity{"zmq:0011"}));
  CHECK_FALSE(speaks_for("stage0", PeerIdentity{"curve:" + a.self.curve.public_key}));
  CHECK_FALSE(speaks_for(*id, PeerIdentity{"curve:not-forty-characters"}));
  CHECK(peer_id_bound_to("has.dot", a.self).status().code() == StatusCode::invalid_argument);
  CHECK(peer_id_bound_to("", a.self).status().code() == StatusCode::invalid_argument);
  // The fingerprint of the CURVE key and of the signing key it came from agree.
  auto from_curve = fingerprint_of_curve_key(a.self.curve.public_key);
  REQUIRE(from_curve.is_ok());
  CHECK(*from_curve == a.self.fingerprint);
}

TEST_CASE("hex decoding takes exactly the size asked for") {
  unsigned char out[2];
  CHECK(from_hex("0aff", out, 2));
  CHECK(out[0] == 0x0a);
  CHECK(out[1] == 0xff);
  CHECK_FALSE(from_hex("0af", out, 2));
  CHECK_FALSE(from_hex("0aff00", out, 2));
  CHECK_FALSE(from_hex("zzzz", out, 2));
  CHECK(to_hex(out, 2) == "0aff");
}

}  // namespace
}  // namespace swarm::security
