// The square-cube prediction: which server bounds a stage, what the in-flight
// count must be to cover the link, and the law itself (utilization ∝ d while
// the link bounds, since compute grows as d² and bytes as d).
#include <doctest/doctest.h>

#include "apps/bench/square_cube_model.h"

namespace swarm::apps {
namespace {

// A stage of width d: compute ∝ d², each tensor d values per token.
MicrobatchCost stage_of_width(double d, double seconds_per_d2, uint64_t bytes_per_d) {
  const auto tensor = static_cast<uint64_t>(d) * bytes_per_d;
  return {.forward_compute_s = seconds_per_d2 * d * d / 3,
          .backward_compute_s = 2 * seconds_per_d2 * d * d / 3,
          .forward_request_bytes = tensor,
          .forward_reply_bytes = tensor,
          .backward_request_bytes = 2 * tensor,
          .backward_reply_bytes = tensor};
}

TEST_CASE("the slowest of uplink, compute and downlink bounds the stage") {
  const LinkParams link{1e6, 0.01};
  MicrobatchCost cost{.forward_compute_s = 0.1, .backward_compute_s = 0.2, .forward_request_bytes = 50'000,
                      .forward_reply_bytes = 50'000, .backward_request_bytes = 100'000, .backward_reply_bytes = 50'000};
  Prediction p = predict(cost, link, 100);
  CHECK(p.bound == "compute");
  CHECK(p.microbatches_per_s == doctest::Approx(1 / 0.3));
  CHECK(p.utilization == doctest::Approx(1.0).scale(0));

  cost.backward_request_bytes = 2'000'000;  // 2.05 s up per microbatch
  p = predict(cost, link, 100);
  CHECK(p.bound == "uplink");
  CHECK(p.microbatches_per_s == doctest::Approx(1 / 2.05).scale(0));
  CHECK(p.utilization == doctest::Approx(0.3 / 2.05).scale(0));

  cost.backward_request_bytes = 100'000;
  cost.forward_reply_bytes = 1'000'000;
  CHECK(predict(cost, link, 100).bound == "downlink");
}

TEST_CASE("too few microbatches in flight leave every server idle part of the round") {
  const LinkParams link{1e6, 0.1};
  const MicrobatchCost cost{.forward_compute_s = 0.05, .backward_compute_s = 0.1, .forward_request_bytes = 10'000,
                            .forward_reply_bytes = 10'000, .backward_request_bytes = 20'000, .backward_reply_bytes = 10'000};
  const double round = 0.03 + 0.02 + 0.4 + 0.15;
  CHECK(round_seconds(cost, link) == doctest::Approx(round).scale(0));
  const Prediction one = predict(cost, link, 1);
  CHECK(one.bound == "in-flight");
  CHECK(one.microbatches_per_s == doctest::Approx(1 / round).scale(0));
  CHECK(one.utilization == doctest::Approx(0.15 / round).scale(0));
  const int k = in_flight_to_cover(cost, link);
  CHECK(predict(cost, link, k).bound == "compute");
  CHECK(k >= 5);                                       // a quarter more than the 4 a round holds, plus 2
  CHECK(predict(cost, link, 3).bound == "in-flight");
}

TEST_CASE("square-cube law: while the link bounds, utilization doubles with d; then it saturates") {
  const LinkParams link{25e6, 0.05};
  double previous = 0;
  for (double d : {256.0, 512.0, 1024.0}) {
    const MicrobatchCost cost = stage_of_width(d, 1e-9, 512);
    const Prediction p = predict(cost, link, in_flight_to_cover(cost, link));
    CAPTURE(d);
    CHECK(p.bound == "uplink");
    if (previous > 0) CHECK(p.utilization == doctest::Approx(2 * previous).scale(0));
    previous = p.utilization;
  }
  const MicrobatchCost wide = stage_of_width(65536, 1e-9, 512);
  const Prediction saturated = predict(wide, link, in_flight_to_cover(wide, link));
  CHECK(saturated.bound == "compute");
  CHECK(saturated.utilization == doctest::Approx(1.0).scale(0));
}

TEST_CASE("an unlimited link costs only latency; a zero-cost microbatch predicts nothing") {
  const MicrobatchCost cost{.forward_compute_s = 0.1, .backward_compute_s = 0.2, .forward_request_bytes = 1 << 30};
  CHECK(uplink_seconds(cost, LinkParams{0, 0.05}) == 0);
  CHECK(predict(cost, LinkParams{0, 0}, 1).utilization == doctest::Approx(1.0).scale(0));
  const Prediction none = predict(MicrobatchCost{}, LinkParams{0, 0}, 4);
  CHECK(none.microbatches_per_s == 0);
  CHECK(none.utilization == 0);
  CHECK(in_flight_to_cover(MicrobatchCost{}, LinkParams{0, 0}) >= 1);
}

TEST_CASE("FLOPs per token: 24 d² for the dense layers and 4 T d for attention, per layer") {
  CHECK(gpt_block_forward_flops_per_token(768, 1024, 12) == doctest::Approx(12 * (24.0 * 768 * 768 + 4.0 * 1024 * 768)));
  CHECK(gpt_block_forward_flops_per_token(4096, 512, 1) == doctest::Approx(24.0 * 4096 * 4096 + 4.0 * 512 * 4096));
  CHECK(projection_forward_flops_per_token(4096, 4) == doctest::Approx(2.0 * 4096 * 1024));
}

}  // namespace
}  // namespace swarm::apps
