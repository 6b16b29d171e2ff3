// shape: up to 8 dimensions with row-major contiguous strides and overflow-checked sizes.
//
// Shape{2, 3} is for trusted code (a bad literal is a programming error);
// Shape::from_dims() is for sizes that came from a file or a peer and returns
// an error for negative dims, a rank above kMaxRank, or a size past int64.
//
//   swarm::Shape s{4, 128, 512};
//   s.numel();        // 262144
//   s.strides()[0];   // 65536
//   auto bad = swarm::Shape::from_dims({1LL << 40, 1LL << 40});  // error, not a wrap-around
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

#include "swarm/core/status.h"

namespace swarm {

class Shape {
 public:
  static constexpr int kMaxRank = 8;

  Shape() = default;  // rank 0: a scalar with one element
  Shape(std::initializer_list<int64_t> dims);

  static Result<Shape> from_dims(std::span<const int64_t> dims);
  static Result<Shape> from_dims(std::initializer_list<int64_t> dims) {
    return from_dims(std::span<const int64_t>(dims.begin(), dims.size()));
  }

  int rank() const { return rank_; }
  int64_t operator[](int axis) const { return dims_[axis]; }
  int64_t dim(int axis) const { return dims_[axis < 0 ? axis + rank_ : axis]; }
  std::span<const int64_t> dims() const { return {dims_.data(), static_cast<size_t>(rank_)}; }
  int64_t numel() const { return numel_; }

  // Row-major contiguous: the last axis has stride 1.
  std::array<int64_t, kMaxRank> strides() const;

  std::string to_string() const;

  friend bool operator==(const Shape& a, const Shape& b) {
    if (a.rank_ != b.rank_) return false;
    for (int i = 0; i < a.rank_; ++i) {
      if (a.dims_[i] != b.dims_[i]) return false;
    }
    return true;
  }

 private:
  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
  int64_t numel_ = 1;
};

// numel * element_size, or an error if that exceeds int64.
Result<int64_t> checked_size_bytes(const Shape& shape, int64_t element_size);

}  // namespace swarm
