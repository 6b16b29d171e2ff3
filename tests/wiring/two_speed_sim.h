// two_speed_sim: one stage of peers with fixed service times, driven by any Router
// on a fake clock, to show which share of tasks each peer ends up serving.
//
//   swarm::StochasticWiringRouter router;
//   auto served = swarm::testing::simulate_stage(router, {{"fast", 1.0}, {"slow", 2.0}}, 600, 4);
//   double fast_share = served["fast"] / 600.0;
#pragma once

#include <cstdint>
#include <map>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include "swarm/wiring/router.h"

namespace swarm::testing {

struct SimPeer {
  PeerId id;
  double seconds_per_task;
};

// Each peer serves one task at a time, first come first served. The trainer keeps
// `in_flight` tasks outstanding, asks the router for a peer each time it issues one,
// and reports success with the peer's service time when the task completes. Service
// time, not round-trip time: the peer measures it and returns it with the result, and
// queueing delay is what published queue lengths are for.
template <Router R>
std::map<PeerId, int> simulate_stage(R& router, const std::vector<SimPeer>& peers, int tasks,
                                     int in_flight) {
  std::vector<PeerAnnouncement> announcements;
  for (const SimPeer& p : peers) announcements.push_back({p.id, 1e9, 0});
  router.set_peers(announcements, 0.0);

  struct Completion {
    double at;
    int64_t seq;  // ties resolve in issue order, so the run is the same every time
    size_t peer;
    double service;
    bool operator>(const Completion& o) const { return at > o.at || (at == o.at && seq > o.seq); }
  };
  std::priority_queue<Completion, std::vector<Completion>, std::greater<>> events;
  std::vector<double> free_at(peers.size(), 0.0);
  std::map<PeerId, int> served;
  int issued = 0;

  auto issue = [&](double now) {
    std::optional<PeerId> id = router.choose(TaskKind::forward, 1, now);
    REQUIRE(id.has_value());
    size_t index = peers.size();
    for (size_t i = 0; i < peers.size(); ++i) {
      if (peers[i].id == *id) index = i;
    }
    REQUIRE(index < peers.size());
    const double start = std::max(now, free_at[index]);
    free_at[index] = start + peers[index].seconds_per_task;
    events.push({free_at[index], issued, index, peers[index].seconds_per_task});
    ++issued;
    ++served[*id];
  };

  for (int i = 0; i < in_flight && issued < tasks; ++i) issue(0.0);
  while (!events.empty()) {
    const Completion done = events.top();
    events.pop();
    router.report(peers[done.peer].id, TaskKind::forward, 1, Outcome::success, done.service, done.at);
    if (issued < tasks) issue(done.at);
  }
  return served;
}

}  // namespace swarm::testing
