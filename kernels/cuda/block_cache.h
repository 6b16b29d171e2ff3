// block_cache: a size-class cache of freed device blocks, as pure policy.
//
// cudaMalloc and cudaFree are slow and cudaFree synchronizes the device, so a
// training step that frees and re-allocates the same activation sizes should
// reuse blocks instead. Requests round up to a size class; a freed block goes
// to its class's free list (while the cached total stays under a cap) and the
// next request of that class takes it back. The backing allocate/free come in
// as callables: the CUDA allocator passes cudaMalloc/cudaFree, tests pass a
// fake. No CUDA, no I/O, no clock here.
//
// Size classes: at most 512 bytes -> 512; above, four classes per power of two
// (b in (p, 2p] rounds up to a multiple of p/4), with the step capped at 32 MiB,
// so rounding wastes under 25% and under 32 MiB. Out of memory: when the backing
// allocator answers resource_exhausted, the cache frees every cached block and
// tries once more; if that fails too, the request fails with resource_exhausted.
// Thread-safe: one mutex; the backing callables run under it.
//
//   swarm::cuda::BlockCache cache(backing_allocate, backing_free, /*max_cached_bytes=*/1 << 30);
//   SWARM_ASSIGN_OR_RETURN(void* p, cache.allocate(bytes));
//   cache.deallocate(p);  // now cached; the next allocate of this class reuses it
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "swarm/core/check.h"
#include "swarm/core/status.h"

namespace swarm::cuda {

struct BlockCacheStats {
  uint64_t requests = 0;             // allocate() calls
  uint64_t cache_hits = 0;           // requests served from a cached block
  uint64_t backing_allocations = 0;  // successful calls of the backing allocate
  uint64_t backing_frees = 0;        // calls of the backing free
  uint64_t out_of_memory_releases = 0;  // backing failures that emptied the cache before the retry
  uint64_t failed_requests = 0;      // allocate() calls that returned an error
  std::size_t blocks_in_use = 0;
  std::size_t bytes_in_use = 0;      // in whole classes: what the backing holds for live blocks
  std::size_t blocks_cached = 0;
  std::size_t bytes_cached = 0;
  std::size_t peak_bytes_reserved = 0;  // the most ever held from the backing (in use + cached)
};

class BlockCache {
 public:
  using AllocateFn = std::function<Result<void*>(std::size_t bytes)>;
  using FreeFn = std::function<void(void* pointer, std::size_t bytes)>;

  static constexpr std::size_t kMinClassBytes = 512;
  static constexpr std::size_t kMaxClassStepBytes = std::size_t{32} << 20;
  // Larger requests fail with resource_exhausted at once (and rounding cannot overflow).
  static constexpr std::size_t kMaxRequestBytes = std::size_t{1} << 60;

  BlockCache(AllocateFn allocate, FreeFn free, std::size_t max_cached_bytes)
      : backing_allocate_(std::move(allocate)), backing_free_(std::move(free)), max_cached_bytes_(max_cached_bytes) {}
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;
  // Frees the cached blocks; blocks still in use belong to their holders.
  ~BlockCache() { release_all(); }

  // The class a request of `bytes` rounds up to (0 bytes -> the smallest class).
  static constexpr std::size_t size_class(std::size_t bytes) {
    if (bytes <= kMinClassBytes) return kMinClassBytes;
    const std::size_t power = std::bit_floor(bytes - 1);  // power < bytes <= 2 * power
    const std::size_t step = std::clamp(power / 4, kMinClassBytes, kMaxClassStepBytes);
    return (bytes + step - 1) / step * step;
  }

  // A block of at least `bytes`: a cached one of its class, else a new one.
  Result<void*> allocate(std::size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.requests;
    if (bytes > kMaxRequestBytes) {
      ++stats_.failed_requests;
      return resource_exhausted("block cache: a request of {} bytes exceeds the {} byte limit", bytes,
                                kMaxRequestBytes);
    }
    const std::size_t block_bytes = size_class(bytes);
    auto cached = free_blocks_.find(block_bytes);
    if (cached != free_blocks_.end() && !cached->second.empty()) {
      void* pointer = cached->second.back();
      cached->second.pop_back();
      --stats_.blocks_cached;
      stats_.bytes_cached -= block_bytes;
      ++stats_.cache_hits;
      mark_in_use(pointer, block_bytes);
      return pointer;
    }
    Result<void*> fresh = backing_allocate_(block_bytes);
    if (!fresh.is_ok() && fresh.status().code() == StatusCode::resource_exhausted) {
      ++stats_.out_of_memory_releases;
      release_all_locked();
      fresh = backing_allocate_(block_bytes);
    }
    if (!fresh.is_ok()) {
      ++stats_.failed_requests;
      if (fresh.status().code() != StatusCode::resource_exhausted) return fresh.status();
      return resource_exhausted("block cache: cannot allocate {} bytes (class {}) even after releasing the cache; "
                                "{} bytes in use: {}",
                                bytes, block_bytes, stats_.bytes_in_use, fresh.status().message());
    }
    if (*fresh == nullptr) {
      ++stats_.failed_requests;
      return internal("block cache: the backing allocator returned null for {} bytes", block_bytes);
    }
    ++stats_.backing_allocations;
    mark_in_use(*fresh, block_bytes);
    return *fresh;
  }

  // Returns a block from allocate(). It is cached unless that would take the
  // cached total past the cap, in which case it goes straight to the backing.
  // Null is ignored; a pointer this cache did not hand out is a fatal error.
  void deallocate(void* pointer) {
    if (pointer == nullptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto live = in_use_.find(pointer);
    SWARM_CHECK(live != in_use_.end(), "block cache: {} was not allocated here, or was freed twice", pointer);
    const std::size_t block_bytes = live->second;
    in_use_.erase(live);
    --stats_.blocks_in_use;
    stats_.bytes_in_use -= block_bytes;
    if (stats_.bytes_cached + block_bytes <= max_cached_bytes_) {
      free_blocks_[block_bytes].push_back(pointer);
      ++stats_.blocks_cached;
      stats_.bytes_cached += block_bytes;
    } else {
      backing_free_(pointer, block_bytes);
      ++stats_.backing_frees;
    }
  }

  // Frees every cached block through the backing; returns the bytes released.
  std::size_t release_all() {
    std::lock_guard<std::mutex> lock(mutex_);
    return release_all_locked();
  }

  BlockCacheStats stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  std::size_t max_cached_bytes() const { return max_cached_bytes_; }

 private:
  void mark_in_use(void* pointer, std::size_t block_bytes) {
    in_use_.emplace(pointer, block_bytes);
    ++stats_.blocks_in_use;
    stats_.bytes_in_use += block_bytes;
    stats_.peak_bytes_reserved = std::max(stats_.peak_bytes_reserved, stats_.bytes_in_use + stats_.bytes_cached);
  }

  std::size_t release_all_locked() {
    std::size_t released = 0;
    for (auto& [block_bytes, pointers] : free_blocks_) {
      for (void* pointer : pointers) {
        backing_free_(pointer, block_bytes);
        ++stats_.backing_frees;
        released += block_bytes;
      }
    }
    free_blocks_.clear();
    stats_.blocks_cached = 0;
    stats_.bytes_cached = 0;
    return released;
  }

  AllocateFn backing_allocate_;
  FreeFn backing_free_;
  const std::size_t max_cached_bytes_;
  mutable std::mutex mutex_;
  std::map<std::size_t, std::vector<void*>> free_blocks_;  // class bytes -> cached blocks
  std::unordered_map<void*, std::size_t> in_use_;           // live block -> its class bytes
  BlockCacheStats stats_;
};

}  // namespace swarm::cuda
