// The classifier of classifier.cc through the library alone (no program): 2-D
// points cut into two stage types, checked, then trained by a swarm of one peer
// per stage over the in-process transport. Exits 1 if the loss does not fall.
#include <cmath>
#include <cstdio>
#include <random>

#include "kernels/cpu/cpu_backend.h"
#include "swarm/swarm.h"
#include "transports/inproc/inproc_transport.h"

namespace L = swarm::layers;
using Cpu = L::HostOps<swarm::CpuBackend>;
using Trunk = L::Sequential<L::Linear<Cpu>, L::Tanh<Cpu>, L::Residual<L::Linear<Cpu>, L::Tanh<Cpu>>>;
using Head = L::Sequential<L::Linear<Cpu>, L::SoftmaxCrossEntropy<Cpu>>;
template <typename S>
using PeerOf = swarm::Peer<S, swarm::InprocTransport, swarm::InProcessRegistry, swarm::compression::StandardCodecs>;
using Trainer = swarm::Trainer<swarm::StochasticWiringRouter, swarm::InprocTransport, swarm::InProcessRegistry,
                               swarm::compression::StandardCodecs>;

// Three Gaussian blobs: class c is centered at angle 2*pi*c/3.
struct Points {
  using data_source_concept = swarm::data_source_t;
  std::mt19937 rng{7};
  swarm::Result<swarm::Microbatch> next() {
    swarm::Microbatch batch{*swarm::Tensor::empty({16, 2}, swarm::DType::f32),
                            *swarm::Tensor::empty({16}, swarm::DType::i32), 16};
    std::normal_distribution<float> noise(0.0f, 0.4f);
    for (int i = 0; i < 16; ++i) {
      const int c = static_cast<int>(rng() % 3);
      batch.targets.data<int32_t>()[i] = c;
      batch.inputs.data<float>()[2 * i] = std::cos(2.0944f * c) + noise(rng);
      batch.inputs.data<float>()[2 * i + 1] = std::sin(2.0944f * c) + noise(rng);
    }
    return batch;
  }
};

swarm::PeerConfig peer_config(int stage) {
  swarm::PeerConfig config;
  config.stage_index = stage;
  config.peer_id = "stage" + std::to_string(stage);
  config.bind_address = "inproc://" + config.peer_id;
  config.learning_rate = 1e-2f;
  config.step_every_samples = 64;
  return config;
}

int main() {
  auto trunk = *Trunk::create(1, {2, 16}, {}, {{16, 16}, {}});
  auto head = *Head::create(2, {16, 3}, {});
  auto sample = *Points().next();
  auto checked = swarm::testing::check_stage(trunk, sample.inputs);
  auto checked_head = swarm::testing::check_stage(head, *trunk.forward(sample.inputs, nullptr), sample.targets);
  if (!checked.ok() || !checked_head.ok()) return std::puts((checked.to_string() + checked_head.to_string()).c_str()), 1;

  swarm::InProcessRegistry registry;
  PeerOf<Trunk> first(peer_config(0), std::move(trunk), &registry);
  PeerOf<Head> second(peer_config(1), std::move(head), &registry);
  if (!first.start().is_ok() || !second.start().is_ok()) return 1;
  swarm::TrainerConfig trainer_config;
  trainer_config.num_stages = 2;
  Trainer trainer(trainer_config, std::vector<swarm::StochasticWiringRouter>(2), &registry);
  if (auto fits = trainer.check_stages(); !fits.is_ok()) return std::puts(fits.to_string().c_str()), 1;

  std::vector<double> losses;
  swarm::TrainingLoopOptions options{.last_step = 150, .microbatches_per_step = 4, .in_flight = 4};
  swarm::TrainingLoop<Trainer, Points> loop({&trainer}, std::vector<Points>(1), options,
                                            [&](const swarm::StepReport& r) { losses.push_back(r.loss.value_or(NAN)); });
  auto summary = loop.run();
  if (!summary.is_ok() || losses.size() != 150) return 1;
  std::printf("loss %.3f at step 1, %.3f at step 150; %lld microbatches, %lld abandoned\n", losses.front(),
              losses.back(), static_cast<long long>(summary->ledger.completed),
              static_cast<long long>(summary->ledger.abandoned));
  return losses.back() < 0.3 * losses.front() && summary->ledger.abandoned == 0 ? 0 : 1;
}
