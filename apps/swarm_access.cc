#include "apps/swarm_access.h"

#include <arpa/inet.h>

#include <cstdlib>

#include "swarm/security/record_seal.h"

namespace swarm::apps {

Result<SwarmAccess> SwarmAccess::create(const std::string& host, const std::string& secret) {
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
    SWARM_ASSIGN_OR_RETURN(security::SwarmCredentials credentials, security::join_swarm(access.secret_));
    access.credentials_ = std::move(credentials);
  }
  return access;
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

}  // namespace swarm::apps
