// layers: build a pipeline stage from layers instead of writing its forward and
// backward by hand.
//
//   #include "swarm/layers/layers.h"
//   namespace L = swarm::layers;
//   using Cpu = L::HostOps<swarm::CpuBackend>;  // CpuBackend plus tanh and MSE
//
//   using Trunk = L::Sequential<L::Linear<Cpu>, L::Tanh<Cpu>, L::Residual<L::Linear<Cpu>, L::Tanh<Cpu>>>;
//   using Head = L::Sequential<L::Linear<Cpu>, L::SoftmaxCrossEntropy<Cpu>>;
//   static_assert(swarm::Stage<Trunk> && swarm::Stage<Head>);
//
//   auto trunk = Trunk::create(seed, L::Linear<Cpu>(2, 16), L::Tanh<Cpu>(),
//                              L::Residual(L::Linear<Cpu>(16, 16), L::Tanh<Cpu>()));
//   auto head = Head::create(seed + 1, L::Linear<Cpu>(16, 3), L::SoftmaxCrossEntropy<Cpu>());
//
// Layers: Linear, LayerNorm, Gelu, Tanh, Residual, Embedding; losses:
// SoftmaxCrossEntropy, MeanSquaredError. A Sequential stage passes a batch of
// vectors, [batch, features]; a SequenceSequential a batch of sequences,
// [batch, positions, features], and only it may start with an Embedding of
// tokens [batch, positions]. See sequential.h for the shapes, each layer's
// header for its own.
#pragma once

#include "swarm/layers/activation.h"
#include "swarm/layers/backend_ops.h"
#include "swarm/layers/chain.h"
#include "swarm/layers/embedding.h"
#include "swarm/layers/host_ops.h"
#include "swarm/layers/layer.h"
#include "swarm/layers/linear.h"
#include "swarm/layers/loss.h"
#include "swarm/layers/norm.h"
#include "swarm/layers/residual.h"
#include "swarm/layers/sequential.h"
