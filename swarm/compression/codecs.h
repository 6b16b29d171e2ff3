// codecs: the five wire codecs (none, fp16, bf16, 8-bit and 4-bit blockwise) as
// models of swarm::Codec, and StandardCodecs, the CodecTable that dispatches to them.
//
// Frame layouts (all little-endian, n = number of f32 values):
//   none        n × 4 bytes: the f32 bit patterns.
//   fp16        n × 2 bytes: IEEE binary16, rounded to nearest, ties to even.
//   bf16        n × 2 bytes: bfloat16 (the top half of the f32), nearest, ties to even.
//   blockwise8  ceil(n/4096) × 4 bytes of per-block f32 absmax FIRST, then n code
//               bytes, so the floats sit at the (4-byte-aligned) start of the frame;
//               n + 4·ceil(n/4096) bytes, as wire::expected_payload_bytes counts.
//   blockwise4  ceil(n/64) × 4 bytes of per-block f32 absmax FIRST, then the 4-bit
//               codes two per byte, low nibble first; an odd n leaves the last high
//               nibble 0 (decode refuses any other). 4·ceil(n/64) + ceil(n/2) bytes.
// n = 0 encodes to 0 bytes and decodes from 0 bytes.
//
// Blockwise8Codec writes exactly the codes of quantize_blockwise8 (blockwise8.h,
// and so of the CUDA kernels), through a faster exact lookup; only its NaN policy
// is stricter: a block holding a NaN or an infinity is refused with an error,
// never stored as a NaN absmax. Blockwise4Codec (blockwise4.h: an NF4-style book
// of 16 normal quantiles) has no other implementation to match; its codes are
// the exact nearest ones, so they are defined by the codebook alone.
//
// Every encode and decode is one pass of plain loops that the compiler vectorizes
// (bench/codec_bench.cc measures them against memcpy). NaN/Inf checks are fused
// into that pass; only an error pays for a second scan that names the element.
//
//   std::vector<std::byte> frame(*swarm::compression::Fp16Codec::encoded_bytes(x.size()));
//   SWARM_RETURN_IF_ERROR(swarm::compression::Fp16Codec::encode(x, frame));
//   SWARM_RETURN_IF_ERROR(swarm::compression::Fp16Codec::decode(frame, y));  // y.size() == x.size()
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

#include "swarm/api/codec.h"
#include "swarm/compression/blockwise4.h"
#include "swarm/compression/blockwise8.h"
#include "swarm/core/status.h"

namespace swarm::compression {

// The raw f32 bytes. Exact: max_abs_error is 0.
struct NoneCodec {
  using codec_concept = codec_t;
  static constexpr CodecId id = CodecId::none;

  static Result<uint64_t> encoded_bytes(uint64_t n);
  static Status encode(std::span<const float> values, std::span<std::byte> out);
  static Status decode(std::span<const std::byte> encoded, std::span<float> values);
  static constexpr float max_abs_error(float block_absmax, float value) { return 0.0f; }
};

// IEEE binary16. encode refuses |x| > 65504 (the largest fp16) with out_of_range;
// decode refuses the exponent-31 patterns (inf, NaN).
struct Fp16Codec {
  using codec_concept = codec_t;
  static constexpr CodecId id = CodecId::fp16;
  static constexpr float kMaxValue = 65504.0f;

  static Result<uint64_t> encoded_bytes(uint64_t n);
  static Status encode(std::span<const float> values, std::span<std::byte> out);
  static Status decode(std::span<const std::byte> encoded, std::span<float> values);
  // Bound: |value|·2^-11 + 2^-25. Rounding to nearest with an 11-bit significand
  // is off by at most half an ulp, 2^(e-11) <= |value|·2^-11 for a normal result
  // (|value| >= 2^-14); below that the fp16 subnormals are spaced 2^-24 apart, so
  // the error is at most 2^-25 (f32 subnormals become ±0, an error under 2^-126).
  static constexpr float max_abs_error(float block_absmax, float value) {
    return (value < 0.0f ? -value : value) * 0x1p-11f + 0x1p-25f;
  }
};

// bfloat16. encode refuses |x| above the largest bf16 (0x1.fep127, 3.3895314e38)
// with out_of_range; decode refuses the exponent-255 patterns (inf, NaN).
struct Bf16Codec {
  using codec_concept = codec_t;
  static constexpr CodecId id = CodecId::bf16;
  static constexpr float kMaxValue = 0x1.fep127f;

  static Result<uint64_t> encoded_bytes(uint64_t n);
  static Status encode(std::span<const float> values, std::span<std::byte> out);
  static Status decode(std::span<const std::byte> encoded, std::span<float> values);
  // Bound: |value|·2^-8 + 2^-134. An 8-bit significand rounds to within half an
  // ulp, 2^(e-8) <= |value|·2^-8, for a normal result; the bf16 subnormals are
  // spaced 2^-133 apart, so below 2^-126 the error is at most 2^-134.
  static constexpr float max_abs_error(float block_absmax, float value) {
    return (value < 0.0f ? -value : value) * 0x1p-8f + 0x1p-134f;
  }
};

// Half the largest gap between neighbouring codes of the 8-bit codebook:
// (1 - 0.978906274) / 2 = 0.0105469, the gap next to -1.0.
constexpr float blockwise8_largest_half_gap() {
  float gap = 0.0f;
  for (int i = 1; i < kCodebook8Size; ++i) {
    const float g = kCodebook8[i] - kCodebook8[i - 1];
    gap = g > gap ? g : gap;
  }
  return gap / 2.0f;
}

// 8-bit blockwise (DESIGN §5.5): per 4096 values one f32 absmax, per value the
// index of the nearest code to value/absmax. Any finite input is encodable.
// decode refuses an absmax that is NaN, infinite or negative.
struct Blockwise8Codec {
  using codec_concept = codec_t;
  static constexpr CodecId id = CodecId::blockwise8;
  static constexpr int64_t kBlockSize = kBlockwise8BlockSize;
  static constexpr float kLargestHalfGap = blockwise8_largest_half_gap();

  static Result<uint64_t> encoded_bytes(uint64_t n);
  static Status encode(std::span<const float> values, std::span<std::byte> out);
  static Status decode(std::span<const std::byte> encoded, std::span<float> values);
  // Bound: block_absmax·(0.0105469 + 2^-22) + 2^-149. The nearest code is at most
  // half the largest gap from value/absmax; the float rounding of the division,
  // of the nearest-code comparison and of the decoding multiply add at most
  // absmax·2^-23 more (each is relative 2^-24, on quantities <= 1), and a
  // subnormal product adds at most half the smallest subnormal.
  static constexpr float max_abs_error(float block_absmax, float value) {
    return block_absmax * (kLargestHalfGap + 0x1p-22f) + 0x1p-149f;
  }
};

// 4-bit blockwise (DESIGN §5.5; blockwise4.h has the codebook, the block size
// and why): per 64 values one f32 absmax, per value the 4-bit index of the
// nearest code to value/absmax. Any finite input is encodable. decode refuses an
// absmax that is NaN, infinite or negative, and a non-zero padding nibble.
struct Blockwise4Codec {
  using codec_concept = codec_t;
  static constexpr CodecId id = CodecId::blockwise4;
  static constexpr int64_t kBlockSize = kBlockwise4BlockSize;
  static constexpr float kLargestHalfGap = kLargestHalfGap4;
  static_assert(kLargestHalfGap <= 0.49f, "the rounding terms of max_abs_error assume H <= 0.49");

  static Result<uint64_t> encoded_bytes(uint64_t n);
  static Status encode(std::span<const float> values, std::span<std::byte> out);
  static Status decode(std::span<const std::byte> encoded, std::span<float> values);
  // Bound: block_absmax·(0.1519036 + 2^-22) + 2^-149. Proof, for a = block_absmax
  // (>= every |v| of the block: the encoder's absmax is their exact maximum) and
  // H = kLargestHalfGap (exact, the gap next to -1; blockwise4_test checks it):
  //  1. x = fl(v / a) has |x| <= 1 (rounding is monotone, ±1 are floats) and is
  //     within 2^-24 of v/a: relative 2^-24 of a quotient <= 1 when normal, at
  //     most 2^-150 when subnormal.
  //  2. The code c is the exact nearest to x and the codes span [-1, 1], so
  //     |c - x| <= H.
  //  3. y = fl(c·a) is within 2^-24·|c·a| <= 2^-24·a of c·a when normal, 2^-150
  //     when subnormal; |c| <= 1, so it never overflows.
  //  So |y - v| <= a·|c - x| + a·|x - v/a| + |y - c·a| <= a·(H + 2^-23) + 2^-150.
  //  (An all-zero block, a = 0, stores the zero code and decodes exactly.)
  // The bound as evaluated in float is at least that: s = fl(H + 2^-22) and the
  // product p = fl(a·s) each lose at most a relative 2^-24, and
  // (H + 2^-22)(1 - 2^-24)^2 >= H + 2^-23 + 2^-24 for H <= 0.49. A normal p needs
  // a > 2^-126, so a·2^-24 > 2^-150 covers the last term, and adding 2^-149
  // cannot round below p. A subnormal p is at least a·s - 2^-150 with
  // s >= H + 2^-23, and p + 2^-149 is then exact.
  static constexpr float max_abs_error(float block_absmax, float value) {
    return block_absmax * (kLargestHalfGap + 0x1p-22f) + 0x1p-149f;
  }
};

static_assert(Codec<NoneCodec>);
static_assert(Codec<Fp16Codec>);
static_assert(Codec<Bf16Codec>);
static_assert(Codec<Blockwise8Codec>);
static_assert(Codec<Blockwise4Codec>);

// The five codecs behind one runtime CodecId. Any id outside the enum (a
// static_cast of a wire byte) is invalid_argument, never UB.
struct StandardCodecs {
  using codec_table_concept = codec_table_t;

  static constexpr bool supports(CodecId id) {
    switch (id) {
      case CodecId::none:
      case CodecId::fp16:
      case CodecId::bf16:
      case CodecId::blockwise8:
      case CodecId::blockwise4: return true;
    }
    return false;
  }

  static Result<uint64_t> encoded_bytes(CodecId id, uint64_t n) {
    switch (id) {
      case CodecId::none: return NoneCodec::encoded_bytes(n);
      case CodecId::fp16: return Fp16Codec::encoded_bytes(n);
      case CodecId::bf16: return Bf16Codec::encoded_bytes(n);
      case CodecId::blockwise8: return Blockwise8Codec::encoded_bytes(n);
      case CodecId::blockwise4: return Blockwise4Codec::encoded_bytes(n);
    }
    return unknown(id);
  }

  static Status encode(CodecId id, std::span<const float> values, std::span<std::byte> out) {
    switch (id) {
      case CodecId::none: return NoneCodec::encode(values, out);
      case CodecId::fp16: return Fp16Codec::encode(values, out);
      case CodecId::bf16: return Bf16Codec::encode(values, out);
      case CodecId::blockwise8: return Blockwise8Codec::encode(values, out);
      case CodecId::blockwise4: return Blockwise4Codec::encode(values, out);
    }
    return unknown(id);
  }

  static Status decode(CodecId id, std::span<const std::byte> encoded, std::span<float> values) {
    switch (id) {
      case CodecId::none: return NoneCodec::decode(encoded, values);
      case CodecId::fp16: return Fp16Codec::decode(encoded, values);
      case CodecId::bf16: return Bf16Codec::decode(encoded, values);
      case CodecId::blockwise8: return Blockwise8Codec::decode(encoded, values);
      case CodecId::blockwise4: return Blockwise4Codec::decode(encoded, values);
    }
    return unknown(id);
  }

  // The codec's own bound; +inf (no bound) for an unknown id.
  static constexpr float max_abs_error(CodecId id, float block_absmax, float value) {
    switch (id) {
      case CodecId::none: return NoneCodec::max_abs_error(block_absmax, value);
      case CodecId::fp16: return Fp16Codec::max_abs_error(block_absmax, value);
      case CodecId::bf16: return Bf16Codec::max_abs_error(block_absmax, value);
      case CodecId::blockwise8: return Blockwise8Codec::max_abs_error(block_absmax, value);
      case CodecId::blockwise4: return Blockwise4Codec::max_abs_error(block_absmax, value);
    }
    return std::numeric_limits<float>::infinity();
  }

 private:
  static Status unknown(CodecId id) {
    return invalid_argument("unknown codec {} (known: 0 none, 1 fp16, 2 bf16, 3 8bit, 4 4bit)",
                            static_cast<unsigned>(id));
  }
};

static_assert(CodecTable<StandardCodecs>);

}  // namespace swarm::compression
