// See grad_norm.h for the design.
#include "kernels/cuda/grad_norm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#include "kernels/cuda/cuda_check.h"
#include "swarm/core/optim_math.h"

namespace swarm::cuda {
namespace {

constexpr int kChunkThreads = 128;     // threads (one chunk each) per block
constexpr int kFinalizeThreads = 256;  // the one block that adds the chunks up

// One thread per chunk: the CPU's sequential double sum of that chunk's squares.
__global__ void grad_chunk_sums_kernel(const DeviceParam* params, const int64_t* first_chunk,
                                       const int32_t* chunk_param, int64_t chunk_count, double* chunk_sums) {
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (chunk >= chunk_count) return;
  const int32_t k = chunk_param[chunk];
  const ChunkRange range = chunk_range(params[k].numel, chunk - first_chunk[k]);
  chunk_sums[chunk] = sum_of_squares_vectorized(params[k].grad, range.begin, range.end);
}

// One block: each param's chunks in order (threads take whole params), then the params in order
// (thread 0), exactly the CPU's association.
__global__ void grad_norm_finalize_kernel(const int64_t* first_chunk, int64_t param_count, const double* chunk_sums,
                                          double* param_sums, float clip_norm, GradNormResult* result) {
  for (int64_t k = threadIdx.x; k < param_count; k += blockDim.x) {
    double sum = 0.0;
    for (int64_t c = first_chunk[k]; c < first_chunk[k + 1]; ++c) sum += chunk_sums[c];
    param_sums[k] = sum;
  }
  __syncthreads();  // makes every param_sums write visible to thread 0
  if (threadIdx.x != 0) return;
  double total = 0.0;
  for (int64_t k = 0; k < param_count; ++k) total += param_sums[k];
  const float norm = static_cast<float>(sqrt(total));
  // Equivalent to the CPU's two refusals: a non-finite param sum makes the total (and the norm)
  // non-finite, and a total past float's range makes the float norm infinite.
  const bool refused = !isfinite(norm);
  result->norm = norm;
  result->clip_coefficient = optim::clip_coefficient(norm, clip_norm);
  result->refused = refused ? 1u : 0u;
  if (refused) result->refused_steps += 1u;
}

size_t align_up(size_t bytes) {
  constexpr size_t kAlign = 256;
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

struct Buffer {
  uintptr_t begin;
  uintptr_t end;
  int64_t param;
  const char* what;
};

Status check_params(std::span<const DeviceParam> params) {
  if (params.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return unimplemented("DeviceParamList: {} params, at most {} supported", params.size(),
                         std::numeric_limits<int32_t>::max());
  }
  std::vector<Buffer> buffers;
  int64_t chunks = 0;
  for (size_t k = 0; k < params.size(); ++k) {
    const DeviceParam& p = params[k];
    if (p.numel < 0) return invalid_argument("DeviceParamList: param {} has numel {}", k, p.numel);
    if (p.numel == 0) continue;
    if (p.weight == nullptr || p.grad == nullptr || p.m == nullptr || p.v == nullptr) {
      return invalid_argument("DeviceParamList: param {} has a null weight, grad, m or v", k);
    }
    if (p.numel > std::numeric_limits<int64_t>::max() / 8) {
      return invalid_argument("DeviceParamList: param {} has numel {}", k, p.numel);
    }
    const auto add = [&](const void* ptr, size_t element_size, const char* what) {
      const uintptr_t begin = reinterpret_cast<uintptr_t>(ptr);
      buffers.push_back({begin, begin + static_cast<uintptr_t>(p.numel) * element_size, static_cast<int64_t>(k), what});
    };
    add(p.weight, sizeof(float), "weight");
    add(p.grad, sizeof(float), "grad");
    add(p.m, sizeof(float), "m");
    add(p.v, sizeof(float), "v");
    if (p.compute_copy != nullptr) add(p.compute_copy, sizeof(bf16), "compute_copy");
    chunks += norm_chunk_count(p.numel);
    if (chunks > std::numeric_limits<int32_t>::max()) {
      return unimplemented("DeviceParamList: more than {} chunks of {} elements", std::numeric_limits<int32_t>::max(),
                           kNormChunk);
    }
  }
  std::sort(buffers.begin(), buffers.end(), [](const Buffer& a, const Buffer& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < buffers.size(); ++i) {
    if (buffers[i].begin < buffers[i - 1].end) {
      return invalid_argument("DeviceParamList: the {} of param {} overlaps the {} of param {}", buffers[i].what,
                              buffers[i].param, buffers[i - 1].what, buffers[i - 1].param);
    }
  }
  return Status::ok();
}

}  // namespace

std::vector<int64_t> chunk_starts(std::span<const DeviceParam> params) {
  std::vector<int64_t> starts(params.size() + 1, 0);
  for (size_t k = 0; k < params.size(); ++k) {
    starts[k + 1] = starts[k] + norm_chunk_count(std::max<int64_t>(params[k].numel, 0));
  }
  return starts;
}

DeviceParamList::DeviceParamList(DeviceParamList&& other) noexcept
    : host_params_(std::move(other.host_params_)),
      chunk_count_(std::exchange(other.chunk_count_, 0)),
      allocation_(std::exchange(other.allocation_, nullptr)),
      device_(std::exchange(other.device_, DeviceArrays{})) {
  other.host_params_.clear();
}

DeviceParamList& DeviceParamList::operator=(DeviceParamList&& other) noexcept {
  if (this != &other) {
    release();
    host_params_ = std::move(other.host_params_);
    other.host_params_.clear();
    chunk_count_ = std::exchange(other.chunk_count_, 0);
    allocation_ = std::exchange(other.allocation_, nullptr);
    device_ = std::exchange(other.device_, DeviceArrays{});
  }
  return *this;
}

DeviceParamList::~DeviceParamList() { release(); }

void DeviceParamList::release() {
  // A destructor cannot report; cudaFree only fails here if the context is already gone.
  if (allocation_ != nullptr) (void)cudaFree(allocation_);
  allocation_ = nullptr;
  device_ = DeviceArrays{};
}

Result<DeviceParamList> DeviceParamList::create(std::span<const DeviceParam> params) {
  SWARM_RETURN_IF_ERROR(check_params(params));
  DeviceParamList list;
  list.host_params_.assign(params.begin(), params.end());
  if (params.empty()) return Result<DeviceParamList>(std::move(list));

  const std::vector<int64_t> first_chunk = chunk_starts(params);
  const int64_t param_count = static_cast<int64_t>(params.size());
  const int64_t chunk_count = first_chunk.back();
  std::vector<int32_t> chunk_param(static_cast<size_t>(chunk_count));
  for (int64_t k = 0; k < param_count; ++k) {
    for (int64_t c = first_chunk[k]; c < first_chunk[k + 1]; ++c) chunk_param[c] = static_cast<int32_t>(k);
  }

  // One allocation; every array starts 256-byte aligned.
  size_t bytes = 0;
  const auto reserve = [&bytes](size_t size) {
    const size_t offset = bytes;
    bytes = align_up(bytes + std::max<size_t>(size, 1));
    return offset;
  };
  const size_t chunk_sums_at = reserve(2 * static_cast<size_t>(chunk_count) * sizeof(double));
  const size_t param_sums_at = reserve(static_cast<size_t>(param_count) * sizeof(double));
  const size_t first_chunk_at = reserve(first_chunk.size() * sizeof(int64_t));
  const size_t params_at = reserve(params.size() * sizeof(DeviceParam));
  const size_t chunk_param_at = reserve(chunk_param.size() * sizeof(int32_t));
  const size_t param_scale_at = reserve(static_cast<size_t>(param_count) * sizeof(float));

  std::vector<unsigned char> staging(bytes, 0);
  std::memcpy(staging.data() + first_chunk_at, first_chunk.data(), first_chunk.size() * sizeof(int64_t));
  std::memcpy(staging.data() + params_at, params.data(), params.size() * sizeof(DeviceParam));
  std::memcpy(staging.data() + chunk_param_at, chunk_param.data(), chunk_param.size() * sizeof(int32_t));

  SWARM_CUDA_RETURN_IF_ERROR(cudaMalloc(&list.allocation_, bytes));  // list frees it on any later error
  SWARM_CUDA_RETURN_IF_ERROR(cudaMemcpy(list.allocation_, staging.data(), bytes, cudaMemcpyHostToDevice));
  auto* base = static_cast<unsigned char*>(list.allocation_);
  list.chunk_count_ = chunk_count;
  list.device_.params = reinterpret_cast<const DeviceParam*>(base + params_at);
  list.device_.first_chunk = reinterpret_cast<const int64_t*>(base + first_chunk_at);
  list.device_.chunk_param = reinterpret_cast<const int32_t*>(base + chunk_param_at);
  list.device_.chunk_sums = reinterpret_cast<double*>(base + chunk_sums_at);
  list.device_.param_sums = reinterpret_cast<double*>(base + param_sums_at);
  list.device_.param_scale = reinterpret_cast<float*>(base + param_scale_at);
  return Result<DeviceParamList>(std::move(list));
}

Status global_grad_norm(const DeviceParamList& params, float clip_norm, GradNormResult* result,
                        cudaStream_t stream) {
  if (result == nullptr) return invalid_argument("global_grad_norm: null result");
  if (!std::isfinite(clip_norm)) return invalid_argument("global_grad_norm: clip_norm {} must be finite", clip_norm);
  const DeviceParamList::DeviceArrays& d = params.device_arrays();
  const int64_t chunk_count = params.chunk_count();
  if (chunk_count > 0) {
    const int64_t blocks = (chunk_count + kChunkThreads - 1) / kChunkThreads;
    grad_chunk_sums_kernel<<<static_cast<unsigned>(blocks), kChunkThreads, 0, stream>>>(
        d.params, d.first_chunk, d.chunk_param, chunk_count, d.chunk_sums);
    SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  grad_norm_finalize_kernel<<<1, kFinalizeThreads, 0, stream>>>(d.first_chunk, params.size(), d.chunk_sums,
                                                                d.param_sums, clip_norm, result);
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::ok();
}

}  // namespace swarm::cuda
