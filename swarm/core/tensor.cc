#include "swarm/core/tensor.h"

#include <array>
#include <cstring>
#include <new>

#include <fmt/format.h>

namespace swarm {
namespace {

constexpr std::size_t kCpuAlignment = 64;  // one cache line; also AVX-512 friendly

class CpuAllocator final : public DeviceAllocator {
 public:
  Result<void*> allocate(std::size_t bytes) override {
    void* pointer = ::operator new(bytes == 0 ? 1 : bytes, std::align_val_t{kCpuAlignment},
                                   std::nothrow);
    if (pointer == nullptr) return resource_exhausted("cannot allocate {} bytes on the host", bytes);
    return pointer;
  }
  void deallocate(void* pointer, std::size_t) override {
    ::operator delete(pointer, std::align_val_t{kCpuAlignment});
  }
  Status copy(void* dst, Device dst_device, const void* src, Device src_device,
              std::size_t bytes) override {
    if (dst_device != Device::cpu || src_device != Device::cpu) {
      return unimplemented("the CPU allocator copies only host memory");
    }
    if (bytes != 0) std::memcpy(dst, src, bytes);
    return Status::ok();
  }
};

CpuAllocator& cpu_allocator() {
  static CpuAllocator allocator;
  return allocator;
}

std::array<DeviceAllocator*, 2>& allocators() {
  static std::array<DeviceAllocator*, 2> table{&cpu_allocator(), nullptr};
  return table;
}

}  // namespace

DeviceAllocator* set_device_allocator(Device device, DeviceAllocator* allocator) {
  auto& slot = allocators()[static_cast<int>(device)];
  DeviceAllocator* previous = slot;
  slot = allocator;
  return previous;
}

DeviceAllocator* device_allocator(Device device) { return allocators()[static_cast<int>(device)]; }

Result<TensorView> TensorView::reshaped(const Shape& shape) const {
  if (shape.numel() != numel()) {
    return invalid_argument("cannot reshape {} into {}: element counts differ", shape_.to_string(),
                            shape.to_string());
  }
  return TensorView(data_, dtype_, shape, device_);
}

std::string TensorView::describe() const {
  return fmt::format("{}{} on {}", dtype_name(dtype_), shape_.to_string(), device_name(device_));
}

Result<Tensor> Tensor::empty(const Shape& shape, DType dtype, Device device) {
  SWARM_ASSIGN_OR_RETURN(int64_t bytes, checked_size_bytes(shape, static_cast<int64_t>(size_of(dtype))));
  DeviceAllocator* allocator = device_allocator(device);
  if (allocator == nullptr) {
    return unavailable("no allocator registered for {} tensors", device_name(device));
  }
  SWARM_ASSIGN_OR_RETURN(void* pointer, allocator->allocate(static_cast<std::size_t>(bytes)));
  Tensor tensor;
  tensor.storage_ = std::shared_ptr<void>(pointer, [allocator, bytes](void* p) {
    allocator->deallocate(p, static_cast<std::size_t>(bytes));
  });
  tensor.view_ = TensorView(pointer, dtype, shape, device);
  return tensor;
}

Result<Tensor> Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  SWARM_ASSIGN_OR_RETURN(Tensor tensor, empty(shape, dtype, device));
  if (device == Device::cpu) {
    std::memset(tensor.raw_data(), 0, tensor.size_bytes());
    return tensor;
  }
  SWARM_ASSIGN_OR_RETURN(Tensor host, zeros(shape, dtype, Device::cpu));
  SWARM_RETURN_IF_ERROR(tensor.copy_from(host));
  return tensor;
}

Result<Tensor> Tensor::copy_of(const TensorView& source, Device device) {
  SWARM_ASSIGN_OR_RETURN(Tensor tensor, empty(source.shape(), source.dtype(), device));
  SWARM_RETURN_IF_ERROR(tensor.copy_from(source));
  return tensor;
}

Status copy_view(const TensorView& dst, const TensorView& src) {
  if (src.dtype() != dst.dtype() || !(src.shape() == dst.shape())) {
    return invalid_argument("copy from {} into {}", src.describe(), dst.describe());
  }
  if (dst.device() == Device::cpu && src.device() == Device::cpu) {  // the hot path
    if (dst.size_bytes() != 0) std::memcpy(dst.raw_data(), src.raw_data(), dst.size_bytes());
    return Status::ok();
  }
  // Whichever side is not the host owns the copy engine.
  Device engine = dst.device() != Device::cpu ? dst.device() : src.device();
  DeviceAllocator* allocator = device_allocator(engine);
  if (allocator == nullptr) {
    return unavailable("no allocator registered for {} tensors", device_name(engine));
  }
  return allocator->copy(dst.raw_data(), dst.device(), src.raw_data(), src.device(), dst.size_bytes());
}

Status Tensor::copy_from(const TensorView& source) { return copy_view(view_, source); }

Tensor Tensor::clone() const {
  if (!defined()) return {};
  auto copy = copy_of(view_, device());
  SWARM_CHECK(copy.is_ok(), "clone of {}: {}", view_.describe(), copy.status().to_string());
  return std::move(copy).value();
}

Result<Tensor> Tensor::reshaped(const Shape& shape) const {
  SWARM_ASSIGN_OR_RETURN(TensorView view, view_.reshaped(shape));
  Tensor tensor;
  tensor.storage_ = storage_;
  tensor.view_ = view;
  return tensor;
}

bool bitwise_equal(const TensorView& a, const TensorView& b) {
  SWARM_CHECK(a.device() == Device::cpu && b.device() == Device::cpu, "bitwise_equal on device memory");
  if (a.dtype() != b.dtype() || !(a.shape() == b.shape())) return false;
  return a.size_bytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.size_bytes()) == 0;
}

}  // namespace swarm
