// BlockCache against a fake backing allocator with a capacity: rounding to
// classes, reuse, the cache cap, the release-and-retry on out of memory, error
// pass-through, statistics, and concurrent use.
#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "kernels/cuda/block_cache.h"

namespace swarm::cuda {
namespace {

// Hands out distinct fake addresses up to `capacity` live bytes.
struct FakeBacking {
  std::size_t capacity = SIZE_MAX;
  StatusCode failure = StatusCode::resource_exhausted;  // what it answers when it cannot
  bool fail_always = false;
  std::size_t live_bytes = 0;
  std::size_t allocate_calls = 0;
  std::size_t free_calls = 0;
  std::size_t bad_frees = 0;  // unknown pointer or wrong size; checked on the test's thread
  std::map<uintptr_t, std::size_t> live;
  uintptr_t next = 0x10000;
  std::mutex mutex;

  BlockCache::AllocateFn allocate_fn() {
    return [this](std::size_t bytes) -> Result<void*> {
      std::lock_guard<std::mutex> lock(mutex);
      ++allocate_calls;
      if (fail_always || live_bytes + bytes > capacity) return Status(failure, "fake backing is full");
      const uintptr_t address = next;
      next += bytes + 4096;
      live[address] = bytes;
      live_bytes += bytes;
      return reinterpret_cast<void*>(address);
    };
  }
  BlockCache::FreeFn free_fn() {
    return [this](void* pointer, std::size_t bytes) {
      std::lock_guard<std::mutex> lock(mutex);
      ++free_calls;
      auto it = live.find(reinterpret_cast<uintptr_t>(pointer));
      if (it == live.end() || it->second != bytes) {  // must be freed with the size it was allocated with
        ++bad_frees;
        return;
      }
      live_bytes -= it->second;
      live.erase(it);
    };
  }
};

TEST_CASE("BlockCache::size_class rounds up to 512 bytes, then to quarter powers of two") {
  CHECK(BlockCache::size_class(0) == 512);
  CHECK(BlockCache::size_class(1) == 512);
  CHECK(BlockCache::size_class(512) == 512);
  CHECK(BlockCache::size_class(513) == 1024);
  CHECK(BlockCache::size_class(1024) == 1024);
  CHECK(BlockCache::size_class(1025) == 1536);
  CHECK(BlockCache::size_class(2049) == 2560);
  CHECK(BlockCache::size_class(4096) == 4096);
  CHECK(BlockCache::size_class(4097) == 5120);
  CHECK(BlockCache::size_class((1 << 20) + 1) == (1 << 20) + (1 << 18));
  // Above 128 MiB the step stays at 32 MiB.
  CHECK(BlockCache::size_class((std::size_t{256} << 20) + 1) == std::size_t{288} << 20);
  CHECK(BlockCache::size_class(std::size_t{10} << 30) == std::size_t{10} << 30);

  std::mt19937_64 rng(1);
  for (int i = 0; i < 100000; ++i) {
    const std::size_t b = (rng() >> (rng() % 64)) % BlockCache::kMaxRequestBytes;  // every magnitude
    const std::size_t size = BlockCache::size_class(b);
    INFO("bytes=" << b);
    CHECK(size >= b);
    CHECK(size % 512 == 0);
    CHECK(BlockCache::size_class(size) == size);  // a class is its own class
    if (b > 512) CHECK(size - b < std::min(b / 4 + 512, BlockCache::kMaxClassStepBytes));
  }
  // Monotone: a larger request never gets a smaller class.
  for (std::size_t b = 0; b < 200000; ++b) CHECK(BlockCache::size_class(b) <= BlockCache::size_class(b + 1));
}

TEST_CASE("BlockCache reuses a freed block of the same class") {
  FakeBacking backing;
  BlockCache cache(backing.allocate_fn(), backing.free_fn(), std::size_t{1} << 30);
  auto first = cache.allocate(1000);
  REQUIRE(first.is_ok());
  cache.deallocate(*first);
  CHECK(cache.stats().bytes_cached == 1024);
  auto second = cache.allocate(900);  // same class, 1024
  REQUIRE(second.is_ok());
  CHECK(*second == *first);
  auto third = cache.allocate(3000);  // another class: fresh
  REQUIRE(third.is_ok());
  CHECK(*third != *first);
  const BlockCacheStats stats = cache.stats();
  CHECK(stats.requests == 3);
  CHECK(stats.cache_hits == 1);
  CHECK(stats.backing_allocations == 2);
  CHECK(stats.backing_frees == 0);
  CHECK(stats.blocks_in_use == 2);
  CHECK(stats.bytes_in_use == 1024 + 3072);
  CHECK(stats.blocks_cached == 0);
  CHECK(stats.peak_bytes_reserved == 1024 + 3072);
  CHECK(backing.allocate_calls == 2);

  cache.deallocate(*second);
  cache.deallocate(*third);
  cache.deallocate(nullptr);  // ignored
  CHECK(cache.stats().blocks_cached == 2);
  CHECK(cache.release_all() == 1024 + 3072);
  CHECK(backing.live.empty());
  CHECK(backing.bad_frees == 0);
  CHECK(cache.stats().backing_frees == 2);
  CHECK(cache.stats().bytes_cached == 0);
}

TEST_CASE("BlockCache caps the cached bytes: beyond the cap a freed block goes straight back") {
  FakeBacking backing;
  BlockCache cache(backing.allocate_fn(), backing.free_fn(), /*max_cached_bytes=*/2048);
  std::vector<void*> blocks;
  for (int i = 0; i < 3; ++i) blocks.push_back(*cache.allocate(1024));
  for (void* p : blocks) cache.deallocate(p);
  const BlockCacheStats stats = cache.stats();
  CHECK(stats.blocks_cached == 2);
  CHECK(stats.bytes_cached == 2048);
  CHECK(stats.backing_frees == 1);
  CHECK(backing.live.size() == 2);
  CHECK(stats.bytes_in_use == 0);
  CHECK(stats.peak_bytes_reserved == 3072);
}

TEST_CASE("BlockCache on out of memory: frees what it holds, retries once, then reports resource_exhausted") {
  FakeBacking backing;
  backing.capacity = 4096;
  BlockCache cache(backing.allocate_fn(), backing.free_fn(), std::size_t{1} << 30);
  void* a = *cache.allocate(2048);
  void* b = *cache.allocate(2048);
  cache.deallocate(a);
  cache.deallocate(b);
  CHECK(cache.stats().bytes_cached == 4096);

  // 3072 does not fit beside the 4096 cached bytes; after the release it does.
  auto c = cache.allocate(3000);
  REQUIRE(c.is_ok());
  BlockCacheStats stats = cache.stats();
  CHECK(stats.out_of_memory_releases == 1);
  CHECK(stats.backing_frees == 2);
  CHECK(stats.bytes_cached == 0);
  CHECK(stats.bytes_in_use == 3072);
  CHECK(backing.allocate_calls == 4);  // a, b, the failed try, the retry

  // 8192 never fits: one try, one release (of nothing), one retry, then the error.
  auto d = cache.allocate(8192);
  CHECK(d.status().code() == StatusCode::resource_exhausted);
  CHECK(d.status().message().find("8192") != std::string::npos);
  stats = cache.stats();
  CHECK(stats.out_of_memory_releases == 2);
  CHECK(stats.failed_requests == 1);
  CHECK(backing.allocate_calls == 6);
  CHECK(stats.bytes_in_use == 3072);  // the failure changed nothing held
  cache.deallocate(*c);
}

TEST_CASE("BlockCache passes other backing errors through without dropping the cache") {
  FakeBacking backing;
  BlockCache cache(backing.allocate_fn(), backing.free_fn(), std::size_t{1} << 30);
  cache.deallocate(*cache.allocate(100));
  backing.fail_always = true;
  backing.failure = StatusCode::unavailable;
  auto failed = cache.allocate(5000);
  CHECK(failed.status().code() == StatusCode::unavailable);
  CHECK(cache.stats().out_of_memory_releases == 0);
  CHECK(cache.stats().blocks_cached == 1);
  CHECK(backing.allocate_calls == 2);  // no retry
  // The cached block still serves its class even while the backing is down.
  CHECK(cache.allocate(512).is_ok());
}

TEST_CASE("BlockCache refuses absurd sizes without calling the backing; the destructor frees the cache") {
  FakeBacking backing;
  {
    BlockCache cache(backing.allocate_fn(), backing.free_fn(), std::size_t{1} << 30);
    CHECK(cache.allocate(SIZE_MAX).status().code() == StatusCode::resource_exhausted);
    CHECK(cache.allocate(BlockCache::kMaxRequestBytes + 1).status().code() == StatusCode::resource_exhausted);
    CHECK(backing.allocate_calls == 0);
    CHECK(cache.stats().failed_requests == 2);
    auto zero = cache.allocate(0);  // an empty tensor still gets a real, distinct block
    REQUIRE(zero.is_ok());
    CHECK(*zero != nullptr);
    cache.deallocate(*zero);
    CHECK(backing.live.size() == 1);
  }
  CHECK(backing.live.empty());
}

TEST_CASE("BlockCache under concurrent allocate and free stays consistent") {
  FakeBacking backing;
  BlockCache cache(backing.allocate_fn(), backing.free_fn(), /*max_cached_bytes=*/64 << 10);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&cache, t] {
      std::mt19937 rng(static_cast<uint32_t>(t));
      std::vector<void*> held;
      for (int i = 0; i < 2000; ++i) {
        if (held.size() < 8 && rng() % 2 == 0) {
          auto p = cache.allocate(rng() % 20000);
          if (p.is_ok()) held.push_back(*p);
        } else if (!held.empty()) {
          cache.deallocate(held.back());
          held.pop_back();
        }
      }
      for (void* p : held) cache.deallocate(p);
    });
  }
  for (auto& thread : threads) thread.join();
  const BlockCacheStats stats = cache.stats();
  CHECK(stats.blocks_in_use == 0);
  CHECK(stats.bytes_in_use == 0);
  CHECK(stats.bytes_cached <= (64u << 10));
  CHECK(backing.live.size() == stats.blocks_cached);
  CHECK(backing.live_bytes == stats.bytes_cached);
  CHECK(stats.requests == stats.cache_hits + stats.backing_allocations + stats.failed_requests);
  CHECK(stats.cache_hits > 0);
  CHECK(backing.bad_frees == 0);
}

}  // namespace
}  // namespace swarm::cuda
