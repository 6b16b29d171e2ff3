#include "swarm/compression/codecs.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <string>

#include <fmt/core.h>

namespace swarm::compression {
namespace {

static_assert(std::endian::native == std::endian::little, "the frames are little-endian byte copies");

constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kF32InfBits = 0x7f800000u;
constexpr uint32_t kF16MaxBits = 0x477fe000u;   // 65504 as f32
constexpr uint32_t kBf16MaxBits = 0x7f7f0000u;  // the largest bf16 as f32

inline uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }

// All-ones when c, else zero: a select the vectorizer keeps as blend, with no
// branch for it to refuse (it will not speculate float ops out of a branch).
inline uint32_t select(bool c, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(c);
  return (a & mask) | (b & ~mask);
}

// ---- Size checks and error messages (the slow path) -------------------------

Status check_encode_size(std::string_view codec, Result<uint64_t> need, std::size_t n, std::size_t have) {
  if (!need) return need.status().with_context(fmt::format("{} encode", codec));
  if (*need != have) {
    return invalid_argument("{} encode: {} values need {} bytes, the output has {}", codec, n, *need, have);
  }
  return Status::ok();
}

Status check_decode_size(std::string_view codec, Result<uint64_t> need, std::size_t n, std::size_t have) {
  if (!need) return need.status().with_context(fmt::format("{} decode", codec));
  if (*need != have) {
    return invalid_argument("{} decode: {} values need {} encoded bytes, got {}", codec, n, *need, have);
  }
  return Status::ok();
}

std::string describe(float v) {
  if (v != v) return "NaN";
  if (v == std::numeric_limits<float>::infinity()) return "+inf";
  if (v == -std::numeric_limits<float>::infinity()) return "-inf";
  return fmt::format("{}", v);
}

// The error for the first value whose magnitude bits exceed max_bits. Called
// only once the fused pass has seen one.
Status refuse_value(std::string_view codec, std::span<const float> values, std::size_t offset, uint32_t max_bits) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    const uint32_t a = bits_of(values[i]) & kAbsMask;
    if (a <= max_bits) continue;
    if (a >= kF32InfBits) {
      return invalid_argument("{} encode: element {} is {}; NaN and infinities cannot be encoded", codec,
                              offset + i, describe(values[i]));
    }
    return out_of_range("{} encode: element {} is {}, outside the {} range [-{}, {}]", codec, offset + i,
                        describe(values[i]), codec, std::bit_cast<float>(max_bits),
                        std::bit_cast<float>(max_bits));
  }
  return internal("{} encode: no bad element found", codec);
}

// The absmax of one block, written as the block's scale, or the refusal of its
// first NaN or infinity. Taken as the maximum of the magnitude bits: for
// non-negative floats the integer order is the float order, and any NaN/inf
// lands above every finite value.
Result<float> block_absmax(std::string_view codec, std::span<const float> values, std::size_t begin,
                           std::size_t count) {
  const float* __restrict in = values.data() + begin;
  uint32_t max_bits = 0;
  for (std::size_t i = 0; i < count; ++i) max_bits = std::max(max_bits, bits_of(in[i]) & kAbsMask);
  if (max_bits >= kF32InfBits) return refuse_value(codec, values.subspan(begin, count), begin, kF32InfBits - 1);
  return std::bit_cast<float>(max_bits);
}

Result<uint64_t> bytes_per_value(std::string_view codec, uint64_t n, uint64_t size) {
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(n, size, &bytes)) {
    return out_of_range("{}: {} values of {} bytes exceed 2^64 bytes", codec, n, size);
  }
  return bytes;
}

// ---- The 8-bit lookup -------------------------------------------------------
//
// nearest_code8 is a monotone step function of x (distance to the lower code
// grows with x, to the upper one shrinks), so it is determined by its 255
// thresholds: m_j, the largest float that still maps to code j. Then
//   nearest_code8(x) = #{ j : m_j < x }.
// Buckets of the top 16 bits of |x| (8 exponent and 7 mantissa bits) are
// narrower than the gap between neighbouring thresholds (relative width at most
// 2^-7 = 0.0078 against a relative threshold spacing of at least 0.0106, the
// pair next to 1.0), so each bucket holds at most one threshold. A bucket's entry holds the count of thresholds below it
// (bits 16..23) and the low 16 bits of the one inside it, so one lookup and one
// integer comparison give the code. |x| < 2^-22 (no threshold there: the first
// one is 2.75e-7) shares the first bucket and |x| >= 1 the last.
// The table is built from nearest_code8 itself, so the bytes equal
// quantize_blockwise8's (and the CUDA kernels') by construction; the build
// checks the one-threshold property and tests compare against
// quantize_blockwise8 around every threshold.

constexpr uint32_t kLowKey = 105u << 7;   // top 16 bits of 2^-22
constexpr uint32_t kHighKey = 127u << 7;  // top 16 bits of 1.0
constexpr uint32_t kBuckets = kHighKey - kLowKey + 1;

struct Code8Table {
  alignas(64) uint32_t entry[2 * kBuckets];  // [0, kBuckets) for x >= +0, then x <= -0
  bool valid = true;
};

// Floats in a signed-integer order, so that adjacent floats differ by one.
inline int64_t float_order(float f) {
  const int32_t b = std::bit_cast<int32_t>(f);
  return b < 0 ? int64_t{INT32_MIN} - b : int64_t{b};
}
inline float float_from_order(int64_t o) {
  return std::bit_cast<float>(static_cast<int32_t>(o < 0 ? int64_t{INT32_MIN} - o : o));
}

Code8Table build_code8_table() {
  float threshold[kCodebook8Size - 1];
  for (int j = 0; j + 1 < kCodebook8Size; ++j) {
    // nearest(code j) == j and nearest(code j+1) == j+1: bisect between them.
    int64_t lo = float_order(kCodebook8[j]);
    int64_t hi = float_order(kCodebook8[j + 1]);
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (nearest_code8(kCodebook8, float_from_order(mid)) <= j) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    threshold[j] = float_from_order(lo);
  }
  Code8Table table;
  for (uint32_t negative = 0; negative < 2; ++negative) {
    for (uint32_t b = 0; b < kBuckets; ++b) {
      const bool clamped = b == 0 || b == kBuckets - 1;
      const uint32_t low_bits = b == 0 ? 0u : (kLowKey + b) << 16;
      const uint32_t high_bits = b == kBuckets - 1 ? 0x7f7fffffu : ((kLowKey + b + 1) << 16) - 1u;
      const float x_min = negative ? -std::bit_cast<float>(high_bits) : std::bit_cast<float>(low_bits);
      const float x_max = negative ? -std::bit_cast<float>(low_bits) : std::bit_cast<float>(high_bits);
      uint32_t below = 0;
      uint32_t inside = 0;
      for (float m : threshold) {
        if (m < x_min) ++below;
        if (m >= x_min && m <= x_max) ++inside;
      }
      // No threshold: a low-16 value no |x| can pass (> 0xffff, < 0).
      uint32_t low16 = negative ? 0u : 0xffffu;
      if (inside > 1 || (clamped && inside > 0)) table.valid = false;
      if (inside == 1) low16 = (bits_of(threshold[below]) & kAbsMask) & 0xffffu;
      table.entry[negative * kBuckets + b] = (below << 16) | low16;
    }
  }
  return table;
}

const Code8Table& code8_table() {
  static const Code8Table table = build_code8_table();
  return table;
}

// codes[i] = nearest_code8(values[i] / scale) for scale > 0, finite values.
void quantize_block(const float* __restrict values, uint8_t* __restrict codes, std::size_t n, float scale,
                    const uint32_t* __restrict entries) {
  for (std::size_t i = 0; i < n; ++i) {
    const uint32_t u = bits_of(values[i] / scale);  // the division quantize_value8 does
    const uint32_t negative = u >> 31;
    const uint32_t a = u & kAbsMask;
    uint32_t key = a >> 16;
    key = key < kLowKey ? kLowKey : key;
    key = key > kHighKey ? kHighKey : key;
    const uint32_t entry = entries[key - kLowKey + negative * kBuckets];
    const uint32_t low = a & 0xffffu;
    const uint32_t threshold = entry & 0xffffu;
    const uint32_t above = select(negative != 0, low < threshold, low > threshold);
    codes[i] = static_cast<uint8_t>((entry >> 16) + above);
  }
}

// ---- The 4-bit blocks ------------------------------------------------------

// The block's codes, nearest_code4(values[i] / scale) for scale > 0 and finite
// values, packed two per byte, low nibble first, into ceil(count/2) bytes; an odd
// count leaves the last high nibble 0. The same arithmetic as nearest_code4,
// spelled out over a local copy of the thresholds so that GCC vectorizes it.
void quantize_block4(const float* __restrict values, uint8_t* __restrict packed, std::size_t count, float scale) {
  alignas(64) float t[kCodebook4Size - 1];
  std::memcpy(t, kThresholds4.data(), sizeof(t));
  alignas(64) uint8_t codes[kBlockwise4BlockSize] = {};  // zero past count: the padding nibble
  for (std::size_t i = 0; i < count; ++i) {
    const float x = values[i] / scale;  // a true division, as nearest_code4's callers do
    uint32_t code = 0;
    for (int j = 0; j < kCodebook4Size - 1; ++j) code += x > t[j] ? 1u : 0u;
    codes[i] = static_cast<uint8_t>(code);
  }
  const std::size_t bytes = count / 2 + count % 2;
  for (std::size_t k = 0; k < bytes; ++k) packed[k] = static_cast<uint8_t>(codes[2 * k] | (codes[2 * k + 1] << 4));
}

// The inverse: values[i] = kCodebook4[code i] * scale. The codebook is scaled once
// per block (the same product, so the same bits) and then only looked up.
void dequantize_block4(const uint8_t* __restrict packed, float* __restrict values, std::size_t count, float scale) {
  alignas(64) float scaled[kCodebook4Size];
  for (int j = 0; j < kCodebook4Size; ++j) scaled[j] = kCodebook4[j] * scale;
  const std::size_t pairs = count / 2;
  for (std::size_t k = 0; k < pairs; ++k) {
    const uint32_t b = packed[k];
    values[2 * k] = scaled[b & 15u];
    values[2 * k + 1] = scaled[b >> 4];
  }
  if (count % 2 != 0) values[count - 1] = scaled[packed[pairs] & 15u];
}

}  // namespace

// ---- none -------------------------------------------------------------------

Result<uint64_t> NoneCodec::encoded_bytes(uint64_t n) { return bytes_per_value("none", n, 4); }

Status NoneCodec::encode(std::span<const float> values, std::span<std::byte> out) {
  SWARM_RETURN_IF_ERROR(check_encode_size("none", encoded_bytes(values.size()), values.size(), out.size()));
  const float* __restrict in = values.data();
  std::byte* __restrict dst = out.data();
  uint32_t bad = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const uint32_t u = bits_of(in[i]);
    bad |= static_cast<uint32_t>((u & kAbsMask) >= kF32InfBits);
    std::memcpy(dst + 4 * i, &u, 4);
  }
  if (bad != 0) return refuse_value("none", values, 0, kF32InfBits - 1);
  return Status::ok();
}

Status NoneCodec::decode(std::span<const std::byte> encoded, std::span<float> values) {
  SWARM_RETURN_IF_ERROR(check_decode_size("none", encoded_bytes(values.size()), values.size(), encoded.size()));
  const std::byte* __restrict src = encoded.data();
  float* __restrict dst = values.data();
  uint32_t bad = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, src + 4 * i, 4);
    bad |= static_cast<uint32_t>((u & kAbsMask) >= kF32InfBits);
    dst[i] = std::bit_cast<float>(u);
  }
  if (bad != 0) {
    for (std::size_t i = 0; i < values.size(); ++i) {
      uint32_t u;
      std::memcpy(&u, src + 4 * i, 4);
      if ((u & kAbsMask) >= kF32InfBits) {
        return invalid_argument("none decode: element {} has bit pattern {:#010x} (NaN or inf)", i, u);
      }
    }
  }
  return Status::ok();
}

// ---- fp16 -------------------------------------------------------------------

Result<uint64_t> Fp16Codec::encoded_bytes(uint64_t n) { return bytes_per_value("fp16", n, 2); }

Status Fp16Codec::encode(std::span<const float> values, std::span<std::byte> out) {
  SWARM_RETURN_IF_ERROR(check_encode_size("fp16", encoded_bytes(values.size()), values.size(), out.size()));
  const float* __restrict in = values.data();
  std::byte* __restrict dst = out.data();
  uint32_t bad = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const uint32_t u = bits_of(in[i]);
    const uint32_t a = u & kAbsMask;
    bad |= static_cast<uint32_t>(a > kF16MaxBits);
    // Normal fp16 (a >= 2^-14): rebias the exponent and round the 13 dropped bits
    // to nearest even in the integer domain (the dtype.h f16::from_float recipe).
    const uint32_t normal = (a + 0x0fffu + ((a >> 13) & 1u) - 0x38000000u) >> 13;
    // Subnormal fp16 (a < 2^-14): adding 0.5f puts the 2^-24 units at the bottom
    // of the significand, and the float adder rounds them to nearest even; an f32
    // subnormal input gives +0. The sum is a normal float, so flush-to-zero modes
    // cannot touch it.
    const uint32_t subnormal = bits_of(std::bit_cast<float>(a) + 0.5f) - 0x3f000000u;
    const uint32_t h = select(a < 0x38800000u, subnormal, normal) | ((u >> 16) & 0x8000u);
    const uint16_t h16 = static_cast<uint16_t>(h);
    std::memcpy(dst + 2 * i, &h16, 2);
  }
  if (bad != 0) return refuse_value("fp16", values, 0, kF16MaxBits);
  return Status::ok();
}

Status Fp16Codec::decode(std::span<const std::byte> encoded, std::span<float> values) {
  SWARM_RETURN_IF_ERROR(check_decode_size("fp16", encoded_bytes(values.size()), values.size(), encoded.size()));
  const std::byte* __restrict src = encoded.data();
  float* __restrict dst = values.data();
  uint32_t bad = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    uint16_t h16;
    std::memcpy(&h16, src + 2 * i, 2);
    const uint32_t h = h16;
    const uint32_t em = h & 0x7fffu;
    bad |= static_cast<uint32_t>(em >= 0x7c00u);  // exponent 31: inf or NaN
    const uint32_t normal = (em << 13) + 0x38000000u;
    // Subnormal (exponent 0): read the 10 bits as 2^-14 · (1 + m/1024), then
    // subtract 2^-14, leaving m · 2^-24 exactly (also +0 for m = 0).
    const uint32_t subnormal = bits_of(std::bit_cast<float>((em << 13) | 0x38800000u) - 0x1p-14f);
    dst[i] = std::bit_cast<float>(select(em < 0x0400u, subnormal, normal) | ((h & 0x8000u) << 16));
  }
  if (bad != 0) {
    for (std::size_t i = 0; i < values.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      if ((h & 0x7c00u) == 0x7c00u) {
        return invalid_argument("fp16 decode: element {} has bit pattern {:#06x} (inf or NaN)", i, h);
      }
    }
  }
  return Status::ok();
}

// ---- bf16 -------------------------------------------------------------------

Result<uint64_t> Bf16Codec::encoded_bytes(uint64_t n) { return bytes_per_value("bf16", n, 2); }

Status Bf16Codec::encode(std::span<const float> values, std::span<std::byte> out) {
  SWARM_RETURN_IF_ERROR(check_encode_size("bf16", encoded_bytes(values.size()), values.size(), out.size()));
  const float* __restrict in = values.data();
  std::byte* __restrict dst = out.data();
  uint32_t bad = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const uint32_t u = bits_of(in[i]);
    bad |= static_cast<uint32_t>((u & kAbsMask) > kBf16MaxBits);
    // Nearest, ties to even (dtype.h bf16::from_float); no carry reaches the sign
    // for |x| <= the largest bf16.
    const uint16_t h = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    std::memcpy(dst + 2 * i, &h, 2);
  }
  if (bad != 0) return refuse_value("bf16", values, 0, kBf16MaxBits);
  return Status::ok();
}

Status Bf16Codec::decode(std::span<const std::byte> encoded, std::span<float> values) {
  SWARM_RETURN_IF_ERROR(check_decode_size("bf16", encoded_bytes(values.size()), values.size(), encoded.size()));
  const std::byte* __restrict src = encoded.data();
  float* __restrict dst = values.data();
  uint32_t bad = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    uint16_t h16;
    std::memcpy(&h16, src + 2 * i, 2);
    const uint32_t h = h16;
    bad |= static_cast<uint32_t>((h & 0x7f80u) == 0x7f80u);  // exponent 255: inf or NaN
    dst[i] = std::bit_cast<float>(h << 16);
  }
  if (bad != 0) {
    for (std::size_t i = 0; i < values.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      if ((h & 0x7f80u) == 0x7f80u) {
        return invalid_argument("bf16 decode: element {} has bit pattern {:#06x} (inf or NaN)", i, h);
      }
    }
  }
  return Status::ok();
}

// ---- 8-bit blockwise --------------------------------------------------------

Result<uint64_t> Blockwise8Codec::encoded_bytes(uint64_t n) {
  const uint64_t block = static_cast<uint64_t>(kBlockSize);
  const uint64_t blocks = n / block + (n % block != 0 ? 1 : 0);
  uint64_t bytes = 0;
  if (__builtin_add_overflow(n, blocks * 4, &bytes)) {  // blocks * 4 <= n / 1024 + 4: no overflow
    return out_of_range("8bit: {} values exceed 2^64 encoded bytes", n);
  }
  return bytes;
}

Status Blockwise8Codec::encode(std::span<const float> values, std::span<std::byte> out) {
  SWARM_RETURN_IF_ERROR(check_encode_size("8bit", encoded_bytes(values.size()), values.size(), out.size()));
  const Code8Table& table = code8_table();
  if (!table.valid) return internal("8bit encode: the code lookup table failed its self-check");
  const std::size_t n = values.size();
  const std::size_t block = static_cast<std::size_t>(kBlockSize);
  const std::size_t blocks = n / block + (n % block != 0 ? 1 : 0);
  uint8_t* codes = reinterpret_cast<uint8_t*>(out.data() + 4 * blocks);
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::size_t begin = b * block;
    const std::size_t count = std::min(block, n - begin);
    const float* __restrict in = values.data() + begin;
    SWARM_ASSIGN_OR_RETURN(const float absmax, block_absmax("8bit", values, begin, count));
    std::memcpy(out.data() + 4 * b, &absmax, 4);
    if (absmax == 0.0f) {
      std::memset(codes + begin, kZeroCode8, count);  // quantize_value8's all-zero block
    } else {
      quantize_block(in, codes + begin, count, absmax, table.entry);
    }
  }
  return Status::ok();
}

Status Blockwise8Codec::decode(std::span<const std::byte> encoded, std::span<float> values) {
  SWARM_RETURN_IF_ERROR(check_decode_size("8bit", encoded_bytes(values.size()), values.size(), encoded.size()));
  const std::size_t n = values.size();
  const std::size_t block = static_cast<std::size_t>(kBlockSize);
  const std::size_t blocks = n / block + (n % block != 0 ? 1 : 0);
  // Every scale first, so a forged one leaves `values` untouched.
  for (std::size_t b = 0; b < blocks; ++b) {
    float absmax;
    std::memcpy(&absmax, encoded.data() + 4 * b, 4);
    if (!(absmax >= 0.0f && absmax <= std::numeric_limits<float>::max())) {
      return invalid_argument("8bit decode: block {} has absmax {} (bits {:#010x}); a scale must be finite and >= 0",
                              b, describe(absmax), bits_of(absmax));
    }
  }
  const uint8_t* codes = reinterpret_cast<const uint8_t*>(encoded.data() + 4 * blocks);
  // A local copy of the codebook: GCC 12 will not vectorize a gather from the
  // `inline constexpr` array itself ("no vectype"), and the copy is 1 KiB.
  alignas(64) float table[kCodebook8Size];
  std::memcpy(table, kCodebook8, sizeof(table));
  for (std::size_t b = 0; b < blocks; ++b) {
    float absmax;
    std::memcpy(&absmax, encoded.data() + 4 * b, 4);
    const std::size_t begin = b * block;
    const std::size_t count = std::min(block, n - begin);
    const uint8_t* __restrict in = codes + begin;
    float* __restrict dst = values.data() + begin;
    for (std::size_t i = 0; i < count; ++i) dst[i] = dequantize_value8(table, in[i], absmax);
  }
  return Status::ok();
}

// ---- 4-bit blockwise --------------------------------------------------------

Result<uint64_t> Blockwise4Codec::encoded_bytes(uint64_t n) {
  // At most 2^63 + 2^60 (n = 2^64 - 1), so this never fails; the check stays so
  // that a smaller block size could not wrap silently.
  uint64_t bytes = 0;
  if (__builtin_add_overflow(blockwise4_num_blocks(n) * 4, blockwise4_code_bytes(n), &bytes)) {
    return out_of_range("4bit: {} values exceed 2^64 encoded bytes", n);
  }
  return bytes;
}

Status Blockwise4Codec::encode(std::span<const float> values, std::span<std::byte> out) {
  SWARM_RETURN_IF_ERROR(check_encode_size("4bit", encoded_bytes(values.size()), values.size(), out.size()));
  const std::size_t n = values.size();
  const auto block = static_cast<std::size_t>(kBlockSize);
  const auto blocks = static_cast<std::size_t>(blockwise4_num_blocks(n));
  uint8_t* codes = reinterpret_cast<uint8_t*>(out.data() + 4 * blocks);
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::size_t begin = b * block;
    const std::size_t count = std::min(block, n - begin);
    const float* __restrict in = values.data() + begin;
    SWARM_ASSIGN_OR_RETURN(const float absmax, block_absmax("4bit", values, begin, count));
    std::memcpy(out.data() + 4 * b, &absmax, 4);
    uint8_t* packed = codes + begin / 2;  // begin is a multiple of 64: whole bytes
    if (absmax == 0.0f) {
      // All zeros (and -0): the zero code, which 0/0 would not give.
      const std::size_t bytes = count / 2 + count % 2;
      std::memset(packed, kZeroCode4 | (kZeroCode4 << 4), bytes);
      if (count % 2 != 0) packed[bytes - 1] = kZeroCode4;  // padding nibble 0
    } else {
      quantize_block4(in, packed, count, absmax);
    }
  }
  return Status::ok();
}

Status Blockwise4Codec::decode(std::span<const std::byte> encoded, std::span<float> values) {
  SWARM_RETURN_IF_ERROR(check_decode_size("4bit", encoded_bytes(values.size()), values.size(), encoded.size()));
  const std::size_t n = values.size();
  const auto block = static_cast<std::size_t>(kBlockSize);
  const auto blocks = static_cast<std::size_t>(blockwise4_num_blocks(n));
  const uint8_t* codes = reinterpret_cast<const uint8_t*>(encoded.data() + 4 * blocks);
  // Every check first, so a forged frame leaves `values` untouched.
  for (std::size_t b = 0; b < blocks; ++b) {
    float absmax;
    std::memcpy(&absmax, encoded.data() + 4 * b, 4);
    if (!(absmax >= 0.0f && absmax <= std::numeric_limits<float>::max())) {
      return invalid_argument("4bit decode: block {} has absmax {} (bits {:#010x}); a scale must be finite and >= 0",
                              b, describe(absmax), bits_of(absmax));
    }
  }
  if (n % 2 != 0 && (codes[n / 2] >> 4) != 0) {
    return invalid_argument("4bit decode: code byte {} is {:#04x}; its high nibble pads the odd count {} and must be 0",
                            n / 2, codes[n / 2], n);
  }
  for (std::size_t b = 0; b < blocks; ++b) {
    float absmax;
    std::memcpy(&absmax, encoded.data() + 4 * b, 4);
    const std::size_t begin = b * block;
    dequantize_block4(codes + begin / 2, values.data() + begin, std::min(block, n - begin), absmax);
  }
  return Status::ok();
}

}  // namespace swarm::compression
