// Smoke kernel and device query. Kept trivially small: its job is to prove that
// nvcc's sm_80/sm_90/PTX output links into Bazel targets and runs where a GPU is.
#include "kernels/cuda/device_info.h"

#include <cuda_runtime.h>
#include <fmt/core.h>

#include "kernels/cuda/cuda_check.h"

namespace swarm::cuda {
namespace {

__global__ void add_kernel(const float* a, const float* b, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}

}  // namespace

DeviceCount count_devices() {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return {0, fmt::format("cudaGetDeviceCount: {}", cudaGetErrorString(error))};
  }
  if (count == 0) return {0, "the driver reports zero devices"};
  return {count, ""};
}

std::vector<std::string> describe_devices() {
  std::vector<std::string> lines;
  int count = count_devices().count;
  for (int device = 0; device < count; ++device) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) continue;
    lines.push_back(fmt::format("{}: {} sm_{}{} {:.1f} GiB", device, prop.name, prop.major,
                                prop.minor, prop.totalGlobalMem / double(1 << 30)));
  }
  return lines;
}

Status smoke_add(const std::vector<float>& a, const std::vector<float>& b, std::vector<float>* out) {
  if (a.size() != b.size()) return invalid_argument("smoke_add: sizes {} and {}", a.size(), b.size());
  const int n = static_cast<int>(a.size());
  const size_t bytes = a.size() * sizeof(float);
  float *da = nullptr, *db = nullptr, *dout = nullptr;
  SWARM_CUDA_RETURN_IF_ERROR(cudaMalloc(&da, bytes));
  SWARM_CUDA_RETURN_IF_ERROR(cudaMalloc(&db, bytes));
  SWARM_CUDA_RETURN_IF_ERROR(cudaMalloc(&dout, bytes));
  SWARM_CUDA_RETURN_IF_ERROR(cudaMemcpy(da, a.data(), bytes, cudaMemcpyHostToDevice));
  SWARM_CUDA_RETURN_IF_ERROR(cudaMemcpy(db, b.data(), bytes, cudaMemcpyHostToDevice));
  add_kernel<<<(n + 255) / 256, 256>>>(da, db, dout, n);
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  out->resize(a.size());
  SWARM_CUDA_RETURN_IF_ERROR(cudaMemcpy(out->data(), dout, bytes, cudaMemcpyDeviceToHost));
  SWARM_CUDA_RETURN_IF_ERROR(cudaFree(da));
  SWARM_CUDA_RETURN_IF_ERROR(cudaFree(db));
  SWARM_CUDA_RETURN_IF_ERROR(cudaFree(dout));
  return Status::ok();
}

}  // namespace swarm::cuda
