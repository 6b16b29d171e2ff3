#include "swarm/optim/lr_schedule.h"

#include <limits>

#include <doctest/doctest.h>

namespace swarm::optim {
namespace {

TEST_CASE("warm-up rises linearly from peak/warmup to the peak at warmup_steps") {
  LrSchedule s{.peak_lr = 1e-3f, .warmup_steps = 10, .total_steps = 110};
  REQUIRE(s.validate().is_ok());
  CHECK(s.lr_at(1) == doctest::Approx(1e-4).scale(0));
  CHECK(s.lr_at(5) == doctest::Approx(5e-4).scale(0));
  CHECK(s.lr_at(10) == doctest::Approx(1e-3).scale(0));
  for (int64_t step = 2; step <= 10; ++step) {
    CHECK(s.lr_at(step) - s.lr_at(step - 1) == doctest::Approx(1e-4).epsilon(1e-4).scale(0));
  }
  CHECK(s.lr_at(0) == s.lr_at(1));  // no zero-lr step before the first one
}

TEST_CASE("decay reaches the final fraction at total_steps, monotonically, and stays there") {
  for (auto decay : {LrSchedule::Decay::linear, LrSchedule::Decay::cosine}) {
    LrSchedule s{.peak_lr = 2e-3f, .warmup_steps = 10, .total_steps = 110, .final_lr_fraction = 0.1f,
                 .decay = decay};
    REQUIRE(s.validate().is_ok());
    CHECK(s.lr_at(110) == doctest::Approx(2e-4).scale(0));
    CHECK(s.lr_at(111) == doctest::Approx(2e-4).scale(0));
    CHECK(s.lr_at(1'000'000) == doctest::Approx(2e-4).scale(0));
    for (int64_t step = 11; step <= 110; ++step) CHECK(s.lr_at(step) < s.lr_at(step - 1));
    // Halfway both shapes sit at the mean of peak and floor.
    CHECK(s.lr_at(60) == doctest::Approx(1.1e-3).scale(0));
  }
  LrSchedule linear{.peak_lr = 1.0f, .warmup_steps = 0, .total_steps = 100, .final_lr_fraction = 0.0f,
                    .decay = LrSchedule::Decay::linear};
  CHECK(linear.lr_at(25) == doctest::Approx(0.75).scale(0));
  LrSchedule cosine = linear;
  cosine.decay = LrSchedule::Decay::cosine;
  CHECK(cosine.lr_at(25) == doctest::Approx(0.5 * (1.0 + 0.70710678)).scale(0));
}

TEST_CASE("total_steps 0 means no decay; the default schedule is a constant peak") {
  LrSchedule constant;
  REQUIRE(constant.validate().is_ok());
  CHECK(constant.lr_at(1) == 1e-3f);
  CHECK(constant.lr_at(1'000'000) == 1e-3f);
  LrSchedule warm{.peak_lr = 1.0f, .warmup_steps = 4};
  CHECK(warm.lr_at(2) == 0.5f);
  CHECK(warm.lr_at(100) == 1.0f);
}

TEST_CASE("validate rejects negative and inconsistent values") {
  auto rejected = [](LrSchedule s) {
    return s.validate().code() == StatusCode::invalid_argument;
  };
  CHECK(rejected({.peak_lr = -1e-3f}));
  CHECK(rejected({.peak_lr = std::numeric_limits<float>::infinity()}));
  CHECK(rejected({.warmup_steps = -1}));
  CHECK(rejected({.total_steps = -5}));
  CHECK(rejected({.warmup_steps = 100, .total_steps = 50}));
  CHECK(rejected({.warmup_steps = 100, .total_steps = 100}));
  CHECK(rejected({.total_steps = 10, .final_lr_fraction = 1.5f}));
  CHECK(rejected({.total_steps = 10, .final_lr_fraction = -0.1f}));
  CHECK(rejected({.decay = static_cast<LrSchedule::Decay>(7)}));
  CHECK(LrSchedule{.warmup_steps = 100, .total_steps = 101}.validate().is_ok());
}

}  // namespace
}  // namespace swarm::optim
