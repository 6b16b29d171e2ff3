// resync_hold: a leader holds its stage's next round still for a stage-mate that
// catches up, because a stage that steps faster than a state download (or than
// its records show) otherwise leaves a newcomer behind after every download.
//
// A mate wants in while its record says it re-syncs, or for one hold period after
// its JOIN came from an earlier step (a download that landed behind the stage,
// which a record may never show: a short download is over before it is published).
// Each mate has a credit of hold time: at most `hold_seconds`, spent while the
// stage holds for it, earned back at a tenth of the time that passes. So a member
// that only claims to catch up costs the stage at most a tenth of its time, and a
// short hold (a mate that re-synced for a moment) spends only what it held.
//
// Pure: the view and the time in, a yes or no out; no clock, no I/O.
//
//   ResyncHolds holds(1.0);
//   holds.heard_behind("p2", now);                     // p2 JOINed at an older step
//   if (holds.holding(view, skip, now)) return false;  // ready_to_begin waits
#pragma once

#include <functional>
#include <map>
#include <string>

#include "swarm/averaging/stage_view.h"

namespace swarm {

class ResyncHolds {
 public:
  explicit ResyncHolds(double hold_seconds) : hold_(hold_seconds) {}

  // `mate` JOINed at an older step than this leader's.
  void heard_behind(const std::string& mate, double now);
  // Whether to hold the round now for a mate of `view` that wants in; `skip`
  // names the mates not held for (benched, or JOINed this step).
  bool holding(const StageView& view, const std::function<bool(const std::string&)>& skip, double now);

 private:
  struct Credit {
    double seconds = 0;  // of holding left
    double at = 0;       // when it was last brought up to date
    bool held = false;   // the stage held for this mate since `at`
  };
  bool wants_in(const ProgressRecord& mate, double now) const;

  double hold_;
  std::map<std::string, Credit> credit_;  // mates of the view only
  std::map<std::string, double> behind_;  // mate -> when its last JOIN from behind came
};

}  // namespace swarm
