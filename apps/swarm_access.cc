#include "apps/swarm_access.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstdlib>

#include "swarm/security/certificate.h"
#include "swarm/security/hop_chain.h"
#include "swarm/security/record_seal.h"

namespace swarm::apps {

namespace {

Result<security::SwarmCredentials> credentials_for(const std::string& secret, const MembershipOptions& options) {
  std::string owner_hex = options.owner_key;
  if (owner_hex.empty()) {
    if (const char* from_environment = std::getenv("SWARM_OWNER_KEY")) owner_hex = from_environment;
  }
  if (owner_hex.empty() && options.identity.empty() && options.certificate.empty()) {
    return security::join_swarm(secret);
  }
  security::Membership membership;
  if (!owner_hex.empty()) {
    auto owner = security::signing_key_from_hex(owner_hex);
    if (!owner.is_ok()) return invalid_argument("--owner-key: {}", owner.status().message());
    membership.owner = *owner;
  }
  if (!options.certificate.empty()) {
    SWARM_ASSIGN_OR_RETURN(membership.certificate, security::load_certificate_file(options.certificate));
    if (options.identity.empty()) return invalid_argument("--certificate needs the --identity key file it admits");
  }
  if (!options.identity.empty()) {
    SWARM_ASSIGN_OR_RETURN(membership.identity, security::load_key_file(options.identity));
  } else {
    SWARM_ASSIGN_OR_RETURN(security::SwarmCredentials fresh, security::join_swarm(secret));
    membership.identity = fresh.self;
  }
  return security::join_swarm_as(secret, membership, security::wall_clock_seconds());
}

}  // namespace

Result<SwarmAccess> SwarmAccess::create(const std::string& host, const std::string& secret,
                                        const MembershipOptions& membership) {
  in_addr parsed{};
  if (::inet_pton(AF_INET, host.c_str(), &parsed) != 1) {
    return invalid_argument("--host {}: expected a numeric IPv4 address", host);
  }
  if (parsed.s_addr == htonl(INADDR_ANY)) {
    return invalid_argument("--host 0.0.0.0 cannot be announced: give the address others dial");
  }
  SwarmAccess access;
  access.host_ = host;
  access.secret_ = secret;
  if (access.secret_.empty()) {
    if (const char* from_environment = std::getenv("SWARM_SECRET")) access.secret_ = from_environment;
  }
  if (!access.secret_.empty()) {
    SWARM_ASSIGN_OR_RETURN(security::SwarmCredentials credentials, credentials_for(access.secret_, membership));
    access.credentials_ = std::move(credentials);
  } else if (!membership.owner_key.empty() || !membership.identity.empty() || !membership.certificate.empty()) {
    return invalid_argument("--owner-key, --identity and --certificate need the swarm's --secret");
  }
  return access;
}

bool SwarmAccess::certified_peer() const {
  if (!credentials_ || credentials_->certificate.empty()) return false;
  auto certificate = security::certificate_from_text(credentials_->certificate);
  return certificate.is_ok() && certificate->role == security::MemberRole::peer;
}

std::string SwarmAccess::owner_key() const {
  return owned() ? security::to_hex(credentials_->owner->data(), credentials_->owner->size()) : std::string();
}

DhtRegistryOptions SwarmAccess::registry_options() const {
  DhtRegistryOptions options;
  options.bind_address = host_;
  if (credentials_) options.sealer = security::make_record_sealer(*credentials_);
  return options;
}

SecurityOptions SwarmAccess::server_security() const {
  return credentials_ ? credentials_->server_options() : SecurityOptions{};
}

SecurityOptions SwarmAccess::client_security() const {
  return credentials_ ? credentials_->client_options() : SecurityOptions{};
}

Result<std::string> SwarmAccess::peer_id(const std::string& name) const {
  if (!credentials_) return name;
  return security::peer_id_bound_to(name, credentials_->self);
}

std::function<bool(const std::string&, const PeerIdentity&)> SwarmAccess::speaks_for() const {
  if (!credentials_) return nullptr;
  return [](const std::string& peer_id, const PeerIdentity& sender) { return security::speaks_for(peer_id, sender); };
}

std::function<Status(const PeerIdentity&, std::string_view)> SwarmAccess::admit_caller() const {
  if (!owned()) return {};
  const security::SigningKey owner = *credentials_->owner;
  return [owner](const PeerIdentity& from, std::string_view credential) {
    return security::check_caller(owner, from, credential, security::wall_clock_seconds());
  };
}

std::string SwarmAccess::credential() const { return owned() ? credentials_->certificate : std::string(); }

std::function<Result<std::string>(const protocol::StageRequest&, std::string_view)> SwarmAccess::sign_hop(
    const std::string& self_id, int stages) const {
  if (!credentials_) return nullptr;
  const size_t max_links = static_cast<size_t>(std::max(stages, 1));
  return [identity = credentials_->self, self_id, max_links](const protocol::StageRequest& request,
                                                             std::string_view next_peer) -> Result<std::string> {
    if (request.hop_chain.empty()) {
      const security::HopStart start{request.microbatch_id, 0, request.deadline_unix_ms};
      return security::hop_chain_bytes(security::start_hop_chain(identity, self_id, start, next_peer));
    }
    // Checked when it arrived (pipeline_origin); parsed again to be extended.
    SWARM_ASSIGN_OR_RETURN(security::HopChain chain, security::hop_chain_from_bytes(request.hop_chain, max_links));
    if (chain.links.size() >= max_links) {
      return invalid_argument("a hop chain of {} links cannot pass on past {} stages", chain.links.size(), max_links);
    }
    security::extend_hop_chain(chain, identity, self_id, next_peer);
    return security::hop_chain_bytes(chain);
  };
}

std::function<Result<std::string>(const PeerIdentity&, const protocol::StageCall&)> SwarmAccess::pipeline_origin(
    const std::string& self_id, int stages) const {
  if (!credentials_) return nullptr;
  const size_t max_links = static_cast<size_t>(std::max(stages, 1));
  return [self_id, max_links](const PeerIdentity& from, const protocol::StageCall& call) -> Result<std::string> {
    if (call.hop_chain.empty()) return permission_denied("a pipeline without a hop chain in a secured swarm");
    auto chain = security::hop_chain_from_bytes(call.hop_chain, max_links);
    if (!chain.is_ok()) return permission_denied("a malformed hop chain: {}", chain.status().message());
    if (Status checked = security::check_hop_chain(*chain, self_id, from, max_links); !checked.is_ok()) {
      return permission_denied("{}", checked.message());
    }
    if (chain->start.microbatch != call.microbatch_id) {
      return permission_denied("the hop chain is for microbatch {:016x}, not {:016x}", chain->start.microbatch,
                               call.microbatch_id);
    }
    // Hops answered at once: the outcome goes to reply_to, which must be the peer
    // that handed it here (the last signer, whom the transport authenticated).
    if (!call.reply_to.empty() && (chain->links.empty() || chain->links.back().from != call.reply_to)) {
      return permission_denied("the pipeline's reply_to {} did not hand it here", call.reply_to);
    }
    return chain->trainer;
  };
}

}  // namespace swarm::apps
