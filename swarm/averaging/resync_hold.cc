#include "swarm/averaging/resync_hold.h"

#include <algorithm>

namespace swarm {

constexpr double kEarnedPerSecond = 0.1;  // the most of its time a stage spends holding for one mate

void ResyncHolds::heard_behind(const std::string& mate, double now) {
  if (hold_ > 0) behind_[mate] = now;
}

bool ResyncHolds::wants_in(const ProgressRecord& mate, double now) const {
  if (mate.state == ProgressRecord::State::resyncing) return true;
  auto it = behind_.find(mate.peer_id);
  return it != behind_.end() && now - it->second < hold_;
}

bool ResyncHolds::holding(const StageView& view, const std::function<bool(const std::string&)>& skip, double now) {
  if (hold_ <= 0) return false;
  std::erase_if(behind_, [&](const auto& entry) { return now - entry.second >= hold_; });
  std::erase_if(credit_, [&](const auto& entry) { return view.find(entry.first) == nullptr; });
  bool holding = false;
  for (const auto& mate : view.mates) {
    Credit& c = credit_.try_emplace(mate.peer_id, Credit{hold_, now, false}).first->second;
    const double elapsed = std::max(0.0, now - c.at);
    c.seconds = c.held ? c.seconds - elapsed : std::min(hold_, c.seconds + kEarnedPerSecond * elapsed);
    c.at = now;
    c.held = c.seconds > 0 && wants_in(mate, now) && !skip(mate.peer_id);
    holding = holding || c.held;
  }
  return holding;
}

}  // namespace swarm
