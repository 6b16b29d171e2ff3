// compute_options: where a role computes, from --device, --precision and
// --attention, as one of the backends the swarm binary is built with.
//
//   cpu  fp32               CpuBackend (the reference; the default)
//   cuda fp32  flash        CudaBackend
//   cuda bf16  flash        CudaBf16Backend (bf16 activations, fp32 masters)
//   cuda bf16  cudnn        CudaBf16CudnnBackend (cuDNN's fused attention)
//
// --precision defaults to fp32 on the CPU and bf16 on CUDA. Any other
// combination is refused by name. A CUDA choice is checked against the machine
// at once, so a role without a usable GPU stops before it joins a swarm.
//
//   SWARM_ASSIGN_OR_RETURN(ComputeBackend backend, parse_compute(options.compute));
//   SWARM_RETURN_IF_ERROR(ensure_compute_device(backend));    // compute_device.h: links CUDA
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "swarm/core/status.h"

namespace swarm::apps {

struct ComputeOptions {
  std::string device = "cpu";       // cpu | cuda
  std::string precision;            // bf16 | fp32; empty: fp32 on cpu, bf16 on cuda
  std::string attention = "flash";  // flash | cudnn (cuda bf16 only)
};

enum class ComputeBackend { cpu_fp32, cuda_fp32, cuda_bf16, cuda_bf16_cudnn };

// invalid_argument names the flag, the value and the choices.
Result<ComputeBackend> parse_compute(const ComputeOptions& options);
// "cpu fp32", "cuda bf16, cudnn attention", ...
std::string describe(ComputeBackend backend);
bool is_cuda(ComputeBackend backend);
// The flags that select `options` again, for a role that starts others.
std::vector<std::string> compute_flags(const ComputeOptions& options);

}  // namespace swarm::apps
