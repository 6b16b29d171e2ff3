// any_stage: a stage of any type behind one type, so that code over stages (a
// Peer, its serving loop) compiles once, in the library, for every model.
//
// A Peer<S, ...> is a template over its stage type; instantiated for a user's own
// stage it is most of what a model's program compiles, again after every edit of
// the stage. Behind AnyStage the Peer is compiled once (apps/any_stage_serving.cc)
// and an edit rebuilds only the user's code. The price is one indirect call per
// forward, backward or parameter listing, small beside the stage's own compute.
//
//   swarm::AnyStage stage(MyStage::create(...).value());
//
// Like VariantStage, it always opts in as a CachingStage (forgetting activations
// is a no-op for a stage that keeps none) and does not offer backward_after_forward:
// a loss stage behind it recomputes its forward for the backward.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "swarm/api/stage.h"

namespace swarm {

class AnyStage {
 public:
  using stage_concept = stage_t;
  using caching_stage_concept = caching_stage_t;

  template <Stage S>
    requires(!std::same_as<std::remove_cvref_t<S>, AnyStage>)
  explicit AnyStage(S stage) : held_(std::make_unique<Held<S>>(std::move(stage))) {}

  bool takes_targets() const { return held_->takes_targets(); }
  StageIoSpec io_spec() const { return held_->io_spec(); }
  Result<Tensor> forward(const TensorView& input, const TensorView* targets) {
    return held_->forward(input, targets);
  }
  Result<Tensor> backward(const TensorView& input, const TensorView& grad_output, const TensorView* targets) {
    return held_->backward(input, grad_output, targets);
  }
  std::vector<StageParameterView> parameter_views() { return held_->parameter_views(); }
  Status zero_grad() { return held_->zero_grad(); }
  void drop_cached_activations() { held_->drop_cached_activations(); }

  // The stage held, for code that knows its type; null for another type.
  template <Stage S>
  S* get_if() {
    auto* held = dynamic_cast<Held<S>*>(held_.get());
    return held ? &held->stage : nullptr;
  }

 private:
  struct Interface {
    virtual ~Interface() = default;
    virtual bool takes_targets() const = 0;
    virtual StageIoSpec io_spec() const = 0;
    virtual Result<Tensor> forward(const TensorView& input, const TensorView* targets) = 0;
    virtual Result<Tensor> backward(const TensorView& input, const TensorView& grad_output,
                                    const TensorView* targets) = 0;
    virtual std::vector<StageParameterView> parameter_views() = 0;
    virtual Status zero_grad() = 0;
    virtual void drop_cached_activations() = 0;
  };

  template <Stage S>
  struct Held final : Interface {
    explicit Held(S held) : stage(std::move(held)) {}
    bool takes_targets() const override { return stage.takes_targets(); }
    StageIoSpec io_spec() const override { return stage.io_spec(); }
    Result<Tensor> forward(const TensorView& input, const TensorView* targets) override {
      return stage.forward(input, targets);
    }
    Result<Tensor> backward(const TensorView& input, const TensorView& grad_output,
                            const TensorView* targets) override {
      return stage.backward(input, grad_output, targets);
    }
    std::vector<StageParameterView> parameter_views() override { return stage.parameter_views(); }
    Status zero_grad() override { return stage.zero_grad(); }
    void drop_cached_activations() override { swarm::drop_cached_activations(stage); }
    S stage;
  };

  std::unique_ptr<Interface> held_;
};

}  // namespace swarm
