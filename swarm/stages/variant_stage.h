// variant_stage: one stage type for a model whose stages have different types.
//
// A Peer is a template over one stage type, and a peer that rebalances builds
// whichever stage the swarm needs from its StageFactory<S>, so every stage of a
// model must have that one type S. A model cut into a trunk of one type and a
// head of another serves both through VariantStage<Trunk, Head>: it holds one of
// them and forwards every call of the Stage concept to it.
//
//   using AnyStage = swarm::VariantStage<Trunk, Head>;
//   swarm::StageFactory<AnyStage> make = [](int index) -> swarm::Result<AnyStage> {
//     if (index == 0) return AnyStage(*Trunk::create(...));
//     return AnyStage(*Head::create(...));
//   };
//
// It always opts in as a CachingStage (forgetting activations is a no-op for an
// alternative that keeps none); it does not offer backward_after_forward, so a
// loss stage in it recomputes its forward for the backward.
#pragma once

#include <utility>
#include <variant>
#include <vector>

#include "swarm/api/stage.h"

namespace swarm {

template <Stage... Alternatives>
class VariantStage {
 public:
  using stage_concept = stage_t;
  using caching_stage_concept = caching_stage_t;

  template <typename S>
    requires(std::same_as<S, Alternatives> || ...)
  VariantStage(S stage) : held_(std::move(stage)) {}  // NOLINT: implicit, as a variant's

  bool takes_targets() const {
    return std::visit([](const auto& s) { return s.takes_targets(); }, held_);
  }
  StageIoSpec io_spec() const {
    return std::visit([](const auto& s) { return s.io_spec(); }, held_);
  }
  Result<Tensor> forward(const TensorView& input, const TensorView* targets) {
    return std::visit([&](auto& s) { return s.forward(input, targets); }, held_);
  }
  Result<Tensor> backward(const TensorView& input, const TensorView& grad_output, const TensorView* targets) {
    return std::visit([&](auto& s) { return s.backward(input, grad_output, targets); }, held_);
  }
  std::vector<StageParameterView> parameter_views() {
    return std::visit([](auto& s) { return s.parameter_views(); }, held_);
  }
  Status zero_grad() {
    return std::visit([](auto& s) { return s.zero_grad(); }, held_);
  }
  void drop_cached_activations() {
    std::visit([](auto& s) { swarm::drop_cached_activations(s); }, held_);
  }

  // The alternative held, for code that knows the model.
  template <typename S>
  S* get_if() {
    return std::get_if<S>(&held_);
  }

 private:
  std::variant<Alternatives...> held_;
};

}  // namespace swarm
