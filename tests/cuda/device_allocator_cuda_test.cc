// The CUDA device allocator: install (idempotent, thread-safe, unavailable
// without a device), tensors on Device::cuda, host -> device -> host copies,
// and reuse of freed blocks through the cache. The caching policy itself is
// tested without a GPU in tests/kernels/cuda/block_cache_test.cc.
#include <cuda_runtime_api.h>

#include <cstring>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/device_info.h"
#include "swarm/core/tensor.h"
#include "tests/cuda/cuda_test_util.h"

namespace swarm::cuda {
namespace {

TEST_CASE("install_cuda_allocator: unavailable without a device, idempotent and thread-safe with one") {
  if (count_devices().count == 0) {
    const Status status = install_cuda_allocator();
    CHECK(status.code() == StatusCode::unavailable);
    CHECK(status.message().find("no CUDA device") != std::string::npos);
    CHECK(install_cuda_allocator() == status);  // the same answer again
    CHECK_FALSE(cuda_allocator_stats().installed);
    CHECK(release_cuda_allocator_cache() == 0);
    CHECK(Tensor::empty(Shape{4}, DType::f32, Device::cuda).status().code() == StatusCode::unavailable);
    testing::skip_without_device();  // prints the skip line
    return;
  }
  std::vector<Status> results(8);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < results.size(); ++i) {
    threads.emplace_back([&results, i] { results[i] = install_cuda_allocator(); });
  }
  for (auto& thread : threads) thread.join();
  for (const Status& status : results) CHECK(status.is_ok());
  const DeviceAllocator* installed = device_allocator(Device::cuda);
  REQUIRE(installed != nullptr);
  CHECK(install_cuda_allocator().is_ok());
  CHECK(device_allocator(Device::cuda) == installed);  // not replaced by a second install
  const CudaAllocatorStats stats = cuda_allocator_stats();
  CHECK(stats.installed);
  CHECK(stats.device >= 0);
  CHECK(stats.max_cached_bytes > 0);
}

TEST_CASE("CUDA tensors: empty and zeros on the device, host -> device -> host round trip, device copies") {
  if (testing::skip_without_device()) return;
  REQUIRE(install_cuda_allocator().is_ok());

  auto device_tensor = Tensor::empty(Shape{37, 129}, DType::f32, Device::cuda);
  REQUIRE(device_tensor.is_ok());
  CHECK(device_tensor->device() == Device::cuda);
  REQUIRE(device_tensor->raw_data() != nullptr);
  cudaPointerAttributes attributes{};
  REQUIRE(cudaPointerGetAttributes(&attributes, device_tensor->raw_data()) == cudaSuccess);
  CHECK(attributes.type == cudaMemoryTypeDevice);  // plain device memory, never managed

  const auto values = testing::random_vector(37 * 129, 3);
  auto host = Tensor::empty(Shape{37, 129}, DType::f32);
  REQUIRE(host.is_ok());
  std::memcpy(host->raw_data(), values.data(), host->size_bytes());

  REQUIRE(device_tensor->copy_from(*host).is_ok());        // host -> device
  auto on_device_again = Tensor::copy_of(*device_tensor, Device::cuda);  // device -> device
  REQUIRE(on_device_again.is_ok());
  auto back = Tensor::copy_of(*on_device_again, Device::cpu);           // device -> host
  REQUIRE(back.is_ok());
  CHECK(bitwise_equal(*back, *host));

  auto zeros = Tensor::zeros(Shape{1000}, DType::bf16, Device::cuda);
  REQUIRE(zeros.is_ok());
  auto zeros_back = Tensor::copy_of(*zeros, Device::cpu);
  REQUIRE(zeros_back.is_ok());
  bool all_zero = true;
  for (bf16 x : zeros_back->span<bf16>()) all_zero = all_zero && x.bits == 0;
  CHECK(all_zero);

  auto empty = Tensor::empty(Shape{0, 8}, DType::f32, Device::cuda);  // zero elements: still a tensor
  REQUIRE(empty.is_ok());
  CHECK(empty->defined());
  CHECK(empty->copy_from(*Tensor::empty(Shape{0, 8}, DType::f32)).is_ok());
}

TEST_CASE("CUDA allocator reuses freed blocks from its cache") {
  if (testing::skip_without_device()) return;
  REQUIRE(install_cuda_allocator().is_ok());
  const Shape shape{3, 1000, 1000};  // 12 MB: its own size class, unlikely to be cached already
  void* first_pointer = nullptr;
  {
    auto first = Tensor::empty(shape, DType::f32, Device::cuda);
    REQUIRE(first.is_ok());
    first_pointer = first->raw_data();
  }  // freed into the cache
  const CudaAllocatorStats before = cuda_allocator_stats();
  CHECK(before.cache.blocks_cached >= 1);
  auto second = Tensor::empty(shape, DType::f32, Device::cuda);
  REQUIRE(second.is_ok());
  CHECK(second->raw_data() == first_pointer);
  const CudaAllocatorStats after = cuda_allocator_stats();
  CHECK(after.cache.cache_hits == before.cache.cache_hits + 1);
  CHECK(after.cache.backing_allocations == before.cache.backing_allocations);
  CHECK(after.cache.requests == before.cache.requests + 1);
  CHECK(after.cache.bytes_in_use >= before.cache.bytes_in_use + 12'000'000);

  // Releasing the cache hands blocks back to cudaFree; the next request allocates anew.
  second = Tensor::empty(Shape{1}, DType::f32, Device::cuda);  // drops the 12 MB tensor into the cache
  CHECK(release_cuda_allocator_cache() >= 12'000'000);
  CHECK(cuda_allocator_stats().cache.bytes_cached == 0);
  const uint64_t backing_before = cuda_allocator_stats().cache.backing_allocations;
  auto third = Tensor::empty(shape, DType::f32, Device::cuda);
  REQUIRE(third.is_ok());
  CHECK(cuda_allocator_stats().cache.backing_allocations == backing_before + 1);
}

TEST_CASE("CUDA allocator: an impossible request is resource_exhausted, and the allocator still works") {
  if (testing::skip_without_device()) return;
  REQUIRE(install_cuda_allocator().is_ok());
  auto huge = Tensor::empty(Shape{int64_t{1} << 40}, DType::f32, Device::cuda);  // 4 TiB
  CHECK(huge.status().code() == StatusCode::resource_exhausted);
  auto small = Tensor::zeros(Shape{16}, DType::f32, Device::cuda);
  CHECK(small.is_ok());
}

}  // namespace
}  // namespace swarm::cuda
