// See layernorm.h for the design.
#include "kernels/common/row_stats.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/layernorm.h"

namespace swarm::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 4;  // one warp each
constexpr float kEps = 1e-5f;     // as the CPU backend

__device__ kernels::Welford warp_merge(kernels::Welford w) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    kernels::Welford other;
    other.count = __shfl_xor_sync(0xffffffffu, w.count, offset);
    other.mean = __shfl_xor_sync(0xffffffffu, w.mean, offset);
    other.m2 = __shfl_xor_sync(0xffffffffu, w.m2, offset);
    w.merge(other);
  }
  return w;
}

__device__ float warp_sum(float x) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp,
                                         const float* weight, const float* bias, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;  // whole warps leave together: rows are per warp
  const float* x = inp + static_cast<int64_t>(row) * C;
  kernels::Welford w;
  for (int c = lane; c < C; c += kWarp) w.add(x[c]);
  w = warp_merge(w);
  const float m = w.mean;
  const float s = w.rstd(kEps);
  float* y = out + static_cast<int64_t>(row) * C;
  for (int c = lane; c < C; c += kWarp) y[c] = (x[c] - m) * s * weight[c] + bias[c];
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

__global__ void layernorm_backward_input_kernel(float* dinp, const float* dout, const float* inp,
                                                const float* weight, const float* mean, const float* rstd,
                                                int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;
  const float* dy = dout + static_cast<int64_t>(row) * C;
  const float* x = inp + static_cast<int64_t>(row) * C;
  const float m = mean[row], s = rstd[row];
  float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
  for (int c = lane; c < C; c += kWarp) {
    const float dnorm = weight[c] * dy[c];
    dnorm_mean += dnorm;
    dnorm_norm_mean += dnorm * (x[c] - m) * s;
  }
  dnorm_mean = warp_sum(dnorm_mean) / C;
  dnorm_norm_mean = warp_sum(dnorm_norm_mean) / C;
  float* dx = dinp + static_cast<int64_t>(row) * C;
  for (int c = lane; c < C; c += kWarp) {
    const float norm = (x[c] - m) * s;
    dx[c] += (weight[c] * dy[c] - dnorm_mean - norm * dnorm_norm_mean) * s;
  }
}

__global__ void layernorm_backward_params_kernel(float* dweight, float* dbias, const float* dout,
                                                 const float* inp, const float* mean, const float* rstd,
                                                 int N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float dw = 0.0f, db = 0.0f;
  for (int i = 0; i < N; ++i) {  // rows in order: the same sum every run
    const float dy = dout[static_cast<int64_t>(i) * C + c];
    db += dy;
    dw += (inp[static_cast<int64_t>(i) * C + c] - mean[i]) * rstd[i] * dy;
  }
  dweight[c] += dw;
  dbias[c] += db;
}

Status check_shape(int N, int C, std::initializer_list<const void*> pointers) {
  if (N < 0 || C < 1) return invalid_argument("layernorm: N must be >= 0 and C >= 1, got N={} C={}", N, C);
  for (const void* p : pointers) {
    if (p == nullptr && N > 0) return invalid_argument("layernorm: a null device pointer");
  }
  return Status::ok();
}

}  // namespace

Status layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                         const float* bias, int N, int C, cudaStream_t stream) {
  SWARM_RETURN_IF_ERROR(check_shape(N, C, {out, mean, rstd, inp, weight, bias}));
  if (N == 0) return Status::ok();
  const int blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  layernorm_forward_kernel<<<blocks, kRowsPerBlock * kWarp, 0, stream>>>(out, mean, rstd, inp, weight, bias, N, C);
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::ok();
}

Status layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, const float* mean, const float* rstd, int N, int C,
                          cudaStream_t stream) {
  SWARM_RETURN_IF_ERROR(check_shape(N, C, {dinp, dweight, dbias, dout, inp, weight, mean, rstd}));
  if (N == 0) return Status::ok();
  const int row_blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  layernorm_backward_input_kernel<<<row_blocks, kRowsPerBlock * kWarp, 0, stream>>>(dinp, dout, inp, weight, mean,
                                                                                    rstd, N, C);
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  constexpr int kThreads = 256;
  layernorm_backward_params_kernel<<<(C + kThreads - 1) / kThreads, kThreads, 0, stream>>>(dweight, dbias, dout, inp,
                                                                                          mean, rstd, N, C);
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::ok();
}

}  // namespace swarm::cuda
