// A GPT peer on the three CUDA backends: compiled here without a GPU, run where
// one is (ensure_compute_device has checked it before the peer joined).
#include "apps/gpt_serving_impl.h"
#include "kernels/cuda/cuda_backend.h"

namespace swarm::apps {

int serve_gpt_cuda(ComputeBackend backend, const PeerServing& serving, const gpt::GptConfig& model) {
  switch (backend) {
    case ComputeBackend::cuda_fp32: return serve_gpt_on<CudaBackend>(serving, model, backend);
    case ComputeBackend::cuda_bf16: return serve_gpt_on<CudaBf16Backend>(serving, model, backend);
    case ComputeBackend::cuda_bf16_cudnn: return serve_gpt_on<CudaBf16CudnnBackend>(serving, model, backend);
    case ComputeBackend::cpu_fp32: break;
  }
  fmt::print(stderr, "swarm peer: {} is not a CUDA backend\n", describe(backend));
  return 1;
}

}  // namespace swarm::apps
