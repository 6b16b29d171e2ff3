// codebook8: the 256-entry dynamic-exponent codebook of the 8-bit blockwise codec,
// and the per-value math that the CPU codec and the CUDA kernels share.
//
// The map (DESIGN.md §10, "8-bit codec", the one bitsandbytes uses): for i = 0..6
// there are 2^i magnitudes, the midpoints of an even split of [0.1, 1] into
// 2^i + 1 points, scaled by 10^(i-6). That is 1+2+4+...+64 = 127 magnitudes,
// pairwise disjoint (level i lies strictly inside (10^(i-7), 10^(i-6))). With
// both signs: 254 codes; plus 0 and 1.0: exactly 256. The lowest code, the
// negated largest midpoint -(1 - 0.9/128) = -0.99296875, is replaced by -1.0, so
// the table stays sorted and distinct and spans [-1, 1] exactly:
//   index 0 = -1.0, 1..126 the other negatives, 127 = 0, 128..254 the positive
//   magnitudes, 255 = 1.0.
// Each entry is the float nearest to (0.1 + (2k+1)·0.9/2^(i+1))·10^(i-6)
// evaluated in double; tests/compression/blockwise8_test.cc rebuilds the table
// from that recipe and checks it bit for bit.
//
// Why a literal table behind a macro: device code cannot index a host constexpr
// array, so the .cu places the same initializer in __constant__ memory, and the
// lookup takes the table by pointer (host: kCodebook8, device: a shared copy).
//
//   uint8_t code = swarm::compression::quantize_value8(kCodebook8, v, absmax);
//   float back = swarm::compression::dequantize_value8(kCodebook8, code, absmax);
#pragma once

#include <cfloat>
#include <cstdint>
#include <limits>

#include "swarm/core/dtype.h"  // SWARM_HOST_DEVICE

namespace swarm::compression {

inline constexpr int kCodebook8Size = 256;
inline constexpr uint8_t kZeroCode8 = 127;       // the code whose value is exactly 0
inline constexpr int64_t kBlockwise8BlockSize = 4096;  // values per absmax

// clang-format off
#define SWARM_CODEBOOK8_INITIALIZER { \
  -1.0f, -0.978906274f, -0.96484375f, -0.950781226f,  \
  -0.936718762f, -0.922656238f, -0.908593774f, -0.89453125f,  \
  -0.880468726f, -0.866406262f, -0.852343738f, -0.838281274f,  \
  -0.82421875f, -0.810156226f, -0.796093762f, -0.782031238f,  \
  -0.767968774f, -0.75390625f, -0.739843726f, -0.725781262f,  \
  -0.711718738f, -0.697656274f, -0.68359375f, -0.669531226f,  \
  -0.655468762f, -0.641406238f, -0.627343774f, -0.61328125f,  \
  -0.599218726f, -0.585156262f, -0.571093738f, -0.557031274f,  \
  -0.54296875f, -0.528906226f, -0.514843762f, -0.500781238f,  \
  -0.486718744f, -0.47265625f, -0.458593756f, -0.444531262f,  \
  -0.430468738f, -0.416406244f, -0.40234375f, -0.388281256f,  \
  -0.374218762f, -0.360156238f, -0.346093744f, -0.33203125f,  \
  -0.317968756f, -0.303906262f, -0.289843738f, -0.275781244f,  \
  -0.26171875f, -0.247656256f, -0.233593747f, -0.219531253f,  \
  -0.205468744f, -0.19140625f, -0.177343756f, -0.163281247f,  \
  -0.149218753f, -0.135156244f, -0.12109375f, -0.107031249f,  \
  -0.0985937491f, -0.0957812518f, -0.092968747f, -0.0901562497f,  \
  -0.0873437524f, -0.0845312476f, -0.0817187503f, -0.078906253f,  \
  -0.0760937482f, -0.0732812509f, -0.0704687536f, -0.0676562488f,  \
  -0.0648437515f, -0.0620312504f, -0.0592187494f, -0.0564062484f,  \
  -0.053593751f, -0.05078125f, -0.047968749f, -0.0451562516f,  \
  -0.0423437506f, -0.0395312496f, -0.0367187485f, -0.0339062512f,  \
  -0.0310937501f, -0.0282812491f, -0.0254687499f, -0.0226562507f,  \
  -0.0198437497f, -0.0170312505f, -0.0142187504f, -0.0114062503f,  \
  -0.00971874967f, -0.00915625039f, -0.00859375019f, -0.00803124998f,  \
  -0.00746874977f, -0.00690625003f, -0.00634374982f, -0.00578125007f,  \
  -0.00521874987f, -0.00465625012f, -0.00409374991f, -0.00353124994f,  \
  -0.00296874996f, -0.00240624999f, -0.00184375001f, -0.00128125004f,  \
  -0.000943750027f, -0.000831249985f, -0.000718750001f, -0.000606250018f,  \
  -0.000493749976f, -0.000381249993f, -0.000268750009f, -0.000156249997f,  \
  -8.87499991e-05f, -6.62500024e-05f, -4.37499984e-05f, -2.12499999e-05f,  \
  -7.7499999e-06f, -3.24999996e-06f, -5.49999982e-07f, 0.0f,  \
  5.49999982e-07f, 3.24999996e-06f, 7.7499999e-06f, 2.12499999e-05f,  \
  4.37499984e-05f, 6.62500024e-05f, 8.87499991e-05f, 0.000156249997f,  \
  0.000268750009f, 0.000381249993f, 0.000493749976f, 0.000606250018f,  \
  0.000718750001f, 0.000831249985f, 0.000943750027f, 0.00128125004f,  \
  0.00184375001f, 0.00240624999f, 0.00296874996f, 0.00353124994f,  \
  0.00409374991f, 0.00465625012f, 0.00521874987f, 0.00578125007f,  \
  0.00634374982f, 0.00690625003f, 0.00746874977f, 0.00803124998f,  \
  0.00859375019f, 0.00915625039f, 0.00971874967f, 0.0114062503f,  \
  0.0142187504f, 0.0170312505f, 0.0198437497f, 0.0226562507f,  \
  0.0254687499f, 0.0282812491f, 0.0310937501f, 0.0339062512f,  \
  0.0367187485f, 0.0395312496f, 0.0423437506f, 0.0451562516f,  \
  0.047968749f, 0.05078125f, 0.053593751f, 0.0564062484f,  \
  0.0592187494f, 0.0620312504f, 0.0648437515f, 0.0676562488f,  \
  0.0704687536f, 0.0732812509f, 0.0760937482f, 0.078906253f,  \
  0.0817187503f, 0.0845312476f, 0.0873437524f, 0.0901562497f,  \
  0.092968747f, 0.0957812518f, 0.0985937491f, 0.107031249f,  \
  0.12109375f, 0.135156244f, 0.149218753f, 0.163281247f,  \
  0.177343756f, 0.19140625f, 0.205468744f, 0.219531253f,  \
  0.233593747f, 0.247656256f, 0.26171875f, 0.275781244f,  \
  0.289843738f, 0.303906262f, 0.317968756f, 0.33203125f,  \
  0.346093744f, 0.360156238f, 0.374218762f, 0.388281256f,  \
  0.40234375f, 0.416406244f, 0.430468738f, 0.444531262f,  \
  0.458593756f, 0.47265625f, 0.486718744f, 0.500781238f,  \
  0.514843762f, 0.528906226f, 0.54296875f, 0.557031274f,  \
  0.571093738f, 0.585156262f, 0.599218726f, 0.61328125f,  \
  0.627343774f, 0.641406238f, 0.655468762f, 0.669531226f,  \
  0.68359375f, 0.697656274f, 0.711718738f, 0.725781262f,  \
  0.739843726f, 0.75390625f, 0.767968774f, 0.782031238f,  \
  0.796093762f, 0.810156226f, 0.82421875f, 0.838281274f,  \
  0.852343738f, 0.866406262f, 0.880468726f, 0.89453125f,  \
  0.908593774f, 0.922656238f, 0.936718762f, 0.950781226f,  \
  0.96484375f, 0.978906274f, 0.992968738f, 1.0f }
// clang-format on

// The host copy. Device code uses the same initializer in __constant__ memory.
inline constexpr float kCodebook8[kCodebook8Size] = SWARM_CODEBOOK8_INITIALIZER;

// The index of the code nearest to x. Ties (x exactly halfway between two codes,
// as float arithmetic measures it) go to the LOWER index, the smaller code. Below
// -1 gives 0, above 1 gives 255; NaN gives 0 (the codec never passes NaN here).
//
// Binary search over the sorted table: after the loop, `upper` is the number of
// codes below x, capped at 255, so the nearest code is upper-1 or upper. Both
// distances are plain subtractions, which round identically on the host and
// the device (no multiply, so nothing to contract into an FMA).
SWARM_HOST_DEVICE inline uint8_t nearest_code8(const float* table, float x) {
  int upper = 0;
  for (int step = kCodebook8Size / 2; step > 0; step /= 2) {
    if (table[upper + step - 1] < x) upper += step;
  }
  if (upper == 0) return 0;
  const float below = x - table[upper - 1];
  const float above = table[upper] - x;  // negative when x > 1: then `upper` (255) wins
  return static_cast<uint8_t>(below <= above ? upper - 1 : upper);
}

// The absmax of one block. Non-finite values (NaN, ±inf) do not enter the
// maximum; they mark the block, whose absmax then becomes NaN. A maximum over
// non-negative floats is exact and order-free, so any reduction tree (one CPU
// loop, a CUDA warp shuffle) gives the same bits.
struct AbsmaxAccumulator {
  float max = 0.0f;
  bool nonfinite = false;

  SWARM_HOST_DEVICE void add(float v) {
    const float a = v < 0.0f ? -v : v;  // |v| with no library call: the same on host and device
    if (a <= FLT_MAX) {
      max = a > max ? a : max;
    } else {
      nonfinite = true;  // NaN fails the comparison too
    }
  }
  SWARM_HOST_DEVICE void merge(const AbsmaxAccumulator& other) {
    max = other.max > max ? other.max : max;
    nonfinite = nonfinite || other.nonfinite;
  }
  // What is stored: the maximum, or NaN for a block that held a NaN or an infinity.
  SWARM_HOST_DEVICE float result() const {
    return nonfinite ? std::numeric_limits<float>::quiet_NaN() : max;
  }
};

// One value's code given its block's stored absmax. An all-zero block (absmax 0)
// and a non-finite block (absmax NaN) store the zero code everywhere, so nothing
// divides by zero; on decode a NaN block gives NaN everywhere (0 · NaN), which
// keeps a non-finite gradient visible. A true division (not a multiply by the
// reciprocal) keeps v = ±absmax exactly at ±1 and cannot be fused into an FMA.
SWARM_HOST_DEVICE inline uint8_t quantize_value8(const float* table, float v, float absmax) {
  if (!(absmax > 0.0f)) return kZeroCode8;
  return nearest_code8(table, v / absmax);
}

SWARM_HOST_DEVICE inline float dequantize_value8(const float* table, uint8_t code, float absmax) {
  return table[code] * absmax;
}

// Number of absmax entries for n values: ceil(n / 4096); 0 for n <= 0.
SWARM_HOST_DEVICE constexpr int64_t blockwise8_num_blocks(int64_t n) {
  return n <= 0 ? 0 : n / kBlockwise8BlockSize + (n % kBlockwise8BlockSize != 0 ? 1 : 0);
}

}  // namespace swarm::compression
