#include "apps/compute_options.h"

namespace swarm::apps {

Result<ComputeBackend> parse_compute(const ComputeOptions& o) {
  if (o.device != "cpu" && o.device != "cuda") {
    return invalid_argument("--device {}: the choices are cpu and cuda", o.device);
  }
  const bool cuda = o.device == "cuda";
  const std::string precision = !o.precision.empty() ? o.precision : cuda ? "bf16" : "fp32";
  if (precision != "fp32" && precision != "bf16") {
    return invalid_argument("--precision {}: the choices are bf16 and fp32", precision);
  }
  if (o.attention != "flash" && o.attention != "cudnn") {
    return invalid_argument("--attention {}: the choices are flash and cudnn", o.attention);
  }
  if (!cuda) {
    if (precision == "bf16") return invalid_argument("--precision bf16 needs --device cuda; the CPU computes in fp32");
    if (o.attention == "cudnn") return invalid_argument("--attention cudnn needs --device cuda");
    return ComputeBackend::cpu_fp32;
  }
  if (precision == "fp32") {
    if (o.attention == "cudnn") return invalid_argument("--attention cudnn needs --precision bf16");
    return ComputeBackend::cuda_fp32;
  }
  return o.attention == "cudnn" ? ComputeBackend::cuda_bf16_cudnn : ComputeBackend::cuda_bf16;
}

std::string describe(ComputeBackend backend) {
  switch (backend) {
    case ComputeBackend::cpu_fp32: return "cpu fp32";
    case ComputeBackend::cuda_fp32: return "cuda fp32, flash attention";
    case ComputeBackend::cuda_bf16: return "cuda bf16, flash attention";
    case ComputeBackend::cuda_bf16_cudnn: return "cuda bf16, cudnn attention";
  }
  return "unknown";
}

bool is_cuda(ComputeBackend backend) { return backend != ComputeBackend::cpu_fp32; }

std::vector<std::string> compute_flags(const ComputeOptions& o) {
  std::vector<std::string> flags{"--device", o.device, "--attention", o.attention};
  if (!o.precision.empty()) {
    flags.push_back("--precision");
    flags.push_back(o.precision);
  }
  return flags;
}

}  // namespace swarm::apps
