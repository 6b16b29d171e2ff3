// The train loss `local` ends its summary with. A time limit that stops a run
// mid-step leaves a last step of fewer microbatches; in the classifier's
// 12-second runs that step held one microbatch of 16 samples and read 0.353,
// against about 0.09 for the full steps before it.

#include "swarm/trainer/train_loss_span.h"

#include <doctest/doctest.h>

namespace {

swarm::StepReport step(int microbatches, std::optional<double> loss) {
  swarm::StepReport report;
  report.microbatches = microbatches;
  report.completed = loss ? microbatches : 0;
  report.loss = loss;
  return report;
}

}  // namespace

TEST_CASE("a last step cut short by a stop does not stand for the run's end") {
  swarm::TrainLossSpan span(4);
  span.add(step(4, 1.1));
  span.add(step(4, 0.09));
  span.add(step(1, 0.35));  // the time limit closed claims after one microbatch
  CHECK(span.first() == 1.1);
  CHECK(span.last() == 0.09);
}

TEST_CASE("a run of only cut or lossless steps still reports what it has") {
  swarm::TrainLossSpan span(4);
  CHECK(!span.first());
  CHECK(!span.last());
  span.add(step(4, std::nullopt));  // every microbatch abandoned
  CHECK(!span.last());
  span.add(step(2, 0.7));
  CHECK(span.first() == 0.7);
  CHECK(span.last() == 0.7);
  span.add(step(4, 0.5));
  span.add(step(3, 0.9));
  CHECK(span.last() == 0.5);
}
