// swarm train on the three CUDA backends: compiled here without a GPU, run where
// one is (train_locally has checked it).
#include "apps/local_training_impl.h"
#include "kernels/cuda/cuda_backend.h"

namespace swarm::apps {

Result<TrainingReport> train_locally_on_cuda(ComputeBackend backend, const LocalTrainingOptions& options,
                                             const optim::OptimizerConfig& config, optim::Rule rule,
                                             const ProgressSink& progress) {
  switch (backend) {
    case ComputeBackend::cuda_fp32: return training_detail::run<CudaBackend>(options, config, rule, progress);
    case ComputeBackend::cuda_bf16: return training_detail::run<CudaBf16Backend>(options, config, rule, progress);
    case ComputeBackend::cuda_bf16_cudnn:
      return training_detail::run<CudaBf16CudnnBackend>(options, config, rule, progress);
    case ComputeBackend::cpu_fp32: break;
  }
  return invalid_argument("{} is not a CUDA backend", describe(backend));
}

}  // namespace swarm::apps
