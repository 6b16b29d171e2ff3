// Router decisions per second at 10, 100 and 1000 peers per stage: stochastic wiring
// (a heap of virtual finish times and an EMA per peer) beside round robin (a cursor),
// the cheapest policy there is. One decision = choose + report(success), what a
// trainer does per task; the target is >= 1M/s at 1000 peers (one run: 8.1M/s, 0.10x of
// round robin's cursor at 1000 peers, 0.21x at 10). Written with user_bench.h, as a
// user's own router would be.
#include "bench/user_bench.h"
#include "swarm/wiring/baseline_routers.h"
#include "swarm/wiring/stochastic_wiring.h"

namespace {

template <int Peers>
bool compare() {
  return swarm::bench::compare_routers(
      "stochastic wiring vs round robin, " + std::to_string(Peers) + " peers", Peers,
      [] { return swarm::StochasticWiringRouter(); }, [] { return swarm::RoundRobinRouter(); });
}

const bool registered = compare<10>() && compare<100>() && compare<1000>();

}  // namespace
