// Which types model ParameterUpdater, and which do not.
#include <doctest/doctest.h>

#include "swarm/api/updater.h"
#include "swarm/optim/host_updater.h"

namespace swarm {
namespace {

// Every member an updater needs, but no opt-in tag: not an updater.
struct UntaggedUpdater {
  static constexpr Device device = Device::cpu;
  Status step(std::span<const StageParameterView>, float);
  Status step_with_gradients(std::span<const StageParameterView>, std::span<const float>, float);
  int64_t steps_taken() const;
  Result<OptimizerState> export_state() const;
  Status import_state(const OptimizerState&);
};

// The same members and the tag: an updater (the control for the cases below).
struct TaggedUpdater : UntaggedUpdater {
  using updater_concept = updater_t;
};

// An export that cannot fail is not enough: a device copy can.
struct InfallibleExport : TaggedUpdater {
  OptimizerState export_state() const;
};

struct NoDevice {
  using updater_concept = updater_t;
  Status step(std::span<const StageParameterView>, float);
  Status step_with_gradients(std::span<const StageParameterView>, std::span<const float>, float);
  int64_t steps_taken() const;
  Result<OptimizerState> export_state() const;
  Status import_state(const OptimizerState&);
};

struct NoHostGradientStep : TaggedUpdater {
  void step_with_gradients() = delete;
};

static_assert(ParameterUpdater<optim::HostUpdater>);
static_assert(optim::HostUpdater::device == Device::cpu);
static_assert(ParameterUpdater<TaggedUpdater>);
static_assert(!ParameterUpdater<UntaggedUpdater>);
static_assert(!ParameterUpdater<InfallibleExport>);
static_assert(!ParameterUpdater<NoDevice>);
static_assert(!ParameterUpdater<NoHostGradientStep>);

TEST_CASE("the ParameterUpdater checks above compiled") { CHECK(ParameterUpdater<optim::HostUpdater>); }

}  // namespace
}  // namespace swarm
