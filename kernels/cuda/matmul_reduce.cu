// matmul's own kernels (see matmul.h): the deterministic dbias column sum, and the
// epilogues for problems cuBLASLt has no fused kernel for. All memory-bound.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/element_types.cuh"
#include "kernels/cuda/matmul.h"

namespace swarm::cuda::matmul_internal {
namespace {

constexpr int kThreads = 256;
constexpr int kColumnsPerBlock = 32;  // one warp across: coalesced row segments
constexpr int kRowLanes = 8;          // warps per block, each walking every 8th row of the chunk

// Grid-stride element-wise loops: enough blocks to fill the GPU, never more than needed.
int elementwise_blocks(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 4096 ? blocks : 4096);
}

template <typename T>
__global__ void add_bias_kernel(T* out, const T* bias, int64_t total, int OC) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    store_float(out + i, load_float(out + i) + load_float(bias + i % OC));
  }
}

template <typename T>
__global__ void gelu_forward_kernel(T* out, const T* pre, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    store_float(out + i, gelu(load_float(pre + i)));
  }
}

template <typename T>
__global__ void multiply_gelu_grad_kernel(T* grad, const T* pre, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    store_float(grad + i, load_float(grad + i) * gelu_grad(load_float(pre + i)));
  }
}

// Pass 1: block (x = column tile, y = row chunk) sums its chunk of rows for 32 columns.
// Thread (tx, ty) adds rows begin+ty, begin+ty+8, ... in order; then thread (tx, 0) adds
// the 8 lane sums in order. The partition depends only on N, never on the hardware.
template <typename T>
__global__ void column_partial_sums_kernel(float* partial, const T* dout, int N, int OC, int rows_per_chunk) {
  __shared__ float lane_sums[kRowLanes][kColumnsPerBlock];
  const int col = blockIdx.x * kColumnsPerBlock + threadIdx.x;
  const int chunk = blockIdx.y;
  const int64_t row_begin = static_cast<int64_t>(chunk) * rows_per_chunk;
  const int64_t row_end = row_begin + rows_per_chunk < N ? row_begin + rows_per_chunk : N;
  float sum = 0.0f;
  if (col < OC) {
    for (int64_t row = row_begin + threadIdx.y; row < row_end; row += kRowLanes) {
      sum += load_float(dout + row * OC + col);
    }
  }
  lane_sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < OC) {
    float total = 0.0f;
    for (int lane = 0; lane < kRowLanes; ++lane) total += lane_sums[lane][threadIdx.x];
    partial[static_cast<int64_t>(chunk) * OC + col] = total;
  }
}

// Pass 2: one thread per column adds the chunk sums in chunk order, then into dbias.
__global__ void column_finish_kernel(float* dbias, const float* partial, int chunks, int OC) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= OC) return;
  float total = 0.0f;
  for (int chunk = 0; chunk < chunks; ++chunk) total += partial[static_cast<int64_t>(chunk) * OC + col];
  dbias[col] += total;
}

template <typename T>
Status add_bias_impl(T* out, const T* bias, int N, int OC, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(N) * OC;
  if (total == 0) return Status::ok();
  add_bias_kernel<<<elementwise_blocks(total), kThreads, 0, stream>>>(device_cast(out), device_cast(bias), total, OC);
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::ok();
}

template <typename T>
Status gelu_forward_impl(T* out, const T* pre, int64_t n, cudaStream_t stream) {
  if (n == 0) return Status::ok();
  gelu_forward_kernel<<<elementwise_blocks(n), kThreads, 0, stream>>>(device_cast(out), device_cast(pre), n);
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::ok();
}

template <typename T>
Status multiply_gelu_grad_impl(T* grad, const T* pre, int64_t n, cudaStream_t stream) {
  if (n == 0) return Status::ok();
  multiply_gelu_grad_kernel<<<elementwise_blocks(n), kThreads, 0, stream>>>(device_cast(grad), device_cast(pre), n);
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::ok();
}

template <typename T>
Status column_sum_accumulate_impl(float* dbias, const T* dout, int N, int OC, cudaStream_t stream) {
  if (N == 0 || OC == 0) return Status::ok();
  const int rows_per_chunk = column_sum_rows_per_chunk(N);
  const int chunks = column_sum_chunks(N);
  float* partial = nullptr;
  SWARM_CUDA_RETURN_IF_ERROR(
      cudaMallocAsync(reinterpret_cast<void**>(&partial), static_cast<size_t>(chunks) * OC * sizeof(float), stream));
  const dim3 grid((OC + kColumnsPerBlock - 1) / kColumnsPerBlock, chunks);
  const dim3 block(kColumnsPerBlock, kRowLanes);
  // The scratch buffer is freed on every path, so the launches report through a Status.
  const Status launched = [&]() -> Status {
    column_partial_sums_kernel<<<grid, block, 0, stream>>>(partial, device_cast(dout), N, OC, rows_per_chunk);
    SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    column_finish_kernel<<<(OC + kThreads - 1) / kThreads, kThreads, 0, stream>>>(dbias, partial, chunks, OC);
    SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
  }();
  const Status freed = cuda_status(cudaFreeAsync(partial, stream), "cudaFreeAsync", __FILE__, __LINE__);
  SWARM_RETURN_IF_ERROR(launched);
  return freed;
}

}  // namespace

Status add_bias(float* out, const float* bias, int N, int OC, cudaStream_t stream) {
  return add_bias_impl(out, bias, N, OC, stream);
}
Status add_bias(bf16* out, const bf16* bias, int N, int OC, cudaStream_t stream) {
  return add_bias_impl(out, bias, N, OC, stream);
}
Status gelu_forward(float* out, const float* pre, int64_t n, cudaStream_t stream) {
  return gelu_forward_impl(out, pre, n, stream);
}
Status gelu_forward(bf16* out, const bf16* pre, int64_t n, cudaStream_t stream) {
  return gelu_forward_impl(out, pre, n, stream);
}
Status multiply_gelu_grad(float* grad, const float* pre, int64_t n, cudaStream_t stream) {
  return multiply_gelu_grad_impl(grad, pre, n, stream);
}
Status multiply_gelu_grad(bf16* grad, const bf16* pre, int64_t n, cudaStream_t stream) {
  return multiply_gelu_grad_impl(grad, pre, n, stream);
}
Status column_sum_accumulate(float* dbias, const float* dout, int N, int OC, cudaStream_t stream) {
  return column_sum_accumulate_impl(dbias, dout, N, OC, stream);
}
Status column_sum_accumulate(float* dbias, const bf16* dout, int N, int OC, cudaStream_t stream) {
  return column_sum_accumulate_impl(dbias, dout, N, OC, stream);
}

}  // namespace swarm::cuda::matmul_internal
