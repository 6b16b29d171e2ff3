// Which types model the Stage concept and its refinements (CachingStage,
// BackwardAfterForwardStage), and which do not.
#include <doctest/doctest.h>

#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "models/gpt/gpt_stage.h"
#include "models/mlp/mlp_stage.h"
#include "swarm/api/stage.h"

namespace swarm {
namespace {

// The members a stage needs, with no opt-in tag.
struct StageMembers {
  Result<Tensor> forward(const TensorView&, const TensorView*) { return invalid_argument("fake"); }
  Result<Tensor> backward(const TensorView&, const TensorView&, const TensorView*) {
    return invalid_argument("fake");
  }
  std::vector<StageParameterView> parameter_views() { return {}; }
  Status zero_grad() { return Status::ok(); }
  bool takes_targets() const { return false; }
  StageIoSpec io_spec() const { return {}; }
};

// Every member a stage needs, but no opt-in tag: not a stage.
struct LooksLikeAStage : StageMembers {};

struct WrongTag : StageMembers {
  using stage_concept = void;
};

// The smallest stage: the tag and the members.
struct MinimalStage : StageMembers {
  using stage_concept = stage_t;
};

// Opted in, but cannot run backward.
struct TaggedWithoutBackward {
  using stage_concept = stage_t;
  Result<Tensor> forward(const TensorView&, const TensorView*) { return invalid_argument("fake"); }
  std::vector<StageParameterView> parameter_views() { return {}; }
  Status zero_grad() { return Status::ok(); }
  bool takes_targets() const { return false; }
  StageIoSpec io_spec() const { return {}; }
};

// Opted in, but declares no input/output specs for the wire to check requests against.
struct TaggedWithoutIoSpec {
  using stage_concept = stage_t;
  Result<Tensor> forward(const TensorView&, const TensorView*) { return invalid_argument("fake"); }
  Result<Tensor> backward(const TensorView&, const TensorView&, const TensorView*) {
    return invalid_argument("fake");
  }
  std::vector<StageParameterView> parameter_views() { return {}; }
  Status zero_grad() { return Status::ok(); }
  bool takes_targets() const { return false; }
};

// Opted in, but forward cannot fail: the runtime needs a Result.
struct ForwardReturnsTensor : MinimalStage {
  Tensor forward(const TensorView&, const TensorView*) { return {}; }
};

// takes_targets() must be callable on a const stage.
struct NonConstTakesTargets : StageMembers {
  using stage_concept = stage_t;
  bool takes_targets() { return false; }
};

static_assert(Stage<MinimalStage>);
static_assert(Stage<mlp::MlpStage>);
static_assert(Stage<gpt::GptStage<CpuBackend>>);
static_assert(!Stage<LooksLikeAStage>);
static_assert(!Stage<WrongTag>);
static_assert(!Stage<TaggedWithoutBackward>);
static_assert(!Stage<TaggedWithoutIoSpec>);
static_assert(!Stage<ForwardReturnsTensor>);
static_assert(!Stage<NonConstTakesTargets>);
static_assert(!Stage<int>);

// CachingStage: the tag, the member and a Stage.

struct CountsDrops {
  int drops = 0;
  void drop_cached_activations() { ++drops; }
};

struct CachingFake : MinimalStage, CountsDrops {
  using caching_stage_concept = caching_stage_t;
};

// The member without the tag: the runtime must not call it.
struct UntaggedCache : MinimalStage, CountsDrops {};

// The tag without the member.
struct TaggedCacheWithoutMember : MinimalStage {
  using caching_stage_concept = caching_stage_t;
};

// Tag and member on a type that is not a stage.
struct CacheButNotAStage : StageMembers, CountsDrops {
  using caching_stage_concept = caching_stage_t;
};

static_assert(CachingStage<gpt::GptStage<CpuBackend>>);
static_assert(CachingStage<CachingFake>);
static_assert(!CachingStage<mlp::MlpStage>);
static_assert(!CachingStage<MinimalStage>);
static_assert(!CachingStage<UntaggedCache>);
static_assert(!CachingStage<TaggedCacheWithoutMember>);
static_assert(!CachingStage<CacheButNotAStage>);

// BackwardAfterForwardStage: the tag, the member and a Stage.

struct BackwardAfterForwardMember {
  Result<Tensor> backward_after_forward(const TensorView&) { return invalid_argument("fake"); }
};

struct BackwardAfterForwardFake : MinimalStage, BackwardAfterForwardMember {
  using backward_after_forward_concept = backward_after_forward_stage_t;
};

struct UntaggedBackwardAfterForward : MinimalStage, BackwardAfterForwardMember {};

struct TaggedBackwardAfterForwardWithoutMember : MinimalStage {
  using backward_after_forward_concept = backward_after_forward_stage_t;
};

// The other refinement's tag does not stand in for this one.
struct BackwardAfterForwardWithCachingTag : MinimalStage, BackwardAfterForwardMember {
  using backward_after_forward_concept = caching_stage_t;
};

struct BackwardAfterForwardButNotAStage : StageMembers, BackwardAfterForwardMember {
  using backward_after_forward_concept = backward_after_forward_stage_t;
};

static_assert(BackwardAfterForwardStage<gpt::GptStage<CpuBackend>>);
static_assert(BackwardAfterForwardStage<BackwardAfterForwardFake>);
static_assert(!BackwardAfterForwardStage<mlp::MlpStage>);
static_assert(!BackwardAfterForwardStage<MinimalStage>);
static_assert(!BackwardAfterForwardStage<UntaggedBackwardAfterForward>);
static_assert(!BackwardAfterForwardStage<TaggedBackwardAfterForwardWithoutMember>);
static_assert(!BackwardAfterForwardStage<BackwardAfterForwardWithCachingTag>);
static_assert(!BackwardAfterForwardStage<BackwardAfterForwardButNotAStage>);
// The two refinements are independent.
static_assert(!CachingStage<BackwardAfterForwardFake>);
static_assert(!BackwardAfterForwardStage<CachingFake>);

TEST_CASE("drop_cached_activations calls the member only on a CachingStage") {
  CachingFake caching;
  drop_cached_activations(caching);
  CHECK(caching.drops == 1);

  // Same-named member, no tag: not a capability, so left alone.
  UntaggedCache untagged;
  drop_cached_activations(untagged);
  CHECK(untagged.drops == 0);

  MinimalStage plain;
  drop_cached_activations(plain);  // compiles, does nothing
}

}  // namespace
}  // namespace swarm
