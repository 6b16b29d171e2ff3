#include "kernels/cuda/device_allocator.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstring>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_info.h"
#include "swarm/core/tensor.h"

namespace swarm::cuda {
namespace {

// Makes `device` current for the scope when the calling thread has another one.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess) {
      cudaGetLastError();
      current = -1;
    }
    if (current == device) return;
    status_ = cuda_status(cudaSetDevice(device), "cudaSetDevice", __FILE__, __LINE__);
    if (status_.is_ok()) restore_ = current;
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  ~ScopedDevice() {
    if (restore_ >= 0) cudaSetDevice(restore_);
  }
  const Status& status() const { return status_; }

 private:
  int restore_ = -1;
  Status status_;
};

class CudaDeviceAllocator final : public DeviceAllocator {
 public:
  CudaDeviceAllocator(int device, std::size_t max_cached_bytes)
      : device_(device),
        cache_([device](std::size_t bytes) -> Result<void*> { return backing_allocate(device, bytes); },
               [device](void* pointer, std::size_t) { backing_free(device, pointer); }, max_cached_bytes) {}

  Result<void*> allocate(std::size_t bytes) override { return cache_.allocate(bytes); }

  void deallocate(void* pointer, std::size_t) override { cache_.deallocate(pointer); }

  Status copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes) override {
    if (bytes == 0) return Status::ok();
    if (dst == nullptr || src == nullptr) return invalid_argument("cuda copy of {} bytes with a null pointer", bytes);
    if (dst_device == Device::cpu && src_device == Device::cpu) {
      std::memcpy(dst, src, bytes);
      return Status::ok();
    }
    const cudaMemcpyKind kind = dst_device == Device::cpu   ? cudaMemcpyDeviceToHost
                                : src_device == Device::cpu ? cudaMemcpyHostToDevice
                                                            : cudaMemcpyDeviceToDevice;
    ScopedDevice scope(device_);
    SWARM_RETURN_IF_ERROR(scope.status());
    SWARM_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src, bytes, kind));
    return Status::ok();
  }

  int device() const { return device_; }
  BlockCache& cache() { return cache_; }

 private:
  static Result<void*> backing_allocate(int device, std::size_t bytes) {
    ScopedDevice scope(device);
    SWARM_RETURN_IF_ERROR(scope.status());
    void* pointer = nullptr;
    const cudaError_t error = cudaMalloc(&pointer, bytes);
    if (error != cudaSuccess) {
      cudaGetLastError();  // out of memory is not sticky, but clear it so later checks start clean
      return cuda_status(error, "cudaMalloc", __FILE__, __LINE__);  // resource_exhausted on OOM
    }
    return pointer;
  }

  static void backing_free(int device, void* pointer) {
    ScopedDevice scope(device);
    // A failing cudaFree (a broken context) leaves nothing to recover; the block is gone either way.
    if (cudaFree(pointer) != cudaSuccess) cudaGetLastError();
  }

  const int device_;
  BlockCache cache_;
};

std::atomic<CudaDeviceAllocator*> g_allocator{nullptr};

Status install_once() {
  const DeviceCount devices = count_devices();
  if (devices.count == 0) return unavailable("cannot install the CUDA allocator: no CUDA device ({})", devices.reason);
  int device = 0;
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  std::size_t free_bytes = 0, total_bytes = 0;
  SWARM_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  // Never deleted: see the header.
  auto* allocator = new CudaDeviceAllocator(device, total_bytes / 2);
  set_device_allocator(Device::cuda, allocator);
  g_allocator.store(allocator, std::memory_order_release);
  return Status::ok();
}

}  // namespace

Status install_cuda_allocator() {
  static const Status result = install_once();  // thread-safe static initialization: runs once
  return result;
}

CudaAllocatorStats cuda_allocator_stats() {
  CudaAllocatorStats stats;
  CudaDeviceAllocator* allocator = g_allocator.load(std::memory_order_acquire);
  if (allocator == nullptr) return stats;
  stats.installed = true;
  stats.device = allocator->device();
  stats.max_cached_bytes = allocator->cache().max_cached_bytes();
  stats.cache = allocator->cache().stats();
  return stats;
}

std::size_t release_cuda_allocator_cache() {
  CudaDeviceAllocator* allocator = g_allocator.load(std::memory_order_acquire);
  return allocator == nullptr ? 0 : allocator->cache().release_all();
}

}  // namespace swarm::cuda
