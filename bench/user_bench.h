// user_bench: your own stage or router, benchmarked against a baseline in one run.
//
// Absolute times on a shared machine are noise; a ratio of two things measured
// side by side is not (ratio_report.h). Each call registers two Google Benchmark
// runs, interleaved, and the ratio bench_main prints after them:
//
//   const bool registered = swarm::bench::compare_stages(
//       "my trunk vs the MLP", [] { return make_trunk(); }, [] { return *swarm::mlp::MlpStage::create(...); },
//       points_batch(32));
//   const bool routed = swarm::bench::compare_routers(
//       "my router vs round robin", 100, [] { return MyRouter(); }, [] { return swarm::RoundRobinRouter(); });
//
// in a file of a `swarm_cc_benchmark` target (tools/swarm.bzl), which links
// //bench:bench_main. A stage iteration is one forward and one backward of the
// batch (items: its rows); a router iteration is one choose and one report (items:
// decisions).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>

#include "bench/ratio_report.h"
#include "swarm/api/data_source.h"
#include "swarm/api/router.h"
#include "swarm/api/stage.h"

namespace swarm::bench {

namespace user_bench_detail {

// What backward takes: d(loss) = 1 for a loss stage, ones shaped like the output otherwise.
inline Tensor output_gradient(const Tensor& output, bool takes_targets) {
  Tensor grad = *Tensor::empty(takes_targets ? Shape{1} : output.shape(), DType::f32);
  for (float& g : grad.span<float>()) g = 1.0f;
  return grad;
}

template <Stage S>
void forward_backward(benchmark::State& state, S& stage, const Microbatch& batch) {
  const TensorView* targets = stage.takes_targets() ? &batch.targets.view() : nullptr;
  auto first = stage.forward(batch.inputs, targets);
  if (!first.is_ok()) {
    state.SkipWithError(first.status().to_string().c_str());
    return;
  }
  const Tensor grad = output_gradient(*first, stage.takes_targets());
  for (auto _ : state) {
    auto output = stage.forward(batch.inputs, targets);
    auto input_grad = stage.backward(batch.inputs, grad, targets);
    if (!output.is_ok() || !input_grad.is_ok()) {
      state.SkipWithError("forward or backward failed");
      return;
    }
    benchmark::DoNotOptimize(input_grad->raw_data());
  }
  (void)stage.zero_grad();
  state.SetItemsProcessed(state.iterations() * batch.inputs.shape()[0]);
}

inline std::vector<PeerAnnouncement> peers_of_one_stage(int peers) {
  std::vector<PeerAnnouncement> out;
  for (int i = 0; i < peers; ++i) out.push_back({"peer-" + std::to_string(i), 1e18, 0});
  return out;
}

template <Router R>
void decide(benchmark::State& state, R& router, int peers) {
  router.set_peers(peers_of_one_stage(peers), 0.0);
  double now = 0;
  uint64_t i = 0;
  for (auto _ : state) {
    // Durations vary so that a router keeping finish times keeps reordering them.
    const double duration = 0.5 + static_cast<double>(i++ & 7) * 0.125;
    now += 0.001;
    std::optional<PeerId> peer = router.choose(TaskKind::forward, 1, now);
    if (!peer) {
      state.SkipWithError("the router chose no peer");
      return;
    }
    router.report(*peer, TaskKind::forward, 1, Outcome::success, duration, now);
    benchmark::DoNotOptimize(peer);
  }
  state.SetItemsProcessed(state.iterations());
}

}  // namespace user_bench_detail

// Registers "<label>/ours" and "<label>/baseline" and their ratio. Each stage is
// made once, when its benchmark starts, so its set-up is not timed.
template <typename MakeOurs, typename MakeBaseline>
  requires Stage<std::invoke_result_t<MakeOurs>> && Stage<std::invoke_result_t<MakeBaseline>>
bool compare_stages(const std::string& label, MakeOurs make_ours, MakeBaseline make_baseline, Microbatch batch) {
  auto shared = std::make_shared<Microbatch>(std::move(batch));
  benchmark::RegisterBenchmark((label + "/ours").c_str(), [make_ours, shared](benchmark::State& state) {
    auto stage = make_ours();
    user_bench_detail::forward_backward(state, stage, *shared);
  });
  benchmark::RegisterBenchmark((label + "/baseline").c_str(), [make_baseline, shared](benchmark::State& state) {
    auto stage = make_baseline();
    user_bench_detail::forward_backward(state, stage, *shared);
  });
  return register_ratio({label, label + "/ours", label + "/baseline"});
}

// The same for routers, over one stage of `peers` peers.
template <typename MakeOurs, typename MakeBaseline>
  requires Router<std::invoke_result_t<MakeOurs>> && Router<std::invoke_result_t<MakeBaseline>>
bool compare_routers(const std::string& label, int peers, MakeOurs make_ours, MakeBaseline make_baseline) {
  benchmark::RegisterBenchmark((label + "/ours").c_str(), [make_ours, peers](benchmark::State& state) {
    auto router = make_ours();
    user_bench_detail::decide(state, router, peers);
  });
  benchmark::RegisterBenchmark((label + "/baseline").c_str(), [make_baseline, peers](benchmark::State& state) {
    auto router = make_baseline();
    user_bench_detail::decide(state, router, peers);
  });
  return register_ratio({label, label + "/ours", label + "/baseline"});
}

}  // namespace swarm::bench
