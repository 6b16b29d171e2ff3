// local_owner: `swarm local --certified` makes the run its swarm's owner: the
// owner's key in RUN_DIR/keys, and for each peer it starts a key file and a peer
// certificate (a day long), as `swarm keygen` and `swarm admit` would. Every record
// the run reads then counts only from the peers it admitted.
#pragma once

#include <string>
#include <vector>

#include "swarm/core/status.h"
#include "swarm/security/certificate.h"

namespace swarm::apps {

class LocalOwner {
 public:
  // The owner's key file in `keys_dir`: made, or loaded where a resumed run left it.
  static Result<LocalOwner> create(const std::string& keys_dir);

  std::string public_hex() const;
  // `name` admitted as a peer: the flags that make a `swarm peer` that member.
  Result<std::vector<std::string>> admit(const std::string& name) const;

 private:
  std::string keys_dir_;
  security::SwarmIdentity owner_;
};

}  // namespace swarm::apps
