// A 3-class classifier of 2-D points as two pipeline stages, written with
// swarm/layers: the whole model definition a user writes. Kept with the tests
// for now; it can move to examples/ as it is.
#pragma once

#include <cstdint>

#include "swarm/layers/layers.h"

namespace swarm::classifier {

namespace L = swarm::layers;

template <Backend B>
struct ClassifierStages {
  // 2 features -> 16 hidden features, with one residual block.
  using Trunk = L::Sequential<L::Linear<B>, L::Tanh<B>, L::Residual<L::Linear<B>, L::Tanh<B>>>;
  // 16 hidden features -> 3 class logits -> mean cross-entropy.
  using Head = L::Sequential<L::Linear<B>, L::SoftmaxCrossEntropy<B>>;

  static Result<Trunk> make_trunk(uint64_t seed, int hidden = 16) {
    return Trunk::create(seed, L::Linear<B>(2, hidden), L::Tanh<B>(),
                         L::Residual(L::Linear<B>(hidden, hidden), L::Tanh<B>()));
  }
  static Result<Head> make_head(uint64_t seed, int hidden = 16, int classes = 3) {
    return Head::create(seed, L::Linear<B>(hidden, classes), L::SoftmaxCrossEntropy<B>());
  }
};

}  // namespace swarm::classifier
