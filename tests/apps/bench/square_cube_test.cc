// The square-cube experiment's measurement against its own prediction, on
// points small enough for a test: a peer's StageService over ZeroMQ, called
// through the netem transport. One point where compute bounds the stage, one
// where the link does, one with a real GPT stage; and the options' checks.
#include <doctest/doctest.h>

#include "apps/bench/square_cube.h"

namespace swarm::apps {
namespace {

// d 256, 128 tokens per microbatch, one layer: 654 MFLOP per microbatch, forward and backward.
SquareCubeOptions small_options(double flops_per_second) {
  SquareCubeOptions o;
  o.out = "unused";
  o.layers = 1;
  o.seq = 128;
  o.flops_per_second = flops_per_second;
  o.seconds_per_point = 1.5;
  return o;
}

PointSpec point(const char* codec_label, CodecId codec, bool real = false, int64_t d = 256) {
  return PointSpec{"width", d, 10, BoundaryVariant{codec_label, codec, 0}, real};
}

TEST_CASE("a stage whose compute outlasts its transfers is kept busy") {
  const SquareCubeOptions o = small_options(32.7e9);  // 20 ms per microbatch; 8-bit sends 98 KB up, 4 ms
  auto r = run_point(o, point("8bit", CodecId::blockwise8));
  REQUIRE(r.is_ok());
  CHECK(r->prediction.bound == "compute");
  CHECK(r->cost.compute_s() == doctest::Approx(0.02).epsilon(0.01).scale(0));
  CHECK(r->utilization > 0.8);
  CHECK(r->utilization <= 1.0);
  CHECK(r->microbatches >= 20);
  // Every byte crossed the client: exactly the frames the prediction counted.
  const double predicted_bytes = static_cast<double>(r->cost.forward_request_bytes + r->cost.backward_request_bytes +
                                                     r->cost.forward_reply_bytes + r->cost.backward_reply_bytes) /
                                 128.0;
  CHECK(r->wire_bytes_per_token == doctest::Approx(predicted_bytes).epsilon(0.001));
}

TEST_CASE("a stage behind a slow link idles as the model predicts") {
  const SquareCubeOptions o = small_options(327e9);  // 2 ms per microbatch; raw f32 sends 393 KB up, 15.7 ms
  auto r = run_point(o, point("none", CodecId::none));
  REQUIRE(r.is_ok());
  CHECK(r->prediction.bound == "uplink");
  CHECK(r->prediction.utilization == doctest::Approx(0.002 / 0.0157).epsilon(0.05).scale(0));
  CHECK(r->utilization == doctest::Approx(r->prediction.utilization).epsilon(0.25));
  CHECK(r->tokens_per_s == doctest::Approx(r->predicted_tokens_per_s).epsilon(0.25));
}

TEST_CASE("a real GPT stage on the CPU backend is measured and labelled real, with or without a bottleneck") {
  SquareCubeOptions o = small_options(25e12);
  o.seq = 32;
  o.seconds_per_point = 0.5;
  PointSpec bottlenecked = point("8bit+bottleneck4", CodecId::blockwise8, /*real=*/true, /*d=*/64);
  bottlenecked.variant.bottleneck_k = 4;
  auto narrow = run_point(o, bottlenecked);
  REQUIRE(narrow.is_ok());
  // 16 values per token cross, a quarter of d: 3 request tensors and 2 replies of 32 tokens.
  CHECK(narrow->cost.backward_request_bytes < 2 * 32 * 16 + 1024);
  auto r = run_point(o, point("fp16", CodecId::fp16, /*real=*/true, /*d=*/64));
  REQUIRE(r.is_ok());
  CHECK(r->spec.real_compute);
  CHECK(r->layers == o.real_layers);
  CHECK(r->busy_s > 0);
  CHECK(r->utilization > 0);
  CHECK(r->utilization <= 1.0);
  // The prediction's compute term is the run's own busy time per microbatch.
  CHECK(r->cost.compute_s() == doctest::Approx(r->busy_s / static_cast<double>(r->microbatches)).epsilon(0.01).scale(0));
}

TEST_CASE("bad options are refused with the flag's name") {
  SquareCubeOptions o;
  CHECK(validate(o).message().find("--out") != std::string::npos);
  o.out = "/tmp/x";
  CHECK(validate(o).is_ok());
  o.widths = {100};
  CHECK(validate(o).message().find("--widths") != std::string::npos);
  o.widths = {256};
  o.bottleneck_k = 3;
  CHECK(validate(o).message().find("--bottleneck-k") != std::string::npos);
  o.bottleneck_k = 4;
  o.latencies_ms = {-1};
  CHECK(validate(o).message().find("--latencies-ms") != std::string::npos);
  o.latencies_ms = {0};
  o.flops_per_second = 0;
  CHECK(validate(o).message().find("--flops") != std::string::npos);
}

TEST_CASE("the plan: every variant at every width, then the latency sweep at the largest, then the real points") {
  SquareCubeOptions o;
  o.widths = {256, 1024};
  o.latencies_ms = {0, 100};
  o.real_widths = {256};
  const std::vector<PointSpec> points = plan_points(o);
  REQUIRE(points.size() == 2 * 4 + 2 * 4 + 4);
  CHECK(points[4].d_model == 1024);
  CHECK(points[8].sweep == "latency");
  CHECK(points[8].d_model == 1024);
  CHECK(points[15].latency_ms == 100);
  CHECK(points.back().real_compute);
  CHECK(points.back().variant.bottleneck_k == 4);
}

}  // namespace
}  // namespace swarm::apps
