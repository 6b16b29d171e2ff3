// swarm_access: how a role of the `swarm` program reaches a swarm: the address
// it binds and announces (--host), and, with a secret (--secret, or the
// SWARM_SECRET environment variable), its identity, CURVE on every server and
// client, and sealed registry records.
//
//   SWARM_ASSIGN_OR_RETURN(SwarmAccess access, SwarmAccess::create(host, secret));
//   auto registry = DhtRegistry::start(0, {bootstrap}, access.registry_options());
//   config.server.security = access.server_security();
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "swarm/api/transport.h"
#include "swarm/core/ids.h"
#include "swarm/core/status.h"
#include "swarm/protocol/stage_protocol.h"
#include "swarm/registry/dht_registry.h"
#include "swarm/security/identity.h"

namespace swarm::apps {

// Where a swarm has an owner (swarm/security/certificate.h): the owner's public
// key, and this process's lasting identity and its certificate from the owner.
struct MembershipOptions {
  std::string owner_key;    // hex; empty reads SWARM_OWNER_KEY; both empty: no owner
  std::string identity;     // a key file (swarm keygen); empty: a fresh identity per start
  std::string certificate;  // a certificate file (swarm admit)
};

class SwarmAccess {
 public:
  // host: a numeric IPv4 address others can dial (not 0.0.0.0). secret: empty
  // reads SWARM_SECRET; both empty mean a plaintext swarm. An owner needs a secret.
  static Result<SwarmAccess> create(const std::string& host, const std::string& secret,
                                    const MembershipOptions& membership = {});

  const std::string& host() const { return host_; }
  bool secured() const { return credentials_.has_value(); }
  // The swarm has an owner: only certified peers' records count.
  bool owned() const { return credentials_ && credentials_->owner.has_value(); }
  // This process holds a peer certificate from the owner, so its records count.
  bool certified_peer() const;
  // The owner's public key (hex) for child processes; empty without an owner.
  std::string owner_key() const;
  // The secret, for child processes (through their environment, not argv).
  const std::string& secret() const { return secret_; }

  DhtRegistryOptions registry_options() const;
  SecurityOptions server_security() const;
  SecurityOptions client_security() const;
  // `name` as this process's peer id: bound to its key in a secured swarm.
  Result<std::string> peer_id(const std::string& name) const;
  // Checks that a sender is the peer it names; unset in a plaintext swarm.
  std::function<bool(const std::string&, const PeerIdentity&)> speaks_for() const;
  // A swarm with an owner: admits to a peer's compute only callers whose request
  // carries a certificate for the key that called (security::check_caller); unset
  // otherwise.
  std::function<Status(const PeerIdentity&, std::string_view)> admit_caller() const;
  // This process's certificate (text) for its requests; empty without one.
  std::string credential() const;

  // Peer to peer, the hop chains of a secured swarm (swarm/security/hop_chain.h);
  // both unset in a plaintext swarm. `self_id`: this process's bound id. A
  // pipeline crosses at most `stages` links.
  //   TrainerConfig::sign_hop: starts a chain for a request that carries none (a
  //   trainer's), else extends the one it arrived with to `next_peer`.
  std::function<Result<std::string>(const protocol::StageRequest&, std::string_view)> sign_hop(
      const std::string& self_id, int stages) const;
  //   PeerConfig::pipeline_origin: the chain's trainer, when the chain leads from
  //   it to `self_id`, was last signed by the sender, and names this microbatch.
  std::function<Result<std::string>(const PeerIdentity&, const protocol::StageCall&)> pipeline_origin(
      const std::string& self_id, int stages) const;

 private:
  std::string host_;
  std::string secret_;
  std::optional<security::SwarmCredentials> credentials_;
};

}  // namespace swarm::apps
