// Which types model the Backend concept and its refinements
// (FusedResidualLayernormBackend, FusedMatmulGeluBackend, MaxoutBackend), and
// which do not.
#include <doctest/doctest.h>

#include "kernels/cpu/cpu_backend.h"
#include "swarm/api/backend.h"

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

// The fused ops, as plain functions over the CPU's types (no tags).
struct FusedResidualLayernormOps {
  static void residual_layernorm_forward(float* residual, float* out, float* mean, float* rstd, const float* a,
                                         const float* b, const float* weight, const float* bias, int N, int C,
                                         CpuStream) {}
};
struct FusedMatmulGeluOps {
  static void matmul_gelu_forward(float* out, float* pre_gelu, const float* inp, const float* weight,
                                  const float* bias, int N, int C, int OC, CpuStream) {}
  static void matmul_backward_dgelu(float* dpre, float* dweight, float* dbias, const float* dout,
                                    const float* inp, const float* weight, const float* pre_gelu, int N, int C,
                                    int OC, CpuStream) {}
};

// Tag and functions: models the refinement.
struct FusedBackend : CpuBackend, FusedResidualLayernormOps, FusedMatmulGeluOps {
  using fused_residual_layernorm_concept = fused_residual_layernorm_t;
  using fused_matmul_gelu_concept = fused_matmul_gelu_t;
};
struct OnlyResidualLayernorm : CpuBackend, FusedResidualLayernormOps {
  using fused_residual_layernorm_concept = fused_residual_layernorm_t;
};
struct OnlyMatmulGelu : CpuBackend, FusedMatmulGeluOps {
  using fused_matmul_gelu_concept = fused_matmul_gelu_t;
};

// The functions without the tags: a model must not pick them up.
struct UntaggedFused : CpuBackend, FusedResidualLayernormOps, FusedMatmulGeluOps {};

// The tags without the functions.
struct TaggedFusedWithoutOps : CpuBackend {
  using fused_residual_layernorm_concept = fused_residual_layernorm_t;
  using fused_matmul_gelu_concept = fused_matmul_gelu_t;
};

// Forward fused, backward missing: not a FusedMatmulGeluBackend.
struct MatmulGeluWithoutBackward : CpuBackend {
  using fused_matmul_gelu_concept = fused_matmul_gelu_t;
  static void matmul_gelu_forward(float*, float*, const float*, const float*, const float*, int, int, int,
                                  CpuStream) {}
};

// Each tag names its own refinement.
struct SwappedTags : CpuBackend, FusedResidualLayernormOps, FusedMatmulGeluOps {
  using fused_residual_layernorm_concept = fused_matmul_gelu_t;
  using fused_matmul_gelu_concept = fused_residual_layernorm_t;
};

// Tags and functions on a type that is not a backend.
struct FusedButNotABackend : FusedResidualLayernormOps, FusedMatmulGeluOps {
  using fused_residual_layernorm_concept = fused_residual_layernorm_t;
  using fused_matmul_gelu_concept = fused_matmul_gelu_t;
  using value_type = float;
  using stream_type = CpuStream;
};

static_assert(!FusedResidualLayernormBackend<CpuBackend>);
static_assert(!FusedMatmulGeluBackend<CpuBackend>);
static_assert(Backend<FusedBackend>);
static_assert(FusedResidualLayernormBackend<FusedBackend>);
static_assert(FusedMatmulGeluBackend<FusedBackend>);
static_assert(FusedResidualLayernormBackend<OnlyResidualLayernorm>);
static_assert(!FusedMatmulGeluBackend<OnlyResidualLayernorm>);
static_assert(FusedMatmulGeluBackend<OnlyMatmulGelu>);
static_assert(!FusedResidualLayernormBackend<OnlyMatmulGelu>);
static_assert(!FusedResidualLayernormBackend<UntaggedFused>);
static_assert(!FusedMatmulGeluBackend<UntaggedFused>);
static_assert(!FusedResidualLayernormBackend<TaggedFusedWithoutOps>);
static_assert(!FusedMatmulGeluBackend<TaggedFusedWithoutOps>);
static_assert(!FusedMatmulGeluBackend<MatmulGeluWithoutBackward>);
static_assert(!FusedResidualLayernormBackend<SwappedTags>);
static_assert(!FusedMatmulGeluBackend<SwappedTags>);
static_assert(!FusedResidualLayernormBackend<FusedButNotABackend>);
static_assert(!FusedMatmulGeluBackend<FusedButNotABackend>);

// Maxout: the CPU backend opts in (so do types derived from it). A wrong tag,
// hidden ops, or tag and ops on a type that is not a backend do not model it.
struct MaxoutWithWrongTag : CpuBackend {
  using maxout_concept = void;
};
struct MaxoutTaggedAsFused : CpuBackend {
  using maxout_concept = fused_matmul_gelu_t;
};
struct TaggedMaxoutWithoutOps : CpuBackend {  // the tag is inherited; the ops are hidden
  static void maxout_forward() {}
  static void maxout_backward() {}
};
struct MaxoutWithoutBackward : CpuBackend {
  static void maxout_backward() {}
};
struct MaxoutButNotABackend {
  using maxout_concept = maxout_t;
  using value_type = float;
  using stream_type = CpuStream;
  static void maxout_forward(float* out, const float* inp, int N, int C, int k, CpuStream) {}
  static void maxout_backward(float* dinp, const float* dout, const float* inp, int N, int C, int k, CpuStream) {}
};

static_assert(MaxoutBackend<CpuBackend>);
static_assert(MaxoutBackend<FusedBackend>);
static_assert(Backend<MaxoutWithWrongTag> && !MaxoutBackend<MaxoutWithWrongTag>);
static_assert(!MaxoutBackend<MaxoutTaggedAsFused>);
static_assert(Backend<TaggedMaxoutWithoutOps> && !MaxoutBackend<TaggedMaxoutWithoutOps>);
static_assert(Backend<MaxoutWithoutBackward> && !MaxoutBackend<MaxoutWithoutBackward>);
static_assert(!MaxoutBackend<MaxoutButNotABackend>);
static_assert(!MaxoutBackend<LooksLikeABackend>);
static_assert(!MaxoutBackend<int>);

// Model code picks the fused path by the refinement, never by probing for a member.
template <Backend B>
constexpr bool uses_fused_matmul_gelu() {
  return FusedMatmulGeluBackend<B>;
}

TEST_CASE("the CPU backend is a Backend on the CPU device, without fused ops") {
  CHECK(CpuBackend::device == Device::cpu);
  float x[4] = {1, 2, 3, 4};
  CpuBackend::fill_zero(x, 4, CpuStream{});
  CHECK(x[3] == 0.0f);
  CHECK_FALSE(uses_fused_matmul_gelu<CpuBackend>());
  CHECK_FALSE(uses_fused_matmul_gelu<UntaggedFused>());
  CHECK(uses_fused_matmul_gelu<FusedBackend>());
}

}  // namespace
}  // namespace swarm
