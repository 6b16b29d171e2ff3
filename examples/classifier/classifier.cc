// A model of your own, in a project of your own: a 3-class classifier of 2-D
// points cut into two stage types (a residual tanh trunk, a softmax head),
// given every role and command of the `swarm` program by its plug-in:
//
//   classifier local --steps 150 --microbatch 16     # 2 stages x 2 peer processes
//   classifier peer --bootstrap HOST:PORT            # a peer of a swarm across machines
#include <cmath>
#include <random>

#include "apps/cli/main.h"
#include "kernels/cpu/cpu_backend.h"
#include "swarm/layers/layers.h"
#include "swarm/stages/variant_stage.h"

namespace L = swarm::layers;
using Cpu = L::HostOps<swarm::CpuBackend>;
using Trunk = L::Sequential<L::Linear<Cpu>, L::Tanh<Cpu>, L::Residual<L::Linear<Cpu>, L::Tanh<Cpu>>>;
using Head = L::Sequential<L::Linear<Cpu>, L::SoftmaxCrossEntropy<Cpu, L::ReportAccuracy>>;  // loss, accuracy

// Three Gaussian blobs: class c is centered at angle 2*pi*c/3.
struct Points {
  using data_source_concept = swarm::data_source_t;
  std::mt19937 rng;
  int rows = 16;
  swarm::Result<swarm::Microbatch> next() {
    swarm::Microbatch batch{*swarm::Tensor::empty({rows, 2}, swarm::DType::f32),
                            *swarm::Tensor::empty({rows}, swarm::DType::i32), rows};
    std::normal_distribution<float> noise(0.0f, 0.4f);
    for (int i = 0; i < rows; ++i) {
      const int c = static_cast<int>(rng() % 3);
      batch.targets.data<int32_t>()[i] = c;
      batch.inputs.data<float>()[2 * i] = std::cos(2.0944f * c) + noise(rng);
      batch.inputs.data<float>()[2 * i + 1] = std::sin(2.0944f * c) + noise(rng);
    }
    return batch;
  }
};

struct Classifier {
  using model_concept = swarm::cli::model_t;
  using Options = swarm::cli::NoOptions;
  using Stage = swarm::VariantStage<Trunk, Head>;
  static constexpr std::string_view name = "classifier";

  static swarm::Status prepare(Options&, int stages) {
    return stages == 2 ? swarm::Status::ok() : swarm::invalid_argument("the classifier has 2 stages, not {}", stages);
  }
  static swarm::Result<Stage> make_stage(const Options&, int stage, uint64_t seed) {
    if (stage == 0) return Stage(*Trunk::create(seed, {2, 16}, {}, {{16, 16}, {}}));
    return Stage(*Head::create(seed + 1, {16, 3}, {}));
  }
  static swarm::Result<swarm::cli::Data<Points>> data(const Options&, const swarm::cli::DataPlan& plan) {
    swarm::cli::Data<Points> data;
    for (int t = 0; t < plan.trainers; ++t) {
      data.sources.push_back({std::mt19937(plan.seed * 1000 + t + plan.start_step), plan.microbatch});
    }
    Points held_out{std::mt19937(12345), 64};
    for (int i = 0; i < 4; ++i) data.validation.push_back(*held_out.next());
    return data;
  }
};

int main(int argc, char** argv) { return swarm::cli::main<Classifier>(argc, argv); }
