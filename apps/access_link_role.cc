#include "apps/access_link_role.h"

#include "transports/netem/access_links.h"

namespace swarm::apps {

Status join_access_link(std::string_view link, const std::string& board, std::string_view name) {
  if (link.empty()) {
    if (!board.empty()) return invalid_argument("--link-board needs --link");
    return Status::ok();
  }
  const Result<netem::AccessLinkSpec> spec = netem::parse_access_link(link);
  if (!spec.is_ok()) return spec.status().with_context("--link");
  SWARM_ASSIGN_OR_RETURN(auto shared, board.empty() ? netem::AccessLinkBoard::private_board()
                                                    : netem::AccessLinkBoard::open(board));
  SWARM_ASSIGN_OR_RETURN(netem::AccessLink joined, shared->join(name, *spec));
  netem::set_process_access_link(joined);
  return Status::ok();
}

}  // namespace swarm::apps
