// AnyStage holds a stage of any type behind one type: every call of the Stage
// concept reaches the stage it holds, with the same results, so that the Peer the
// program compiles once over it serves every model's stages as they are.
#include <memory>
#include <random>

#include <doctest/doctest.h>

#include "kernels/cpu/cpu_backend.h"
#include "swarm/layers/layers.h"
#include "swarm/stages/any_stage.h"
#include "swarm/testing/stage_check.h"

namespace swarm {
namespace {

namespace L = layers;
using Cpu = L::HostOps<CpuBackend>;
using Trunk = L::Sequential<L::Linear<Cpu>, L::Tanh<Cpu>>;
using Head = L::Sequential<L::Linear<Cpu>, L::SoftmaxCrossEntropy<Cpu>>;

static_assert(Stage<AnyStage>);
static_assert(CachingStage<AnyStage>);
static_assert(!BackwardAfterForwardStage<AnyStage>);
static_assert(std::constructible_from<AnyStage, Trunk>);
static_assert(!std::constructible_from<AnyStage, int>);
static_assert(!std::convertible_to<Trunk, AnyStage>);  // explicit: no stage turns into another type by accident
static_assert(std::movable<AnyStage>);

// A trunk that counts the times it is told to forget its activations.
struct CountingCache : Trunk {
  using caching_stage_concept = caching_stage_t;
  explicit CountingCache(Trunk trunk, std::shared_ptr<int> drops) : Trunk(std::move(trunk)), drops(std::move(drops)) {}
  void drop_cached_activations() { ++*drops; }
  std::shared_ptr<int> drops;
};
static_assert(CachingStage<CountingCache>);

Tensor points(std::mt19937& rng, int rows) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  Tensor x = *Tensor::empty(Shape{rows, 2}, DType::f32);
  for (int i = 0; i < 2 * rows; ++i) x.data<float>()[i] = uniform(rng);
  return x;
}

TEST_CASE("a stage behind AnyStage computes what it computes alone, bit for bit") {
  std::mt19937 rng(5);
  const Tensor x = points(rng, 8);
  Trunk alone = *Trunk::create(1, {2, 8}, {});
  AnyStage held(*Trunk::create(1, {2, 8}, {}));
  CHECK(held.io_spec().output == alone.io_spec().output);
  CHECK_FALSE(held.takes_targets());
  const Tensor out = *held.forward(x, nullptr);
  CHECK(bitwise_equal(out, *alone.forward(x, nullptr)));
  Tensor grad_output = *Tensor::empty(out.shape(), DType::f32);
  for (float& g : grad_output.span<float>()) g = 0.5f;
  CHECK(bitwise_equal(*held.backward(x, grad_output, nullptr), *alone.backward(x, grad_output, nullptr)));
  // The parameter gradients accumulated in the stage held, where an optimizer finds them.
  auto held_views = held.parameter_views();
  auto alone_views = alone.parameter_views();
  REQUIRE(held_views.size() == alone_views.size());
  for (size_t i = 0; i < held_views.size(); ++i) CHECK(bitwise_equal(held_views[i].grad, alone_views[i].grad));
  CHECK(held.zero_grad().is_ok());
  for (const auto& view : held.parameter_views()) {
    const float* grad = view.grad.data<float>();
    for (int64_t i = 0; i < view.grad.numel(); ++i) CHECK(grad[i] == 0.0f);
  }
  CHECK(held.get_if<Trunk>() != nullptr);
  CHECK(held.get_if<Head>() == nullptr);
}

TEST_CASE("AnyStage passes the stage checker as a trunk and as a loss stage") {
  std::mt19937 rng(6);
  const Tensor x = points(rng, 8);
  AnyStage trunk(*Trunk::create(1, {2, 8}, {}));
  auto checked = testing::check_stage(trunk, x);
  CHECK_MESSAGE(checked.ok(), checked.to_string());
  AnyStage head(*Head::create(2, {2, 3}, {}));
  CHECK(head.takes_targets());
  Tensor y = *Tensor::empty(Shape{8}, DType::i32);
  for (int i = 0; i < 8; ++i) y.data<int32_t>()[i] = i % 3;
  checked = testing::check_stage(head, x, y);
  CHECK_MESSAGE(checked.ok(), checked.to_string());
}

TEST_CASE("AnyStage tells a caching stage to forget, and a stage that keeps nothing is left alone") {
  auto drops = std::make_shared<int>(0);
  AnyStage caching(CountingCache(*Trunk::create(1, {2, 8}, {}), drops));
  caching.drop_cached_activations();
  caching.drop_cached_activations();
  CHECK(*drops == 2);
  AnyStage plain(*Trunk::create(1, {2, 8}, {}));
  plain.drop_cached_activations();  // compiles and does nothing: Trunk keeps no activations
  CHECK(*drops == 2);
}

}  // namespace
}  // namespace swarm
