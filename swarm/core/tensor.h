// tensor: a typed, shaped, contiguous block of memory on a device; owning or view.
//
// Tensor owns its storage through a shared reference count, so copies of a
// Tensor alias the same memory (like torch.Tensor). TensorView is the
// non-owning (pointer, dtype, shape, device) tuple that kernels and the wire
// codec take. Memory is always contiguous and row-major.
//
//   auto t = swarm::Tensor::zeros(swarm::Shape{2, 3}, swarm::DType::f32);
//   t.data<float>()[4] = 1.0f;
//   swarm::TensorView v = t;           // no copy
//   swarm::Tensor deep = t.clone();    // copy
//
// CPU memory comes from 64-byte aligned operator new. CUDA memory comes from
// the allocator that the CUDA backend registers with set_device_allocator();
// without one, allocating on Device::cuda returns an error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "swarm/core/check.h"
#include "swarm/core/dtype.h"
#include "swarm/core/shape.h"
#include "swarm/core/status.h"

namespace swarm {

enum class Device : uint8_t { cpu = 0, cuda = 1 };

constexpr std::string_view device_name(Device device) {
  return device == Device::cpu ? "cpu" : "cuda";
}

// How a device's memory is obtained and copied. The CPU one is built in.
struct DeviceAllocator {
  virtual ~DeviceAllocator() = default;
  virtual Result<void*> allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* pointer, std::size_t bytes) = 0;
  // Copies between this device and the host, or within this device.
  virtual Status copy(void* dst, Device dst_device, const void* src, Device src_device,
                      std::size_t bytes) = 0;
};

// Registers the allocator used for `device`; returns the previous one (may be null).
DeviceAllocator* set_device_allocator(Device device, DeviceAllocator* allocator);
DeviceAllocator* device_allocator(Device device);

class TensorView {
 public:
  TensorView() = default;
  TensorView(void* data, DType dtype, Shape shape, Device device = Device::cpu)
      : data_(data), dtype_(dtype), shape_(shape), device_(device) {}

  void* raw_data() const { return data_; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  Device device() const { return device_; }
  int64_t numel() const { return shape_.numel(); }
  std::size_t size_bytes() const { return static_cast<std::size_t>(numel()) * size_of(dtype_); }

  // Typed access; the element type must match the dtype.
  template <typename T>
  T* data() const {
    SWARM_CHECK(dtype_of_v<std::remove_const_t<T>> == dtype_, "tensor holds {}, accessed as {}",
                dtype_name(dtype_), dtype_name(dtype_of_v<std::remove_const_t<T>>));
    return static_cast<T*>(data_);
  }

  // Host-only span over the elements.
  template <typename T>
  std::span<T> span() const {
    SWARM_CHECK(device_ == Device::cpu, "span() of a {} tensor", device_name(device_));
    return {data<T>(), static_cast<std::size_t>(numel())};
  }

  // The same memory under another shape with the same element count.
  Result<TensorView> reshaped(const Shape& shape) const;

  std::string describe() const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::f32;
  Shape shape_;
  Device device_ = Device::cpu;
};

// Element-wise copy between views of identical dtype and shape, on any devices.
Status copy_view(const TensorView& dst, const TensorView& src);

class Tensor {
 public:
  Tensor() = default;

  // Uninitialized memory. Errors: size overflow, no allocator for the device, out of memory.
  static Result<Tensor> empty(const Shape& shape, DType dtype, Device device = Device::cpu);
  static Result<Tensor> zeros(const Shape& shape, DType dtype, Device device = Device::cpu);
  // Deep copy of `source` onto `device`.
  static Result<Tensor> copy_of(const TensorView& source, Device device = Device::cpu);

  // Element-wise copy from a view of identical dtype and shape (any devices).
  Status copy_from(const TensorView& source);
  Tensor clone() const;

  bool defined() const { return storage_ != nullptr; }
  const TensorView& view() const { return view_; }
  operator TensorView() const { return view_; }  // NOLINT: implicit by design

  void* raw_data() const { return view_.raw_data(); }
  DType dtype() const { return view_.dtype(); }
  const Shape& shape() const { return view_.shape(); }
  Device device() const { return view_.device(); }
  int64_t numel() const { return view_.numel(); }
  std::size_t size_bytes() const { return view_.size_bytes(); }
  template <typename T>
  T* data() const { return view_.data<T>(); }
  template <typename T>
  std::span<T> span() const { return view_.span<T>(); }

  // Shares storage; errors if the element count differs.
  Result<Tensor> reshaped(const Shape& shape) const;

 private:
  std::shared_ptr<void> storage_;
  TensorView view_;
};

// Byte-exact equality of dtype, shape and contents (host tensors only).
bool bitwise_equal(const TensorView& a, const TensorView& b);

// A host view of `view`: the view itself on the CPU, else a host copy that
// `staging` keeps alive. Parameters, gradients and a layer's ids on a device
// reach the host only through this.
inline Result<TensorView> host_view(const TensorView& view, Tensor& staging) {
  if (view.device() == Device::cpu) return view;
  SWARM_ASSIGN_OR_RETURN(staging, Tensor::copy_of(view, Device::cpu));
  return staging.view();
}

}  // namespace swarm
