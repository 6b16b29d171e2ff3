// Router decisions per second at 10, 100 and 1000 peers per stage: stochastic wiring
// (a heap of virtual finish times and an EMA per peer) beside round robin (a cursor),
// the cheapest policy there is. One decision = choose + report(success), what a
// trainer does per task; the target is >= 1M/s at 1000 peers, within 3x of round robin.
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "bench/ratio_report.h"
#include "swarm/wiring/baseline_routers.h"
#include "swarm/wiring/stochastic_wiring.h"

namespace {

std::vector<swarm::PeerAnnouncement> stage_of(int64_t peers) {
  std::vector<swarm::PeerAnnouncement> out;
  for (int64_t i = 0; i < peers; ++i) {
    // Short ids stay in std::string's inline buffer, as real peer ids of this length would.
    out.push_back({"peer-" + std::to_string(i), 1e18, 0});
  }
  return out;
}

template <typename R>
void decide(benchmark::State& state, R& router) {
  router.set_peers(stage_of(state.range(0)), 0.0);
  double now = 0;
  uint64_t i = 0;
  for (auto _ : state) {
    // Durations vary so the heap keeps reordering instead of cycling in a fixed order.
    const double duration = 0.5 + static_cast<double>(i++ & 7) * 0.125;
    now += 0.001;
    std::optional<swarm::PeerId> peer = router.choose(swarm::TaskKind::forward, 1, now);
    router.report(*peer, swarm::TaskKind::forward, 1, swarm::Outcome::success, duration, now);
    benchmark::DoNotOptimize(peer);
  }
  state.SetItemsProcessed(state.iterations());  // decisions per second
}

void BM_Stochastic(benchmark::State& state) {
  swarm::StochasticWiringRouter router;
  decide(state, router);
}

void BM_RoundRobin(benchmark::State& state) {
  swarm::RoundRobinRouter router;
  decide(state, router);
}

// Interleaved so that both halves of each pair see the same machine state.
BENCHMARK(BM_Stochastic)->Arg(10);
BENCHMARK(BM_RoundRobin)->Arg(10);
BENCHMARK(BM_Stochastic)->Arg(100);
BENCHMARK(BM_RoundRobin)->Arg(100);
BENCHMARK(BM_Stochastic)->Arg(1000);
BENCHMARK(BM_RoundRobin)->Arg(1000);

SWARM_BENCH_RATIO("stochastic wiring vs round robin, 10 peers", "BM_Stochastic/10", "BM_RoundRobin/10");
SWARM_BENCH_RATIO("stochastic wiring vs round robin, 100 peers", "BM_Stochastic/100",
                  "BM_RoundRobin/100");
SWARM_BENCH_RATIO("stochastic wiring vs round robin, 1000 peers", "BM_Stochastic/1000",
                  "BM_RoundRobin/1000");

}  // namespace
