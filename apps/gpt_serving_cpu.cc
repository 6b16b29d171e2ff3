// A GPT peer on the CPU backend.
#include "apps/gpt_serving_impl.h"
#include "kernels/cpu/cpu_backend.h"

namespace swarm::apps {

int serve_gpt_cpu(const PeerServing& serving, const gpt::GptConfig& model) {
  return serve_gpt_on<CpuBackend>(serving, model, ComputeBackend::cpu_fp32);
}

}  // namespace swarm::apps
