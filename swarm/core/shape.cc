#include "swarm/core/shape.h"

#include <fmt/format.h>

#include "swarm/core/check.h"

namespace swarm {

Shape::Shape(std::initializer_list<int64_t> dims) {
  auto shape = from_dims(dims);
  SWARM_CHECK(shape.is_ok(), "{}", shape.status().to_string());
  *this = *shape;
}

Result<Shape> Shape::from_dims(std::span<const int64_t> dims) {
  if (dims.size() > static_cast<size_t>(kMaxRank)) {
    return invalid_argument("rank {} exceeds the maximum of {}", dims.size(), kMaxRank);
  }
  Shape shape;
  shape.rank_ = static_cast<int>(dims.size());
  int64_t numel = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0) return invalid_argument("dimension {} is negative ({})", i, dims[i]);
    if (__builtin_mul_overflow(numel, dims[i], &numel)) {
      return out_of_range("shape [{}] has more than 2^63 elements", fmt::join(dims, ", "));
    }
    shape.dims_[i] = dims[i];
  }
  shape.numel_ = numel;
  return shape;
}

std::array<int64_t, Shape::kMaxRank> Shape::strides() const {
  std::array<int64_t, kMaxRank> strides{};
  int64_t stride = 1;
  for (int i = rank_ - 1; i >= 0; --i) {
    strides[i] = stride;
    stride *= dims_[i];
  }
  return strides;
}

std::string Shape::to_string() const { return fmt::format("[{}]", fmt::join(dims(), ", ")); }

Result<int64_t> checked_size_bytes(const Shape& shape, int64_t element_size) {
  int64_t bytes = 0;
  if (__builtin_mul_overflow(shape.numel(), element_size, &bytes)) {
    return out_of_range("shape {} of {}-byte elements exceeds 2^63 bytes", shape.to_string(),
                        element_size);
  }
  return bytes;
}

}  // namespace swarm
