// ban_policy: which stage-mates to leave out of rounds for good, from how their
// contributions lay against the others' (robust_mean.h's judgements).
//
// Two kinds of evidence. A contribution far outside its radius (a gradient
// scaled up, or made up) is banned at once: an honest member's lies within about
// one radius, since the radius is twice the median distance. A gradient pointing
// against the stage's (sign-flipped) can lie near the others in distance when the
// gradients are noisy, but round after round it is the one pointing furthest
// against the others: banned once it was so in most of a window of rounds. The
// least aligned of a round, and negative: with gradients of pure noise every
// member is that in about one round of six, and 16 of 20 would take odds of
// 1 in 10^9 (an honest member of a real stage is negative in some 6% of rounds).
//
// Every member of a round judges the same contributions alike, so the honest
// members ban the same member in the same round, with no vote.
//
// Pure: judgements in, verdicts out; no clock.
#pragma once

#include <algorithm>
#include <cstddef>
#include <deque>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "swarm/averaging/robust_mean.h"

namespace swarm {

struct BanRules {
  double gross_spread = 8.0;  // radii: one such contribution bans
  size_t window = 20;         // judged rounds remembered per member
  size_t misaligned = 16;     // of the window the least aligned, and negative: banned
};

class BanPolicy {
 public:
  explicit BanPolicy(BanRules rules = {}) : rules_(rules) {}

  // One round's judgements (each member once, `self` among them; unjudged ones are
  // skipped). Returns the members banned by it, and why; never `self`, whose own
  // numbers its replica steps with all the same.
  std::vector<std::pair<std::string, std::string>> judge_round(
      const std::vector<std::pair<std::string, ContributionJudgement>>& round, const std::string& self) {
    std::vector<std::pair<std::string, std::string>> out;
    double lowest = std::numeric_limits<double>::infinity();
    for (const auto& [id, j] : round) {
      if (j.judged) lowest = std::min(lowest, j.alignment);
    }
    for (const auto& [id, j] : round) {
      if (!j.judged || id == self || banned(id)) continue;
      if (j.spread > rules_.gross_spread) {
        out.emplace_back(id, ban(id, fmt::format("its contribution lay {:.1f} radii from the stage's average (at most "
                                                 "{:.1f})",
                                                 j.spread, rules_.gross_spread)));
        continue;
      }
      std::deque<bool>& history = misaligned_[id];
      history.push_back(j.alignment < 0 && j.alignment == lowest);
      if (history.size() > rules_.window) history.pop_front();
      const size_t against = static_cast<size_t>(std::count(history.begin(), history.end(), true));
      if (history.size() == rules_.window && against >= rules_.misaligned) {
        out.emplace_back(id, ban(id, fmt::format("its gradient pointed furthest against the stage's in {} of its last "
                                                 "{} rounds",
                                                 against, rules_.window)));
      }
    }
    return out;
  }

  // A member caught doing what no honest member does (a reduced part in a round
  // where every member reduces for itself): banned at once. Returns why.
  std::string caught(const std::string& member, const std::string& what) {
    return banned(member) ? banned_.at(member) : ban(member, what);
  }

  bool banned(const std::string& member) const { return banned_.count(member) != 0; }
  const std::map<std::string, std::string>& bans() const { return banned_; }

 private:
  std::string ban(const std::string& member, std::string why) {
    misaligned_.erase(member);
    banned_[member] = why;
    return why;
  }

  BanRules rules_;
  std::map<std::string, std::deque<bool>> misaligned_;
  std::map<std::string, std::string> banned_;  // and why
};

}  // namespace swarm
