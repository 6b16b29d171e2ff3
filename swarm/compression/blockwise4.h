// blockwise4: the codebook and per-value math of the 4-bit blockwise codec
// (DESIGN.md §5.5, "a codec below 8 bits"); Blockwise4Codec in codecs.h is the codec.
//
// Design: blocks of 64 values, one f32 absmax per block, and per value the 4-bit
// index of the code nearest to value / absmax in a 16-entry codebook whose codes
// sit at quantiles of a normal distribution (the "NormalFloat4" idea of QLoRA,
// Dettmers et al. 2023). Activations and gradients are roughly normal inside a
// block, and equal-probability codes spend the 16 levels where the values are.
//
// The codebook (computed here, not copied): let delta = (1/32 + 1/30)/2, the mean
// of the half-bin widths of a 16-way and a 15-way split of the probability mass,
// so p0 = 1 - delta = 929/960 is the outermost quantile used, and q(p) is the
// standard normal quantile function. Then
//   positive codes  q(p0 + (1/2 - p0)·k/8) / q(p0),  k = 0..7   (8 codes, 1.0 first)
//   negative codes -q(p0 + (1/2 - p0)·j/7) / q(p0),  j = 0..6   (7 codes, -1.0 first)
//   and 0.
// 15 non-zero codes cannot be symmetric, so the positive side gets the extra
// one; the book holds exactly -1, 0 and +1, so ±absmax and zeros are exact. Each
// entry is the float nearest to the double-precision value;
// tests/compression/blockwise4_test.cc rebuilds the table from this recipe
// (q by bisection on erfc) and checks it bit for bit.
//
// Why 64 values per block: the error scales with the block's absmax, and with
// only 8 levels per side a large absmax costs more than it does at 8 bits. On
// N(0, 1) data (2^18 seeded values, measured in double when the size was
// chosen) the RMS error / sigma is 0.087 at 32, 0.092 at 64, 0.096 at 128,
// 0.098 at 256 and 0.110 at 4096 values per block, while the scale costs 32/B
// bits per value: 5, 4.5, 4.25, 4.125 and 4.008 bits. 64 keeps most of the gain
// of small blocks at 1/2 bit of overhead (QLoRA's choice too). An evenly spaced
// 16-code book over [-1, 1] does worse at every block size from 32 up (0.101 at
// 64, 0.148 at 4096), though its worst case is smaller (see max_abs_error).
//
// Frame (little-endian, n values, B = 64):
//   ceil(n/B) × 4 bytes of per-block f32 absmax FIRST (4-byte aligned at the
//   frame's start), then ceil(n/2) bytes of codes, two per byte, value 2i in the
//   low nibble of byte i and value 2i+1 in the high one. For odd n the last high
//   nibble is padding and must be 0: decode refuses anything else, so one frame
//   has one meaning. Size: 4·ceil(n/64) + ceil(n/2) bytes (4.5 bits per value,
//   32/4.5 = 7.1x smaller than f32, for n a multiple of 64). The largest, for
//   n = 2^64 - 1, is 2^63 + 2^60: the size fits in 64 bits for every n.
//
// Nearest code, exact: code(x) is the index of the codebook entry nearest to x
// in real arithmetic, and an x exactly halfway between two codes takes the LOWER
// one (the smaller code), the same side as the 8-bit codec. It is computed as
// the number of thresholds below x, where threshold j is the largest float <=
// the exact midpoint of codes j and j+1 (for a float x, x > that float exactly
// when x > the midpoint), so no float rounding enters the decision.
//
//   uint8_t code = swarm::compression::nearest_code4(v / absmax);
//   float back = swarm::compression::kCodebook4[code] * absmax;
#pragma once

#include <array>
#include <bit>
#include <cstdint>

namespace swarm::compression {

inline constexpr int kCodebook4Size = 16;
inline constexpr uint8_t kZeroCode4 = 7;           // the code whose value is exactly 0
inline constexpr int64_t kBlockwise4BlockSize = 64;  // values per absmax

// Ascending: index 0 = -1, 1..6 the other negatives, 7 = 0, 8..14 the positive
// codes, 15 = 1. Nine significant digits name each float exactly.
inline constexpr float kCodebook4[kCodebook4Size] = {
    -1.0f,          -0.696192801f, -0.525072932f, -0.394917428f, -0.284441322f, -0.184773400f,
    -0.0910499766f, 0.0f,          0.0795803145f, 0.160930142f,  0.246112257f,  0.337915123f,
    0.440709740f,   0.562616885f,  0.722956657f,  1.0f,
};

namespace blockwise4_detail {

// The next float below f, for a finite f (no std::nextafter: it is not constexpr).
constexpr float float_below(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) == 0) return -std::bit_cast<float>(uint32_t{1});  // below ±0: -denorm_min
  return std::bit_cast<float>(f > 0.0f ? u - 1u : u + 1u);
}

// Threshold j: the largest float <= (c_j + c_{j+1}) / 2. The midpoint is exact in
// double (two floats of [-1, 1] whose exponents differ by less than 29 bits), and
// the float nearest to it is stepped down when it lies above.
constexpr std::array<float, kCodebook4Size - 1> thresholds() {
  std::array<float, kCodebook4Size - 1> t{};
  for (int j = 0; j + 1 < kCodebook4Size; ++j) {
    const double mid = (static_cast<double>(kCodebook4[j]) + static_cast<double>(kCodebook4[j + 1])) / 2.0;
    float f = static_cast<float>(mid);
    if (static_cast<double>(f) > mid) f = float_below(f);
    t[j] = f;
  }
  return t;
}

// The largest half gap between neighbouring codes, in double: every gap of
// floats in [-1, 1] is exact there.
constexpr double largest_half_gap() {
  double gap = 0.0;
  for (int j = 1; j < kCodebook4Size; ++j) {
    const double g = static_cast<double>(kCodebook4[j]) - static_cast<double>(kCodebook4[j - 1]);
    gap = g > gap ? g : gap;
  }
  return gap / 2.0;
}

}  // namespace blockwise4_detail

inline constexpr std::array<float, kCodebook4Size - 1> kThresholds4 = blockwise4_detail::thresholds();

// (1 - 0.696192801) / 2 = 0.151903600, the gap next to -1.0. Exact as a float:
// -1 - c_1 is a Sterbenz subtraction and halving is exact (the test checks it).
inline constexpr float kLargestHalfGap4 = static_cast<float>(blockwise4_detail::largest_half_gap());

// The nearest code to x (see the top of the file); below -1 gives 0, above 1
// gives 15, NaN gives 0 (the codec never passes NaN here). Branch-free: the
// codec's loop vectorizes it.
constexpr uint8_t nearest_code4(float x) {
  uint32_t code = 0;
  for (float t : kThresholds4) code += x > t ? 1u : 0u;
  return static_cast<uint8_t>(code);
}

// ceil(n / 64) scales, for any n (no overflow: n/64 + 1 < 2^64).
constexpr uint64_t blockwise4_num_blocks(uint64_t n) {
  const auto block = static_cast<uint64_t>(kBlockwise4BlockSize);
  return n / block + (n % block != 0 ? 1 : 0);
}

// The code bytes that follow the scales: ceil(n / 2).
constexpr uint64_t blockwise4_code_bytes(uint64_t n) { return n / 2 + (n % 2); }

}  // namespace swarm::compression
