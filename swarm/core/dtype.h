// dtype: the element types a Tensor holds, with exact bf16/f16 <-> float conversion.
//
// bf16 and f16 are storage types: 16-bit patterns with round-to-nearest-even
// conversion from float. Arithmetic happens in float.
//
//   swarm::bf16 h = swarm::bf16::from_float(1.5f);
//   float back = h.to_float();                 // 1.5f
//   static_assert(swarm::size_of(swarm::DType::bf16) == 2);
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#if defined(__CUDACC__)
#define SWARM_HOST_DEVICE __host__ __device__
#else
#define SWARM_HOST_DEVICE
#endif

namespace swarm {

enum class DType : uint8_t { f32 = 0, bf16 = 1, f16 = 2, i32 = 3, i64 = 4, u8 = 5 };

inline constexpr DType kAllDTypes[] = {DType::f32, DType::bf16, DType::f16,
                                       DType::i32, DType::i64,  DType::u8};

constexpr std::size_t size_of(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
  }
  return "invalid";
}

constexpr bool is_floating(DType dtype) {
  return dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16;
}

// For values read off the wire: an unknown code is an error, not UB.
constexpr std::optional<DType> dtype_from_code(uint8_t code) {
  if (code > static_cast<uint8_t>(DType::u8)) return std::nullopt;
  return static_cast<DType>(code);
}

constexpr std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType dtype : kAllDTypes) {
    if (dtype_name(dtype) == name) return dtype;
  }
  return std::nullopt;
}

struct bf16 {
  uint16_t bits = 0;

  static SWARM_HOST_DEVICE constexpr bf16 from_bits(uint16_t b) { return bf16{b}; }

  static SWARM_HOST_DEVICE constexpr bf16 from_float(float value) {
    uint32_t u = std::bit_cast<uint32_t>(value);
    if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40)};  // quiet NaN
    uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);  // nearest, ties to even
    return bf16{static_cast<uint16_t>((u + rounding) >> 16)};
  }

  SWARM_HOST_DEVICE constexpr float to_float() const {
    return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
  }

  friend constexpr bool operator==(bf16 a, bf16 b) { return a.bits == b.bits; }
};

struct f16 {
  uint16_t bits = 0;

  static SWARM_HOST_DEVICE constexpr f16 from_bits(uint16_t b) { return f16{b}; }

  static SWARM_HOST_DEVICE constexpr f16 from_float(float value) {
    uint32_t u = std::bit_cast<uint32_t>(value);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return f16{static_cast<uint16_t>(sign | 0x7e00u)};  // NaN
    if (abs >= 0x477ff000u) return f16{static_cast<uint16_t>(sign | 0x7c00u)};  // overflow -> inf
    if (abs < 0x38800000u) {
      // Subnormal or zero in f16: scale by 2^24 and round in the integer domain.
      if (abs < 0x33000000u) return f16{static_cast<uint16_t>(sign)};
      uint32_t mantissa = (abs & 0x007fffffu) | 0x00800000u;
      int shift = 126 - static_cast<int>(abs >> 23);  // 14 + (127 - exp) - 1
      uint32_t half = 1u << (shift - 1 + 0);
      uint32_t result = mantissa >> shift;
      uint32_t remainder = mantissa & ((1u << shift) - 1u);
      if (remainder > half || (remainder == half && (result & 1u))) ++result;
      return f16{static_cast<uint16_t>(sign | result)};
    }
    uint32_t rounded = abs + 0x0fffu + ((abs >> 13) & 1u);  // nearest, ties to even
    return f16{static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13))};
  }

  SWARM_HOST_DEVICE constexpr float to_float() const {
    uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
    uint32_t exponent = (bits >> 10) & 0x1fu;
    uint32_t mantissa = bits & 0x3ffu;
    if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
    if (exponent == 0) {
      if (mantissa == 0) return std::bit_cast<float>(sign);
      // Subnormal: value = mantissa * 2^-24.
      float magnitude = static_cast<float>(mantissa) * (1.0f / 16777216.0f);
      return sign ? -magnitude : magnitude;
    }
    return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  }

  friend constexpr bool operator==(f16 a, f16 b) { return a.bits == b.bits; }
};

template <typename T>
struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<bf16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<f16> { static constexpr DType value = DType::f16; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::u8; };

template <typename T>
inline constexpr DType dtype_of_v = dtype_of<T>::value;

}  // namespace swarm
