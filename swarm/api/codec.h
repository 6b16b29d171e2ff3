// codec: the Codec concept (one tensor encoding with a declared worst-case error)
// and the CodecTable concept (runtime dispatch over the codecs a process offers).
//
// A codec turns f32 values into the bytes of one wire frame and back (DESIGN §3,
// §5.5). It is a type with static members only, and opts in explicitly with
// `using codec_concept = swarm::codec_t;` (the right member names without the tag
// are not enough). The contract of every codec:
//   - encoded_bytes(n): the exact frame size for n values; an error (never a
//     wrapped count) when it does not fit in 64 bits. n = 0 gives 0 bytes.
//   - encode(values, out): out.size() must equal encoded_bytes(values.size()).
//     Any NaN or ±inf is refused with invalid_argument naming the element index;
//     a finite value the format cannot hold (|x| > 65504 for fp16) is refused
//     with out_of_range. On an error out's contents are unspecified, but no
//     codec ever writes a NaN or infinite scale.
//   - decode(encoded, values): encoded comes from an untrusted peer. Its size
//     must equal encoded_bytes(values.size()), and a NaN/inf code or scale (a
//     forged NaN absmax, an fp16 inf bit pattern) is refused with
//     invalid_argument, so decoded values are always finite.
//   - max_abs_error(block_absmax, value): the declared worst case of
//     |decode(encode(x))_i - value| for one finite, encodable value whose block's
//     largest magnitude is block_absmax (codecs without blocks ignore it).
//
// Runtimes (peer, trainer, averaging) are templates over a CodecTable, which
// dispatches on the CodecId a stage declares in its info, so they never include
// an implementation (swarm/compression provides StandardCodecs):
//
//   template <swarm::CodecTable Codecs>
//   swarm::Status send(swarm::CodecId id, std::span<const float> x, std::vector<std::byte>& frame) {
//     SWARM_ASSIGN_OR_RETURN(uint64_t bytes, Codecs::encoded_bytes(id, x.size()));
//     frame.resize(bytes);
//     return Codecs::encode(id, x, frame);
//   }
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "swarm/core/status.h"

namespace swarm {

// The numbers are wire codes, the same as swarm/wire/wire.h's wire::Codec.
enum class CodecId : uint8_t { none = 0, fp16 = 1, bf16 = 2, blockwise8 = 3, blockwise4 = 4 };
inline constexpr uint8_t kMaxCodecId = 4;

inline constexpr CodecId kAllCodecIds[] = {CodecId::none, CodecId::fp16, CodecId::bf16, CodecId::blockwise8,
                                           CodecId::blockwise4};
static_assert(std::size(kAllCodecIds) == kMaxCodecId + 1u, "kAllCodecIds lists every code 0..kMaxCodecId");

// The names the command line uses: --codec 8bit|4bit|fp16|bf16|none.
constexpr std::string_view codec_name(CodecId id) {
  switch (id) {
    case CodecId::none: return "none";
    case CodecId::fp16: return "fp16";
    case CodecId::bf16: return "bf16";
    case CodecId::blockwise8: return "8bit";
    case CodecId::blockwise4: return "4bit";
  }
  return "invalid";
}

// Exactly the names codec_name returns; anything else (case included) is nullopt.
constexpr std::optional<CodecId> codec_from_name(std::string_view name) {
  for (CodecId id : kAllCodecIds) {
    if (codec_name(id) == name) return id;
  }
  return std::nullopt;
}

// Every name, in kAllCodecIds order: what a command-line check accepts, built
// from kAllCodecIds so that a new codec cannot be left out of it.
inline std::vector<std::string> all_codec_names() {
  std::vector<std::string> names;
  for (CodecId id : kAllCodecIds) names.emplace_back(codec_name(id));
  return names;
}

// The same names for a message: "none, fp16, bf16, 8bit or 4bit".
inline std::string all_codec_names_text() {
  std::string text;
  const std::size_t count = std::size(kAllCodecIds);
  for (std::size_t i = 0; i < count; ++i) {
    if (i > 0) text += i + 1 == count ? " or " : ", ";
    text += codec_name(kAllCodecIds[i]);
  }
  return text;
}

// For codes read off the wire: an unknown code is nullopt, not UB.
constexpr std::optional<CodecId> codec_from_code(uint8_t code) {
  if (code > kMaxCodecId) return std::nullopt;
  return static_cast<CodecId>(code);
}

struct codec_t {};

template <typename C>
concept Codec =
    std::same_as<typename C::codec_concept, codec_t> &&
    std::same_as<std::remove_cv_t<decltype(C::id)>, CodecId> &&
    requires(uint64_t n, std::span<const float> values, std::span<std::byte> out,
             std::span<const std::byte> encoded, std::span<float> decoded, float absmax, float value) {
      typename std::integral_constant<CodecId, C::id>;  // id is a compile-time constant
      { C::encoded_bytes(n) } -> std::same_as<Result<uint64_t>>;
      { C::encode(values, out) } -> std::same_as<Status>;
      { C::decode(encoded, decoded) } -> std::same_as<Status>;
      { C::max_abs_error(absmax, value) } -> std::same_as<float>;
    };

struct codec_table_t {};

// supports(id) says whether the table implements id; the other three return
// invalid_argument for an id it does not support, and otherwise behave as that
// codec's own members.
template <typename T>
concept CodecTable =
    std::same_as<typename T::codec_table_concept, codec_table_t> &&
    requires(CodecId id, uint64_t n, std::span<const float> values, std::span<std::byte> out,
             std::span<const std::byte> encoded, std::span<float> decoded) {
      { T::supports(id) } -> std::same_as<bool>;
      { T::encoded_bytes(id, n) } -> std::same_as<Result<uint64_t>>;
      { T::encode(id, values, out) } -> std::same_as<Status>;
      { T::decode(id, encoded, decoded) } -> std::same_as<Status>;
    };

}  // namespace swarm
