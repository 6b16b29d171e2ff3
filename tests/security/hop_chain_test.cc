// Hop chains: a peer-to-peer forward is taken only on a path its trainer
// started, handed on by the peers it names, sent by the last of them.
#include <doctest/doctest.h>

#include <string>

#include "swarm/security/hop_chain.h"

namespace swarm::security {
namespace {

struct Member {
  SwarmIdentity identity;
  std::string id;
  PeerIdentity as_sender() const { return PeerIdentity{"curve:" + identity.curve.public_key}; }
};

Member member(const std::string& name) {
  auto credentials = join_swarm("hop chain test");
  REQUIRE(credentials.is_ok());
  auto id = peer_id_bound_to(name, credentials->self);
  REQUIRE(id.is_ok());
  return Member{credentials->self, *id};
}

constexpr HopStart kStart{.microbatch = 7, .attempt = 1, .deadline_unix_ms = 1'800'000'000'000};

TEST_CASE("a chain from the trainer through stage 0 checks at stage 1, also after the wire") {
  const Member trainer = member("trainer0"), s0 = member("s0p0"), s1 = member("s1p2");
  HopChain chain = start_hop_chain(trainer.identity, trainer.id, kStart, s0.id);
  CHECK(check_hop_chain(chain, s0.id, trainer.as_sender(), 8).is_ok());  // at stage 0, from the trainer
  extend_hop_chain(chain, s0.identity, s0.id, s1.id);
  CHECK(check_hop_chain(chain, s1.id, s0.as_sender(), 8).is_ok());

  auto parsed = hop_chain_from_bytes(hop_chain_bytes(chain), 8);
  REQUIRE(parsed.is_ok());
  CHECK(parsed->trainer == trainer.id);
  CHECK(parsed->start == kStart);
  CHECK(check_hop_chain(*parsed, s1.id, s0.as_sender(), 8).is_ok());
}

TEST_CASE("a chain is refused where it does not end, from whoever did not sign its last link, and beyond its length") {
  const Member trainer = member("trainer0"), s0 = member("s0p0"), s1 = member("s1p2"), other = member("s1p3");
  HopChain chain = start_hop_chain(trainer.identity, trainer.id, kStart, s0.id);
  extend_hop_chain(chain, s0.identity, s0.id, s1.id);
  CHECK(check_hop_chain(chain, other.id, s0.as_sender(), 8).code() == StatusCode::permission_denied);
  CHECK(check_hop_chain(chain, s1.id, trainer.as_sender(), 8).code() == StatusCode::permission_denied);
  CHECK(check_hop_chain(chain, s1.id, PeerIdentity{"plain"}, 8).code() == StatusCode::permission_denied);
  CHECK(check_hop_chain(chain, s1.id, s0.as_sender(), 1).code() == StatusCode::invalid_argument);
  CHECK(check_hop_chain(HopChain{}, s1.id, s0.as_sender(), 8).code() == StatusCode::permission_denied);
}

TEST_CASE("a member cannot start another trainer's microbatch, nor hand on what was not handed to it") {
  const Member trainer = member("trainer0"), s0 = member("s0p0"), s1 = member("s1p2"), hostile = member("s0p9");
  // Its own signature under the trainer's id: the id is bound to another key.
  HopChain forged = start_hop_chain(hostile.identity, trainer.id, kStart, hostile.id);
  extend_hop_chain(forged, hostile.identity, hostile.id, s1.id);
  CHECK(check_hop_chain(forged, s1.id, hostile.as_sender(), 8).code() == StatusCode::permission_denied);

  // The trainer handed it to s0; the hostile member signs on as s0, then as itself.
  HopChain honest = start_hop_chain(trainer.identity, trainer.id, kStart, s0.id);
  HopChain as_s0 = honest;
  extend_hop_chain(as_s0, hostile.identity, s0.id, s1.id);
  CHECK(check_hop_chain(as_s0, s1.id, hostile.as_sender(), 8).code() == StatusCode::permission_denied);
  HopChain as_itself = honest;
  extend_hop_chain(as_itself, hostile.identity, hostile.id, s1.id);
  CHECK(check_hop_chain(as_itself, s1.id, hostile.as_sender(), 8).code() == StatusCode::permission_denied);

  // Another trainer's signed start, with the microbatch, attempt or deadline changed.
  HopChain chain = honest;
  extend_hop_chain(chain, s0.identity, s0.id, s1.id);
  for (auto change : {+[](HopStart& s) { s.microbatch += 1; }, +[](HopStart& s) { s.attempt += 1; },
                      +[](HopStart& s) { s.deadline_unix_ms += 60'000; }}) {
    HopChain tampered = chain;
    change(tampered.start);
    CHECK(check_hop_chain(tampered, s1.id, s0.as_sender(), 8).code() == StatusCode::permission_denied);
  }
  // A link lifted from another chain does not sign over this one's first link.
  HopChain other_start = start_hop_chain(trainer.identity, trainer.id, {8, 1, kStart.deadline_unix_ms}, s0.id);
  extend_hop_chain(other_start, s0.identity, s0.id, s1.id);
  HopChain spliced = honest;
  spliced.links.push_back(other_start.links[1]);
  CHECK(check_hop_chain(spliced, s1.id, s0.as_sender(), 8).code() == StatusCode::permission_denied);
}

TEST_CASE("the wire form refuses every cut, a trailing byte, a bad count or version, and ids out of bounds") {
  const Member trainer = member("trainer0"), s0 = member("s0p0"), s1 = member("s1p2");
  HopChain chain = start_hop_chain(trainer.identity, trainer.id, kStart, s0.id);
  extend_hop_chain(chain, s0.identity, s0.id, s1.id);
  const std::string bytes = hop_chain_bytes(chain);
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    CHECK(hop_chain_from_bytes(bytes.substr(0, cut), 8).status().code() == StatusCode::invalid_argument);
  }
  CHECK(hop_chain_from_bytes(bytes + "x", 8).status().code() == StatusCode::invalid_argument);
  CHECK(hop_chain_from_bytes(bytes, 1).status().code() == StatusCode::invalid_argument);  // 2 links, 1 allowed
  std::string version = bytes;
  version[0] = 2;
  CHECK(hop_chain_from_bytes(version, 8).status().code() == StatusCode::invalid_argument);
  std::string empty_id = bytes;
  empty_id[1] = 0;  // the trainer's id, zero bytes long
  CHECK(hop_chain_from_bytes(empty_id, 8).status().code() == StatusCode::invalid_argument);
  std::string long_id = bytes;
  long_id[1] = static_cast<char>(200);
  CHECK(hop_chain_from_bytes(long_id, 8).status().code() == StatusCode::invalid_argument);
  std::string no_links = bytes;
  no_links[1 + 1 + trainer.id.size() + 24] = 0;
  CHECK(hop_chain_from_bytes(no_links, 8).status().code() == StatusCode::invalid_argument);
}

}  // namespace
}  // namespace swarm::security
