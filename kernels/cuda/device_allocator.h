// device_allocator: the swarm::DeviceAllocator for Device::cuda: cudaMalloc and
// cudaFree (never managed memory) behind a BlockCache (block_cache.h), so
// tensors freed and re-created every step reuse device blocks.
//
// Design: one process-wide allocator, installed once and never destroyed (its
// blocks may outlive static destructors, and freeing after the CUDA runtime has
// shut down fails). It serves the device that was current at install time,
// switching to it around each CUDA call when a thread has another one current.
// The cache keeps up to half of that device's memory; on out of memory it
// releases the cache and retries. copy() is cudaMemcpy with the kind implied
// by the two devices: host<->device copies have finished on return; a
// device-to-device copy is ordered on the legacy default stream.
//
// Reuse is safe under the usual single-stream discipline: a freed block may be
// handed out again at once, so work still reading it must be on a blocking
// stream (or the legacy default stream) ahead of the next user's work.
//
//   SWARM_RETURN_IF_ERROR(swarm::cuda::install_cuda_allocator());
//   SWARM_ASSIGN_OR_RETURN(auto t, swarm::Tensor::empty(swarm::Shape{1024}, swarm::DType::f32, swarm::Device::cuda));
#pragma once

#include <cstddef>

#include "kernels/cuda/block_cache.h"
#include "swarm/core/status.h"

namespace swarm::cuda {

struct CudaAllocatorStats {
  bool installed = false;
  int device = -1;                   // the CUDA device it allocates on
  std::size_t max_cached_bytes = 0;
  BlockCacheStats cache;             // requests, hits, bytes in use and cached, ...
};

// Registers the CUDA allocator for Device::cuda. Thread-safe and idempotent: the
// first call decides, later calls return its result. unavailable (with the
// reason) when there is no usable device.
Status install_cuda_allocator();

// Zeros (installed = false) before a successful install.
CudaAllocatorStats cuda_allocator_stats();

// Hands every cached block back to cudaFree (e.g. before a library needs a big
// workspace); returns the bytes released. 0 when not installed.
std::size_t release_cuda_allocator_cache();

}  // namespace swarm::cuda
