// Which types model the Backend concept, and which do not.
#include <doctest/doctest.h>

#include "kernels/cpu/cpu_backend.h"

namespace swarm {
namespace {

// Every member a backend needs, but no opt-in tag: not a backend.
struct LooksLikeABackend : CpuBackend {
  using backend_concept = void;
};

// Opted in, but missing the op set.
struct TaggedButEmpty {
  using backend_concept = backend_t;
  using stream_type = int;
  static constexpr Device device = Device::cpu;
};

// Claims a value type its ops do not take: not a backend.
struct WrongValueType : CpuBackend {
  using value_type = double;
};

static_assert(Backend<CpuBackend>);
static_assert(!Backend<WrongValueType>);
static_assert(!Backend<LooksLikeABackend>);
static_assert(!Backend<TaggedButEmpty>);
static_assert(!Backend<int>);

TEST_CASE("the CPU backend is a Backend on the CPU device") {
  CHECK(CpuBackend::device == Device::cpu);
  float x[4] = {1, 2, 3, 4};
  CpuBackend::fill_zero(x, 4, CpuStream{});
  CHECK(x[3] == 0.0f);
}

}  // namespace
}  // namespace swarm
