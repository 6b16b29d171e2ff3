// local_owner: `swarm local --certified` makes the run its swarm's owner: the
// owner's key in RUN_DIR/keys, and for each peer it starts a key file and a peer
// certificate (a day long), as `swarm keygen` and `swarm admit` would, and a trainer
// certificate for the run's own trainer. Every record the run reads then counts only
// from the peers it admitted, and the peers serve only the trainer it admitted.
#pragma once

#include <string>
#include <vector>

#include "apps/swarm_access.h"
#include "swarm/core/status.h"
#include "swarm/security/certificate.h"

namespace swarm::apps {

class LocalOwner {
 public:
  // The owner's key file in `keys_dir`: made, or loaded where a resumed run left it.
  static Result<LocalOwner> create(const std::string& keys_dir);

  std::string public_hex() const;
  // `name` admitted in `role`: its key file and certificate in the keys folder (made
  // or renewed), and the owner's key.
  Result<MembershipOptions> admit(const std::string& name, security::MemberRole role) const;

 private:
  std::string keys_dir_;
  security::SwarmIdentity owner_;
};

}  // namespace swarm::apps
