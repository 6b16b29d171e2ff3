// See maxout.h for the design.
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/element_types.cuh"
#include "kernels/cuda/maxout.h"

namespace swarm::cuda {
namespace {

constexpr int kThreads = 256;

// The first g whose value is the maximum of x[g * W]; a NaN beats everything,
// the same rule as the CPU kernel.
template <typename T>
__device__ int first_argmax(const T* x, int k, int W) {
  int arg = 0;
  float best = to_float(x[0]);
  for (int g = 1; g < k; ++g) {
    const float v = to_float(x[static_cast<int64_t>(g) * W]);
    if (v > best || (isnan(v) && !isnan(best))) {
      best = v;
      arg = g;
    }
  }
  return arg;
}

template <typename T>
__global__ void maxout_forward_kernel(T* out, const T* inp, int64_t outputs, int C, int k) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= outputs) return;
  const int W = C / k;
  const int64_t n = i / W, j = i % W;
  const T* x = inp + n * C + j;
  out[i] = x[static_cast<int64_t>(first_argmax(x, k, W)) * W];
}

template <typename T>
__global__ void maxout_backward_kernel(T* dinp, const T* dout, const T* inp, int64_t outputs, int C, int k) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= outputs) return;
  const int W = C / k;
  const int64_t n = i / W, j = i % W;
  T* dx = dinp + n * C + j + static_cast<int64_t>(first_argmax(inp + n * C + j, k, W)) * W;
  store_float(dx, load_float(dx) + load_float(dout + i));
}

Status check_args(const char* op, int N, int C, int k, const void* a, const void* b, const void* c) {
  if (N < 0 || C < 1 || k < 1) return invalid_argument("{}: need N >= 0, C >= 1, k >= 1; got {}, {}, {}", op, N, C, k);
  if (C % k != 0) return invalid_argument("{}: C {} is not divisible by k {}", op, C, k);
  if (N > 0 && (a == nullptr || b == nullptr || c == nullptr)) return invalid_argument("{}: a null device pointer", op);
  return Status::ok();
}

unsigned blocks_for(int64_t outputs) { return static_cast<unsigned>((outputs + kThreads - 1) / kThreads); }

template <typename HostT>
Status launch_forward(HostT* out, const HostT* inp, int N, int C, int k, cudaStream_t stream) {
  SWARM_RETURN_IF_ERROR(check_args("maxout_forward", N, C, k, out, inp, inp));
  const int64_t outputs = int64_t{N} * (C / k);
  if (outputs == 0) return Status::ok();
  maxout_forward_kernel<<<blocks_for(outputs), kThreads, 0, stream>>>(device_cast(out), device_cast(inp), outputs,
                                                                      C, k);
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::ok();
}

template <typename HostT>
Status launch_backward(HostT* dinp, const HostT* dout, const HostT* inp, int N, int C, int k, cudaStream_t stream) {
  SWARM_RETURN_IF_ERROR(check_args("maxout_backward", N, C, k, dinp, dout, inp));
  const int64_t outputs = int64_t{N} * (C / k);
  if (outputs == 0) return Status::ok();
  maxout_backward_kernel<<<blocks_for(outputs), kThreads, 0, stream>>>(device_cast(dinp), device_cast(dout),
                                                                       device_cast(inp), outputs, C, k);
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::ok();
}

}  // namespace

Status maxout_forward(float* out, const float* inp, int N, int C, int k, cudaStream_t stream) {
  return launch_forward(out, inp, N, C, k, stream);
}
Status maxout_forward(bf16* out, const bf16* inp, int N, int C, int k, cudaStream_t stream) {
  return launch_forward(out, inp, N, C, k, stream);
}
Status maxout_backward(float* dinp, const float* dout, const float* inp, int N, int C, int k, cudaStream_t stream) {
  return launch_backward(dinp, dout, inp, N, C, k, stream);
}
Status maxout_backward(bf16* dinp, const bf16* dout, const bf16* inp, int N, int C, int k, cudaStream_t stream) {
  return launch_backward(dinp, dout, inp, N, C, k, stream);
}

}  // namespace swarm::cuda
