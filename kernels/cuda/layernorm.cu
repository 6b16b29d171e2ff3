// See layernorm.h for the design.
#include "kernels/common/row_stats.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/element_types.cuh"
#include "kernels/cuda/layernorm.h"

namespace swarm::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 4;  // one warp each
constexpr float kEps = 1e-5f;     // as the CPU backend

// Column sums: a block covers 32 columns x kChunkRows rows, with 8 row lanes.
constexpr int kColumnTile = 32;
constexpr int kRowLanes = 8;
constexpr int kChunkRows = 256;

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

// With `b` non-null the row is a + b, rounded to T and stored in `residual`.
template <typename T>
__global__ void layernorm_forward_kernel(T* residual, T* out, float* mean, float* rstd, const T* a, const T* b,
                                         const T* weight, const T* bias, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;  // whole warps leave together: rows are per warp
  const int64_t offset = static_cast<int64_t>(row) * C;
  const T* x = a + offset;
  const T* y = b == nullptr ? nullptr : b + offset;
  T* r = residual == nullptr ? nullptr : residual + offset;
  kernels::Welford w;
  for (int c = lane; c < C; c += kWarp) {
    float v = load_float(x + c);
    if (y != nullptr) {
      const T rounded = from_float<T>(v + load_float(y + c));
      r[c] = rounded;
      v = to_float(rounded);
    }
    w.add(v);
  }
  w = warp_merge(w);
  // The butterfly's merges are not symmetric, so lanes can end a few ulps apart: use
  // lane 0's statistics everywhere, the ones saved for backward.
  const float m = __shfl_sync(0xffffffffu, w.mean, 0);
  const float s = __shfl_sync(0xffffffffu, w.rstd(kEps), 0);
  // A fused row reads its own writes back: each lane touches only its columns.
  const T* source = y != nullptr ? r : x;
  T* o = out + offset;
  for (int c = lane; c < C; c += kWarp) {
    store_float(o + c, (load_float(source + c) - m) * s * load_float(weight + c) + load_float(bias + c));
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

template <typename T>
__global__ void layernorm_backward_input_kernel(T* dinp, const T* dout, const T* inp, const T* weight,
                                                const float* mean, const float* rstd, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;
  const int64_t offset = static_cast<int64_t>(row) * C;
  const T* dy = dout + offset;
  const T* x = inp + offset;
  const float m = mean[row], s = rstd[row];
  float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
  for (int c = lane; c < C; c += kWarp) {
    const float dnorm = load_float(weight + c) * load_float(dy + c);
    dnorm_mean += dnorm;
    dnorm_norm_mean += dnorm * (load_float(x + c) - m) * s;
  }
  dnorm_mean = warp_sum(dnorm_mean) / C;
  dnorm_norm_mean = warp_sum(dnorm_norm_mean) / C;
  T* dx = dinp + offset;
  for (int c = lane; c < C; c += kWarp) {
    const float norm = (load_float(x + c) - m) * s;
    const float grad = (load_float(weight + c) * load_float(dy + c) - dnorm_mean - norm * dnorm_norm_mean) * s;
    store_float(dx + c, load_float(dx + c) + grad);
  }
}

// partial[chunk][c] (dweight) and partial[chunks + chunk][c] (dbias): the sums
// over the rows of one chunk, each row lane walking its rows in order, then the
// lanes added in lane order.
template <typename T>
__global__ void layernorm_column_partials_kernel(float* partial, const T* dout, const T* inp, const float* mean,
                                                 const float* rstd, int N, int C, int chunks) {
  __shared__ float dw_lanes[kRowLanes][kColumnTile];
  __shared__ float db_lanes[kRowLanes][kColumnTile];
  const int c = blockIdx.x * kColumnTile + threadIdx.x;
  const int chunk = blockIdx.y;
  const int row_begin = chunk * kChunkRows;
  const int row_end = min(row_begin + kChunkRows, N);
  float dw = 0.0f, db = 0.0f;
  if (c < C) {
    for (int i = row_begin + threadIdx.y; i < row_end; i += kRowLanes) {
      const int64_t at = static_cast<int64_t>(i) * C + c;
      const float dy = load_float(dout + at);
      db += dy;
      dw += (load_float(inp + at) - mean[i]) * rstd[i] * dy;
    }
  }
  dw_lanes[threadIdx.y][threadIdx.x] = dw;
  db_lanes[threadIdx.y][threadIdx.x] = db;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float sum_w = 0.0f, sum_b = 0.0f;
    for (int lane = 0; lane < kRowLanes; ++lane) {
      sum_w += dw_lanes[lane][threadIdx.x];
      sum_b += db_lanes[lane][threadIdx.x];
    }
    partial[static_cast<int64_t>(chunk) * C + c] = sum_w;
    partial[static_cast<int64_t>(chunks + chunk) * C + c] = sum_b;
  }
}

__global__ void layernorm_column_finish_kernel(float* dweight, float* dbias, const float* partial, int C,
                                               int chunks) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float dw = 0.0f, db = 0.0f;
  for (int chunk = 0; chunk < chunks; ++chunk) {
    dw += partial[static_cast<int64_t>(chunk) * C + c];
    db += partial[static_cast<int64_t>(chunks + chunk) * C + c];
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

int row_blocks(int N) { return (N + kRowsPerBlock - 1) / kRowsPerBlock; }

template <typename T>
Status forward(T* residual, T* out, float* mean, float* rstd, const T* a, const T* b, const T* weight,
               const T* bias, int N, int C, cudaStream_t stream) {
  if (N == 0) return Status::ok();
  layernorm_forward_kernel<<<row_blocks(N), kRowsPerBlock * kWarp, 0, stream>>>(
      device_cast(residual), device_cast(out), mean, rstd, device_cast(a), device_cast(b), device_cast(weight),
      device_cast(bias), N, C);
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::ok();
}

template <typename T>
Status column_sums(float* dweight, float* dbias, float* partial, const T* dout, const T* inp, const float* mean,
                   const float* rstd, int N, int C, int chunks, cudaStream_t stream) {
  const dim3 grid((C + kColumnTile - 1) / kColumnTile, chunks);
  layernorm_column_partials_kernel<<<grid, dim3(kColumnTile, kRowLanes), 0, stream>>>(
      partial, device_cast(dout), device_cast(inp), mean, rstd, N, C, chunks);
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  constexpr int kThreads = 256;
  layernorm_column_finish_kernel<<<(C + kThreads - 1) / kThreads, kThreads, 0, stream>>>(dweight, dbias, partial, C,
                                                                                        chunks);
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::ok();
}

template <typename T>
Status backward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp, const T* weight,
                const float* mean, const float* rstd, int N, int C, cudaStream_t stream) {
  SWARM_RETURN_IF_ERROR(check_shape(N, C, {dinp, dweight, dbias, dout, inp, weight, mean, rstd}));
  if (N == 0) return Status::ok();
  layernorm_backward_input_kernel<<<row_blocks(N), kRowsPerBlock * kWarp, 0, stream>>>(
      device_cast(dinp), device_cast(dout), device_cast(inp), device_cast(weight), mean, rstd, N, C);
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());

  const int chunks = (N + kChunkRows - 1) / kChunkRows;
  float* partial = nullptr;
  SWARM_CUDA_RETURN_IF_ERROR(cudaMallocAsync(reinterpret_cast<void**>(&partial),
                                             sizeof(float) * 2 * static_cast<size_t>(chunks) * C, stream));
  const Status launched = column_sums(dweight, dbias, partial, dout, inp, mean, rstd, N, C, chunks, stream);
  SWARM_CUDA_RETURN_IF_ERROR(cudaFreeAsync(partial, stream));
  return launched;
}

}  // namespace

Status layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                         const float* bias, int N, int C, cudaStream_t stream) {
  SWARM_RETURN_IF_ERROR(check_shape(N, C, {out, mean, rstd, inp, weight, bias}));
  return forward<float>(nullptr, out, mean, rstd, inp, nullptr, weight, bias, N, C, stream);
}
Status layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* weight,
                         const bf16* bias, int N, int C, cudaStream_t stream) {
  SWARM_RETURN_IF_ERROR(check_shape(N, C, {out, mean, rstd, inp, weight, bias}));
  return forward<bf16>(nullptr, out, mean, rstd, inp, nullptr, weight, bias, N, C, stream);
}

Status residual_layernorm_forward(float* residual, float* out, float* mean, float* rstd, const float* a,
                                  const float* b, const float* weight, const float* bias, int N, int C,
                                  cudaStream_t stream) {
  SWARM_RETURN_IF_ERROR(check_shape(N, C, {residual, out, mean, rstd, a, b, weight, bias}));
  return forward<float>(residual, out, mean, rstd, a, b, weight, bias, N, C, stream);
}
Status residual_layernorm_forward(bf16* residual, bf16* out, float* mean, float* rstd, const bf16* a,
                                  const bf16* b, const bf16* weight, const bf16* bias, int N, int C,
                                  cudaStream_t stream) {
  SWARM_RETURN_IF_ERROR(check_shape(N, C, {residual, out, mean, rstd, a, b, weight, bias}));
  return forward<bf16>(residual, out, mean, rstd, a, b, weight, bias, N, C, stream);
}

Status layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, const float* mean, const float* rstd, int N, int C,
                          cudaStream_t stream) {
  return backward<float>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, stream);
}
Status layernorm_backward(bf16* dinp, float* dweight, float* dbias, const bf16* dout, const bf16* inp,
                          const bf16* weight, const float* mean, const float* rstd, int N, int C,
                          cudaStream_t stream) {
  return backward<bf16>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, stream);
}

}  // namespace swarm::cuda
