#include "swarm/core/tensor.h"

#include <cstring>
#include <numeric>

#include <doctest/doctest.h>

namespace swarm {
namespace {

TEST_CASE("Shape computes numel and row-major strides") {
  Shape shape{4, 128, 512};
  CHECK(shape.rank() == 3);
  CHECK(shape.numel() == 4 * 128 * 512);
  CHECK(shape.strides()[0] == 128 * 512);
  CHECK(shape.strides()[1] == 512);
  CHECK(shape.strides()[2] == 1);
  CHECK(shape.dim(-1) == 512);
  CHECK(shape.to_string() == "[4, 128, 512]");
  CHECK(Shape{}.numel() == 1);
  CHECK(Shape{3, 0, 2}.numel() == 0);
}

TEST_CASE("Shape::from_dims rejects untrusted sizes instead of wrapping around") {
  CHECK(Shape::from_dims({1LL << 31, 1LL << 31}).is_ok());
  auto huge = Shape::from_dims({1LL << 40, 1LL << 40});
  CHECK(huge.status().code() == StatusCode::out_of_range);
  CHECK(Shape::from_dims({2, -1}).status().code() == StatusCode::invalid_argument);
  int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  CHECK(Shape::from_dims(nine).status().code() == StatusCode::invalid_argument);
  // 2^62 elements fit in int64, but not their bytes as f32.
  auto big = Shape::from_dims({1LL << 62});
  REQUIRE(big.is_ok());
  CHECK(checked_size_bytes(*big, 4).status().code() == StatusCode::out_of_range);
  CHECK_FALSE(Tensor::empty(*big, DType::f32).is_ok());
}

TEST_CASE("Tensor::zeros is zeroed, aligned and typed") {
  auto tensor = Tensor::zeros(Shape{3, 5}, DType::f32);
  REQUIRE(tensor.is_ok());
  CHECK(tensor->defined());
  CHECK(tensor->size_bytes() == 60);
  CHECK(reinterpret_cast<uintptr_t>(tensor->raw_data()) % 64 == 0);
  for (float x : tensor->span<float>()) CHECK(x == 0.0f);
  CHECK(tensor->view().describe() == "f32[3, 5] on cpu");
}

TEST_CASE("copies of a Tensor alias; clone and copy_of do not") {
  Tensor a = *Tensor::zeros(Shape{8}, DType::i32);
  std::iota(a.data<int32_t>(), a.data<int32_t>() + 8, 0);
  Tensor alias = a;
  Tensor deep = a.clone();
  alias.data<int32_t>()[0] = 100;
  CHECK(a.data<int32_t>()[0] == 100);
  CHECK(deep.data<int32_t>()[0] == 0);
  CHECK(deep.data<int32_t>()[7] == 7);

  Tensor from_view = *Tensor::copy_of(a.view());
  CHECK(bitwise_equal(from_view, a));
  from_view.data<int32_t>()[3] = -1;
  CHECK_FALSE(bitwise_equal(from_view, a));
}

TEST_CASE("copy_from checks dtype and shape") {
  Tensor a = *Tensor::zeros(Shape{2, 3}, DType::f32);
  Tensor b = *Tensor::zeros(Shape{3, 2}, DType::f32);
  Tensor c = *Tensor::zeros(Shape{2, 3}, DType::i32);
  CHECK(a.copy_from(b).code() == StatusCode::invalid_argument);
  CHECK(a.copy_from(c).code() == StatusCode::invalid_argument);
  b.data<float>()[5] = 2.5f;
  Tensor b_reshaped = *b.reshaped(Shape{2, 3});
  CHECK(a.copy_from(b_reshaped).is_ok());
  CHECK(a.data<float>()[5] == 2.5f);
}

TEST_CASE("reshaped shares storage and checks the element count") {
  Tensor a = *Tensor::zeros(Shape{4, 6}, DType::bf16);
  auto flat = a.reshaped(Shape{24});
  REQUIRE(flat.is_ok());
  CHECK(flat->raw_data() == a.raw_data());
  CHECK(a.reshaped(Shape{5, 5}).status().code() == StatusCode::invalid_argument);
  // The storage outlives the original handle.
  Tensor survivor = *flat;
  a = Tensor();
  survivor.data<bf16>()[23] = bf16::from_float(3.0f);
  CHECK(survivor.data<bf16>()[23].to_float() == 3.0f);
}

TEST_CASE("a CUDA tensor without a registered allocator is an error, not a crash") {
  DeviceAllocator* previous = set_device_allocator(Device::cuda, nullptr);
  auto tensor = Tensor::empty(Shape{16}, DType::f32, Device::cuda);
  CHECK(tensor.status().code() == StatusCode::unavailable);
  set_device_allocator(Device::cuda, previous);
}

TEST_CASE("a registered device allocator is used for allocation and copies") {
  struct CountingAllocator final : DeviceAllocator {
    int allocations = 0, frees = 0, copies = 0;
    Result<void*> allocate(std::size_t bytes) override {
      ++allocations;
      return ::operator new(bytes);
    }
    void deallocate(void* p, std::size_t) override {
      ++frees;
      ::operator delete(p);
    }
    Status copy(void* dst, Device, const void* src, Device, std::size_t bytes) override {
      ++copies;
      std::memcpy(dst, src, bytes);
      return Status::ok();
    }
  } fake;
  DeviceAllocator* previous = set_device_allocator(Device::cuda, &fake);
  {
    Tensor host = *Tensor::zeros(Shape{4}, DType::f32);
    host.data<float>()[2] = 9.0f;
    Tensor device = *Tensor::copy_of(host, Device::cuda);
    CHECK(device.device() == Device::cuda);
    Tensor back = *Tensor::copy_of(device, Device::cpu);
    CHECK(back.data<float>()[2] == 9.0f);
    CHECK(fake.allocations == 1);
    CHECK(fake.copies == 2);
  }
  CHECK(fake.frees == 1);
  set_device_allocator(Device::cuda, previous);
}

}  // namespace
}  // namespace swarm
