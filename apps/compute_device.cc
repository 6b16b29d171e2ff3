#include "apps/compute_device.h"

#include "kernels/cuda/cuda_backend.h"

namespace swarm::apps {

Status ensure_compute_device(ComputeBackend backend) {
  if (!is_cuda(backend)) return Status::ok();
  Status ready = CudaBackend::initialize();
  if (ready.is_ok()) return ready;
  return unavailable("--device cuda: no usable CUDA GPU here: {}", ready.message());
}

}  // namespace swarm::apps
