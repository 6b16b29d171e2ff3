// See cross_entropy.h for the design.
#include <cstdint>

#include "kernels/common/online_softmax.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/element_types.cuh"

namespace swarm::cuda {
namespace {

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kThreads = 512;  // one block per row; a multiple of kWarp, at most 32 warps
constexpr int kWarps = kThreads / kWarp;
constexpr int kVectorBytes = 16;
static_assert(kThreads % kWarp == 0 && kWarps <= kWarp);

template <typename E, int kCount>
struct alignas(kVectorBytes) Pack {
  E v[kCount];
};

// Elements before the first 16-byte boundary of row (at most V).
template <typename D>
__device__ int elements_before_alignment(const D* row, int V) {
  const int misalignment = static_cast<int>(reinterpret_cast<uintptr_t>(row) % kVectorBytes);
  const int head = misalignment == 0 ? 0 : (kVectorBytes - misalignment) / static_cast<int>(sizeof(D));
  return head < V ? head : V;
}

// A fixed butterfly: every lane ends with the merge of all 32 lanes' states.
__device__ kernels::OnlineSoftmax warp_merge(kernels::OnlineSoftmax s) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    kernels::OnlineSoftmax other;
    other.max = __shfl_xor_sync(kFullMask, s.max, offset);
    other.sum = __shfl_xor_sync(kFullMask, s.sum, offset);
    s.merge(other);
  }
  return s;
}

template <typename D>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_kernel(float* losses, D* dlogits, const D* logits, const int32_t* targets, int V, float dloss_scale) {
  constexpr int kVec = kVectorBytes / sizeof(D);
  using P = Pack<D, kVec>;
  const int64_t row_index = blockIdx.x;
  const D* row = logits + row_index * V;
  D* drow = dlogits == nullptr ? nullptr : dlogits + row_index * V;
  const int32_t target = targets[row_index];
  if (target < 0 || target >= V) {  // the same for the whole block, so all threads leave before any barrier
    if (threadIdx.x == 0) losses[row_index] = __int_as_float(0x7fc00000);  // quiet NaN
    if (drow != nullptr) {
      for (int v = threadIdx.x; v < V; v += blockDim.x) drow[v] = from_float<D>(0.0f);
    }
    return;
  }

  // The row in three parts: a scalar head up to the first 16-byte boundary, 16-byte
  // packs, and a scalar tail of fewer than kVec elements.
  const int head = elements_before_alignment(row, V);
  const int packs = (V - head) / kVec;
  const int body_end = head + packs * kVec;
  const P* body = reinterpret_cast<const P*>(row + head);

  // Pass 1: the thread's share of the row into one online-softmax state. The target
  // logit is read now, before any dlogits write (dlogits may be logits).
  kernels::OnlineSoftmax state;
  const float target_logit = threadIdx.x == 0 ? to_float(row[target]) : 0.0f;
  if (static_cast<int>(threadIdx.x) < head) state.add(to_float(row[threadIdx.x]));
  for (int p = threadIdx.x; p < packs; p += blockDim.x) {
    const P x = body[p];
#pragma unroll
    for (int k = 0; k < kVec; ++k) state.add(to_float(x.v[k]));
  }
  for (int v = body_end + threadIdx.x; v < V; v += blockDim.x) state.add(to_float(row[v]));

  // Block merge in a fixed order: each warp's butterfly, then warp 0 over the warps.
  __shared__ float warp_max[kWarps], warp_sum[kWarps];
  __shared__ float row_max, row_sum;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  state = warp_merge(state);
  if (lane == 0) {
    warp_max[warp] = state.max;
    warp_sum[warp] = state.sum;
  }
  __syncthreads();
  if (warp == 0) {
    kernels::OnlineSoftmax partial;  // empty for lanes past the last warp
    if (lane < kWarps) {
      partial.max = warp_max[lane];
      partial.sum = warp_sum[lane];
    }
    partial = warp_merge(partial);
    if (lane == 0) {
      row_max = partial.max;
      row_sum = partial.sum;
    }
  }
  __syncthreads();
  const float max_logit = row_max, sum_exp = row_sum;
  if (threadIdx.x == 0) losses[row_index] = (logf(sum_exp) + max_logit) - target_logit;  // the CPU's order
  if (drow == nullptr) return;

  // Pass 2: dlogits = (softmax - onehot(target)) * dloss_scale, in the CPU's order.
  const float inverse = 1.0f / sum_exp;
  auto gradient = [&](int v, float x) {
    float g = expf(x - max_logit) * inverse * dloss_scale;
    if (v == target) g -= dloss_scale;
    return from_float<D>(g);
  };
  const bool co_aligned = reinterpret_cast<uintptr_t>(drow) % kVectorBytes ==
                          reinterpret_cast<uintptr_t>(row) % kVectorBytes;
  if (co_aligned) {
    if (static_cast<int>(threadIdx.x) < head) drow[threadIdx.x] = gradient(threadIdx.x, to_float(row[threadIdx.x]));
    P* dbody = reinterpret_cast<P*>(drow + head);
    for (int p = threadIdx.x; p < packs; p += blockDim.x) {
      const P x = body[p];
      P g;
#pragma unroll
      for (int k = 0; k < kVec; ++k) g.v[k] = gradient(head + p * kVec + k, to_float(x.v[k]));
      dbody[p] = g;
    }
    for (int v = body_end + threadIdx.x; v < V; v += blockDim.x) drow[v] = gradient(v, to_float(row[v]));
  } else {
    for (int v = threadIdx.x; v < V; v += blockDim.x) drow[v] = gradient(v, to_float(row[v]));
  }
}

template <typename T>
Status cross_entropy_impl(float* losses, T* dlogits, const T* logits, const int32_t* targets, int N, int V,
                          float dloss_scale, cudaStream_t stream) {
  if (N < 0 || V < 1) return invalid_argument("cross_entropy: need N >= 0 and V >= 1, got N={} V={}", N, V);
  if (N > 0 && (losses == nullptr || logits == nullptr || targets == nullptr)) {
    return invalid_argument("cross_entropy: a null device pointer (losses, logits and targets are required)");
  }
  if (N == 0) return Status::ok();
  cross_entropy_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(losses, device_cast(dlogits),
                                                                          device_cast(logits), targets, V,
                                                                          dloss_scale);
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::ok();
}

}  // namespace

Status cross_entropy_forward_backward(float* losses, float* dlogits, const float* logits, const int32_t* targets,
                                      int N, int V, float dloss_scale, cudaStream_t stream) {
  return cross_entropy_impl(losses, dlogits, logits, targets, N, V, dloss_scale, stream);
}
Status cross_entropy_forward_backward(float* losses, swarm::bf16* dlogits, const swarm::bf16* logits,
                                      const int32_t* targets, int N, int V, float dloss_scale, cudaStream_t stream) {
  return cross_entropy_impl(losses, dlogits, logits, targets, N, V, dloss_scale, stream);
}

}  // namespace swarm::cuda
