// Which types model the Codec and CodecTable concepts, and which do not; and the
// codec names of the command line (--codec 8bit|4bit|fp16|bf16|none).
#include <doctest/doctest.h>

#include <cstddef>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "swarm/api/codec.h"
#include "swarm/compression/codecs.h"

namespace swarm {
namespace {

using compression::Bf16Codec;
using compression::Blockwise4Codec;
using compression::Blockwise8Codec;
using compression::Fp16Codec;
using compression::NoneCodec;
using compression::StandardCodecs;

// Every member a codec needs, but no opt-in tag: not a codec.
struct UntaggedCodec {
  static constexpr CodecId id = CodecId::none;
  static Result<uint64_t> encoded_bytes(uint64_t n);
  static Status encode(std::span<const float> values, std::span<std::byte> out);
  static Status decode(std::span<const std::byte> encoded, std::span<float> values);
  static float max_abs_error(float block_absmax, float value);
};

// The same members, and the tag: a codec (the control for the cases below).
struct TaggedCodec : UntaggedCodec {
  using codec_concept = codec_t;
};

// The wrong tag.
struct CodecWithTableTag : UntaggedCodec {
  using codec_concept = codec_table_t;
};

// Tagged, but encode takes doubles.
struct WrongEncodeInput : UntaggedCodec {
  using codec_concept = codec_t;
  static Status encode(std::span<const double> values, std::span<std::byte> out);
};

// Tagged, but decode reports failure as a bool.
struct WrongDecodeResult : UntaggedCodec {
  using codec_concept = codec_t;
  static bool decode(std::span<const std::byte> encoded, std::span<float> values);
};

// Tagged, but encoded_bytes cannot fail (no overflow report).
struct UncheckedSize : UntaggedCodec {
  using codec_concept = codec_t;
  static uint64_t encoded_bytes(uint64_t n);
};

// Tagged, but the error bound is a double.
struct DoubleBound : UntaggedCodec {
  using codec_concept = codec_t;
  static double max_abs_error(float block_absmax, float value);
};

// Tagged, but the id is a plain integer.
struct IntegerId : UntaggedCodec {
  using codec_concept = codec_t;
  static constexpr int id = 1;
};

// Tagged, but the id is not a compile-time constant.
struct MutableId : UntaggedCodec {
  using codec_concept = codec_t;
  static inline CodecId id = CodecId::fp16;
};

// Tagged, but the members need an object: codecs are stateless types.
struct MemberFunctions {
  using codec_concept = codec_t;
  static constexpr CodecId id = CodecId::none;
  Result<uint64_t> encoded_bytes(uint64_t n) const;
  Status encode(std::span<const float> values, std::span<std::byte> out) const;
  Status decode(std::span<const std::byte> encoded, std::span<float> values) const;
  float max_abs_error(float block_absmax, float value) const;
};

static_assert(Codec<NoneCodec>);
static_assert(Codec<Fp16Codec>);
static_assert(Codec<Bf16Codec>);
static_assert(Codec<Blockwise8Codec>);
static_assert(Codec<Blockwise4Codec>);
static_assert(Codec<TaggedCodec>);
static_assert(!Codec<UntaggedCodec>);
static_assert(!Codec<CodecWithTableTag>);
static_assert(!Codec<WrongEncodeInput>);
static_assert(!Codec<WrongDecodeResult>);
static_assert(!Codec<UncheckedSize>);
static_assert(!Codec<DoubleBound>);
static_assert(!Codec<IntegerId>);
static_assert(!Codec<MutableId>);
static_assert(!Codec<MemberFunctions>);
static_assert(!Codec<int>);

static_assert(NoneCodec::id == CodecId::none);
static_assert(Fp16Codec::id == CodecId::fp16);
static_assert(Bf16Codec::id == CodecId::bf16);
static_assert(Blockwise8Codec::id == CodecId::blockwise8);
static_assert(Blockwise4Codec::id == CodecId::blockwise4);

// Every member a table needs, but no tag.
struct UntaggedTable {
  static bool supports(CodecId id);
  static Result<uint64_t> encoded_bytes(CodecId id, uint64_t n);
  static Status encode(CodecId id, std::span<const float> values, std::span<std::byte> out);
  static Status decode(CodecId id, std::span<const std::byte> encoded, std::span<float> values);
};

struct TaggedTable : UntaggedTable {
  using codec_table_concept = codec_table_t;
};

// Tagged, but it dispatches on a raw wire byte instead of a CodecId.
struct ByteDispatchTable {
  using codec_table_concept = codec_table_t;
  static bool supports(CodecId id);
  static Result<uint64_t> encoded_bytes(CodecId id, uint64_t n);
  static Status encode(uint8_t id, std::span<const float> values, std::span<std::byte> out);
  static Status decode(CodecId id, std::span<const std::byte> encoded, std::span<float> values);
};

// Tagged, but without supports().
struct TableWithoutSupports {
  using codec_table_concept = codec_table_t;
  static Result<uint64_t> encoded_bytes(CodecId id, uint64_t n);
  static Status encode(CodecId id, std::span<const float> values, std::span<std::byte> out);
  static Status decode(CodecId id, std::span<const std::byte> encoded, std::span<float> values);
};

static_assert(CodecTable<StandardCodecs>);
static_assert(CodecTable<TaggedTable>);
static_assert(!CodecTable<UntaggedTable>);
static_assert(!CodecTable<ByteDispatchTable>);
static_assert(!CodecTable<TableWithoutSupports>);
static_assert(!CodecTable<int>);
// A codec is not a table, and a table is not a codec.
static_assert(!CodecTable<NoneCodec>);
static_assert(!CodecTable<Blockwise8Codec>);
static_assert(!CodecTable<Blockwise4Codec>);
static_assert(!Codec<StandardCodecs>);
static_assert(!Codec<TaggedTable>);

static_assert(StandardCodecs::supports(CodecId::none));
static_assert(StandardCodecs::supports(CodecId::fp16));
static_assert(StandardCodecs::supports(CodecId::bf16));
static_assert(StandardCodecs::supports(CodecId::blockwise8));
static_assert(StandardCodecs::supports(CodecId::blockwise4));
static_assert(!StandardCodecs::supports(static_cast<CodecId>(kMaxCodecId + 1)));

// The wire codes are part of the protocol: they never change.
static_assert(static_cast<uint8_t>(CodecId::none) == 0);
static_assert(static_cast<uint8_t>(CodecId::fp16) == 1);
static_assert(static_cast<uint8_t>(CodecId::bf16) == 2);
static_assert(static_cast<uint8_t>(CodecId::blockwise8) == 3);
static_assert(static_cast<uint8_t>(CodecId::blockwise4) == 4);
static_assert(kMaxCodecId == 4);
static_assert(std::size(kAllCodecIds) == 5);
// The 4-bit codec's compile-time facts: its bound is a constant expression, and
// its block and frame sizes are the ones blockwise4.h states.
static_assert(Blockwise4Codec::kBlockSize == 64);
static_assert(Blockwise4Codec::max_abs_error(1.0f, 0.5f) > 0.1519f && Blockwise4Codec::max_abs_error(1.0f, 0.5f) < 0.1520f);
static_assert(Blockwise4Codec::max_abs_error(0.0f, 0.0f) == 0x1p-149f);

// What a runtime looks like: generic over the table, no implementation included.
template <CodecTable Codecs>
Status round_trip(CodecId id, std::span<const float> in, std::span<float> out) {
  SWARM_ASSIGN_OR_RETURN(uint64_t bytes, Codecs::encoded_bytes(id, in.size()));
  std::vector<std::byte> frame(bytes);
  SWARM_RETURN_IF_ERROR(Codecs::encode(id, in, frame));
  return Codecs::decode(id, frame, out);
}

TEST_CASE("code written against CodecTable runs on StandardCodecs") {
  const std::vector<float> in = {1024.0f, -1024.0f, 0.0f, 1024.0f, -0.0f};
  for (CodecId id : kAllCodecIds) {
    INFO(codec_name(id));
    std::vector<float> out(in.size());
    REQUIRE(round_trip<StandardCodecs>(id, in, out).is_ok());
    CHECK(out == in);  // all five represent these exactly (8bit, 4bit: ±absmax and 0 are codes)
  }
}

TEST_CASE("codec names: the --codec flag's five names round-trip, nothing else parses") {
  CHECK(codec_name(CodecId::none) == "none");
  CHECK(codec_name(CodecId::fp16) == "fp16");
  CHECK(codec_name(CodecId::bf16) == "bf16");
  CHECK(codec_name(CodecId::blockwise8) == "8bit");
  CHECK(codec_name(CodecId::blockwise4) == "4bit");
  for (CodecId id : kAllCodecIds) {
    INFO(codec_name(id));
    REQUIRE(codec_from_name(codec_name(id)).has_value());
    CHECK(*codec_from_name(codec_name(id)) == id);
    REQUIRE(codec_from_code(static_cast<uint8_t>(id)).has_value());
    CHECK(*codec_from_code(static_cast<uint8_t>(id)) == id);
  }
  for (std::string_view bad : {"int8", "8BIT", "FP16", "blockwise8", "8bit ", " none", "", "f16", "fp32", "int4",
                               "nf4", "4BIT", "blockwise4", "4 bit"}) {
    INFO("name '" << std::string(bad) << "'");
    CHECK_FALSE(codec_from_name(bad).has_value());
  }
  CHECK(codec_name(static_cast<CodecId>(7)) == "invalid");
  CHECK(codec_from_code(4) == CodecId::blockwise4);
  CHECK_FALSE(codec_from_code(5).has_value());
  CHECK_FALSE(codec_from_code(255).has_value());
  static_assert(codec_from_name("8bit") == CodecId::blockwise8);  // usable at compile time
  static_assert(codec_from_name("4bit") == CodecId::blockwise4);
}

TEST_CASE("the name lists for the command line come from kAllCodecIds") {
  const std::vector<std::string> names = all_codec_names();
  REQUIRE(names.size() == std::size(kAllCodecIds));
  for (std::size_t i = 0; i < names.size(); ++i) CHECK(names[i] == codec_name(kAllCodecIds[i]));
  CHECK(all_codec_names_text() == "none, fp16, bf16, 8bit or 4bit");
}

}  // namespace
}  // namespace swarm
