#include "swarm/wire/wire.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <exception>
#include <optional>
#include <sstream>
#include <streambuf>

#include <cereal/archives/binary.hpp>
#include <fmt/core.h>

namespace swarm::wire {
namespace {

// Cereal's binary archive writes native byte order; the wire format is
// little-endian, which every machine this project targets is.
static_assert(std::endian::native == std::endian::little, "the wire format assumes a little-endian host");

// Reads a frame in place: copying the header into an istringstream would be
// an allocation sized by the peer.
class FrameBuf : public std::streambuf {
 public:
  explicit FrameBuf(std::string_view bytes) {
    char* begin = const_cast<char*>(bytes.data());  // get area only: never written
    setg(begin, begin, begin + bytes.size());
  }
  std::size_t remaining() const { return static_cast<std::size_t>(egptr() - gptr()); }
};

enum class Rejection { bad_header, bad_version, bad_kind, bad_dtype, bad_shape, too_large,
                       frame_mismatch, misaligned, non_finite };

struct Rejected {
  Rejection reason;
  Status status;
};

void count(ValidationCounters& counters, Rejection reason) {
  switch (reason) {
    case Rejection::bad_header: ++counters.bad_header; break;
    case Rejection::bad_version: ++counters.bad_version; break;
    case Rejection::bad_kind: ++counters.bad_kind; break;
    case Rejection::bad_dtype: ++counters.bad_dtype; break;
    case Rejection::bad_shape: ++counters.bad_shape; break;
    case Rejection::too_large: ++counters.too_large; break;
    case Rejection::frame_mismatch: ++counters.frame_mismatch; break;
    case Rejection::misaligned: ++counters.misaligned; break;
    case Rejection::non_finite: ++counters.non_finite; break;
  }
}

// Index of the first NaN/Inf element, or -1. An all-ones exponent is both.
int64_t first_non_finite(DType dtype, std::string_view payload) {
  const std::size_t width = size_of(dtype);
  const std::size_t count = payload.size() / width;
  for (std::size_t i = 0; i < count; ++i) {
    if (dtype == DType::f32) {
      uint32_t bits;
      std::memcpy(&bits, payload.data() + i * 4, 4);
      if ((bits & 0x7f800000u) == 0x7f800000u) return static_cast<int64_t>(i);
    } else {
      uint16_t bits;
      std::memcpy(&bits, payload.data() + i * 2, 2);
      uint16_t exponent = dtype == DType::bf16 ? 0x7f80u : 0x7c00u;
      if ((bits & exponent) == exponent) return static_cast<int64_t>(i);
    }
  }
  return -1;
}

uint64_t blocks_of(uint64_t numel, uint64_t block) { return numel / block + (numel % block != 0); }

bool is_blockwise(Codec codec) { return codec == Codec::blockwise8 || codec == Codec::blockwise4; }

// The part of a lossy payload that can hold a NaN/Inf, read as which dtype: the
// half-precision values, or a blockwise codec's block scales (its codes are
// indices, always finite). The payload has its expected size already.
std::pair<DType, std::string_view> lossy_checked_part(Codec codec, uint64_t numel, std::string_view payload) {
  if (codec == Codec::fp16) return {DType::f16, payload};
  if (codec == Codec::bf16) return {DType::bf16, payload};
  const uint64_t block = codec == Codec::blockwise4 ? kBlockwise4BlockSize : kBlockwise8BlockSize;
  return {DType::f32, payload.substr(0, static_cast<std::size_t>(blocks_of(numel, block) * 4))};
}

// Returns the rejection (as a value) or fills `out`; kept separate so both
// decode_message overloads share one list of checks.
std::optional<Rejected> decode_into(const std::vector<std::string_view>& frames, const Limits& limits,
                                    DecodedMessage& out) {
  auto fail = [](Rejection reason, Status status) {
    return std::optional<Rejected>(Rejected{reason, std::move(status)});
  };
  // 1. Frame-level sizes: cheap, and they bound everything that follows.
  if (frames.empty()) return fail(Rejection::frame_mismatch, invalid_argument("message has no frames"));
  if (frames[0].size() > limits.max_header_bytes) {
    return fail(Rejection::too_large, resource_exhausted("header frame of {} bytes exceeds the limit of {}",
                                                         frames[0].size(), limits.max_header_bytes));
  }
  uint64_t total_bytes = 0;
  for (std::string_view frame : frames) {
    if (__builtin_add_overflow(total_bytes, frame.size(), &total_bytes)) total_bytes = UINT64_MAX;
  }
  if (total_bytes > limits.max_message_bytes) {
    return fail(Rejection::too_large, resource_exhausted("message of {} bytes exceeds the limit of {}",
                                                         total_bytes, limits.max_message_bytes));
  }

  // 2. The header itself; its loader bounds every count it reads.
  MessageHeader& header = out.header;
  FrameBuf buffer(frames[0]);
  std::istream stream(&buffer);
  try {
    cereal::BinaryInputArchive archive(stream);
    archive(header);
  } catch (const std::exception& error) {
    return fail(Rejection::bad_header, invalid_argument("malformed message header: {}", error.what()));
  } catch (...) {
    return fail(Rejection::bad_header, invalid_argument("malformed message header"));
  }
  if (header.version != kWireVersion) {
    return fail(Rejection::bad_version, unimplemented("wire version {} is not supported (this peer speaks {})",
                                                      header.version, kWireVersion));
  }
  if (buffer.remaining() != 0) {
    return fail(Rejection::bad_header,
                invalid_argument("{} unexpected bytes after the message header", buffer.remaining()));
  }
  if (header.deadline_unix_ms < 0) {
    return fail(Rejection::bad_header, invalid_argument("negative deadline {}", header.deadline_unix_ms));
  }
  if (header.reply_codec > kMaxCodecCode) {
    return fail(Rejection::bad_dtype, invalid_argument("unknown reply codec {}", static_cast<unsigned>(header.reply_codec)));
  }
  if (static_cast<uint8_t>(header.kind) > kMaxMessageKindCode) {
    return fail(Rejection::bad_kind,
                invalid_argument("unknown message kind {}", static_cast<unsigned>(header.kind)));
  }
  if (header.error_text.size() > limits.max_error_text) {
    return fail(Rejection::too_large, resource_exhausted("error text of {} bytes exceeds the limit of {}",
                                                         header.error_text.size(), limits.max_error_text));
  }
  if (header.tensors.size() > limits.max_tensors) {
    return fail(Rejection::too_large, resource_exhausted("{} tensors exceed the limit of {}",
                                                         header.tensors.size(), limits.max_tensors));
  }
  if (header.tensors.size() != frames.size() - 1) {
    return fail(Rejection::frame_mismatch,
                invalid_argument("header lists {} tensors but {} tensor frames arrived",
                                 header.tensors.size(), frames.size() - 1));
  }

  // 3. Each tensor against its frame.
  const uint32_t max_rank = std::min<uint32_t>(limits.max_rank, Shape::kMaxRank);
  out.tensors.reserve(header.tensors.size());  // bounded by max_tensors above
  for (std::size_t i = 0; i < header.tensors.size(); ++i) {
    const TensorHeader& tensor = header.tensors[i];
    std::string_view payload = frames[i + 1];
    std::optional<DType> dtype = dtype_from_code(tensor.dtype_code);
    if (!dtype) {
      return fail(Rejection::bad_dtype,
                  invalid_argument("tensor {}: unknown dtype code {}", i, static_cast<unsigned>(tensor.dtype_code)));
    }
    if (tensor.codec > kMaxCodecCode) {
      return fail(Rejection::bad_dtype,
                  invalid_argument("tensor {}: unknown codec {}", i, static_cast<unsigned>(tensor.codec)));
    }
    const Codec codec = static_cast<Codec>(tensor.codec);
    if (tensor.dims.size() > max_rank) {
      return fail(Rejection::bad_shape,
                  invalid_argument("tensor {}: rank {} exceeds the limit of {}", i, tensor.dims.size(), max_rank));
    }
    Result<Shape> shape = Shape::from_dims(tensor.dims);
    if (!shape) {
      return fail(Rejection::bad_shape, invalid_argument("tensor {}: {}", i, shape.status().message()));
    }
    const uint64_t numel = static_cast<uint64_t>(shape->numel());
    if (numel > limits.max_tensor_elements) {
      return fail(Rejection::too_large,
                  resource_exhausted("tensor {}: {} elements exceed the limit of {}", i, numel,
                                     limits.max_tensor_elements));
    }
    Result<uint64_t> expected = expected_payload_bytes(*dtype, numel, codec);
    if (!expected) {
      return fail(Rejection::bad_dtype, invalid_argument("tensor {}: {}", i, expected.status().message()));
    }
    if (tensor.payload_bytes != *expected) {
      return fail(Rejection::frame_mismatch,
                  invalid_argument("tensor {}: header claims {} payload bytes, shape {} needs {}", i,
                                   tensor.payload_bytes, shape->to_string(), *expected));
    }
    if (payload.size() != *expected) {
      return fail(Rejection::frame_mismatch,
                  invalid_argument("tensor {}: frame has {} bytes, shape {} needs {}", i, payload.size(),
                                   shape->to_string(), *expected));
    }
    if (codec != Codec::none) {
      // Lossy payloads are checked where a forged one could decode to NaN/Inf: the
      // half-precision values themselves, or the blockwise scales.
      const auto [bad_dtype, checked] = lossy_checked_part(codec, numel, payload);
      const int64_t bad = first_non_finite(bad_dtype, checked);
      if (bad >= 0) {
        return fail(Rejection::non_finite,
                    invalid_argument("tensor {}: {} element {} is NaN or Inf", i,
                                     is_blockwise(codec) ? "block scale" : "encoded", bad));
      }
    }
    DecodedTensor decoded{*dtype, codec, *shape, payload, TensorView()};
    if (codec == Codec::none) {
      const std::size_t alignment = size_of(*dtype);
      if (!payload.empty() && reinterpret_cast<std::uintptr_t>(payload.data()) % alignment != 0) {
        return fail(Rejection::misaligned,
                    failed_precondition("tensor {}: {} payload at {} is not {}-byte aligned; the transport "
                                        "must deliver aligned frames",
                                        i, dtype_name(*dtype), static_cast<const void*>(payload.data()),
                                        alignment));
      }
      if (is_floating(*dtype)) {
        int64_t bad = first_non_finite(*dtype, payload);
        if (bad >= 0) {
          return fail(Rejection::non_finite,
                      invalid_argument("tensor {}: element {} is NaN or Inf", i, bad));
        }
      }
      decoded.view = TensorView(const_cast<char*>(payload.data()), *dtype, *shape);
    }
    out.tensors.push_back(decoded);
  }
  return std::nullopt;
}

// Cuts at a UTF-8 character boundary so the peer never sees half a character.
std::string truncate_text(std::string_view text, std::size_t limit) {
  if (text.size() <= limit) return std::string(text);
  std::size_t end = limit;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xc0u) == 0x80u) --end;
  return std::string(text.substr(0, end));
}

}  // namespace

Result<uint64_t> expected_payload_bytes(DType dtype, uint64_t numel, Codec codec) {
  uint64_t bytes = 0;
  switch (codec) {
    case Codec::none:
      if (__builtin_mul_overflow(numel, static_cast<uint64_t>(size_of(dtype)), &bytes)) break;
      return bytes;
    case Codec::fp16:
    case Codec::bf16:
      if (dtype != DType::f32) {
        return invalid_argument("codec {} applies to f32 tensors, not {}", static_cast<unsigned>(codec),
                                dtype_name(dtype));
      }
      if (__builtin_mul_overflow(numel, uint64_t{2}, &bytes)) break;
      return bytes;
    case Codec::blockwise8: {
      if (dtype != DType::f32) {
        return invalid_argument("codec blockwise8 applies to f32 tensors, not {}", dtype_name(dtype));
      }
      const uint64_t blocks = blocks_of(numel, kBlockwise8BlockSize);
      if (__builtin_add_overflow(numel, blocks * 4, &bytes)) break;  // blocks*4 <= numel/1024: no overflow
      return bytes;
    }
    case Codec::blockwise4: {
      if (dtype != DType::f32) {
        return invalid_argument("codec blockwise4 applies to f32 tensors, not {}", dtype_name(dtype));
      }
      // 4·ceil(numel/64) + ceil(numel/2) <= 2^63 + 2^60: it fits for every
      // numel; checked anyway, as for the other codecs.
      const uint64_t scales = blocks_of(numel, kBlockwise4BlockSize) * 4;  // <= numel/16 + 4: no overflow
      if (__builtin_add_overflow(scales, numel / 2 + numel % 2, &bytes)) break;
      return bytes;
    }
    default:
      return invalid_argument("unknown codec {}", static_cast<unsigned>(codec));
  }
  return out_of_range("{} elements of {} exceed 2^64 bytes", numel, dtype_name(dtype));
}

std::string serialize_header(const MessageHeader& header) {
  std::ostringstream stream;
  {
    cereal::BinaryOutputArchive archive(stream);
    archive(header);
  }
  return std::move(stream).str();
}

Result<Frames> encode_message(const MessageHeader& header, std::span<const TensorView> tensors) {
  if (tensors.size() > kMaxWireTensors) {
    return invalid_argument("{} tensors exceed the wire format's bound of {}", tensors.size(), kMaxWireTensors);
  }
  std::vector<EncodedTensor> encoded;
  encoded.reserve(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorView& tensor = tensors[i];
    if (tensor.device() != Device::cpu) {
      return invalid_argument("tensor {} is on {}; copy it to the CPU before sending", i,
                              device_name(tensor.device()));
    }
    if (tensor.raw_data() == nullptr && tensor.numel() != 0) {
      return invalid_argument("tensor {} has no data", i);
    }
    try {
      encoded.push_back({tensor.dtype(), Codec::none,
                         std::vector<int64_t>(tensor.shape().dims().begin(), tensor.shape().dims().end()),
                         Frame(static_cast<const char*>(tensor.raw_data()), tensor.size_bytes())});
    } catch (const std::exception& error) {
      return resource_exhausted("encoding a message: {}", error.what());
    }
  }
  return encode_message_payloads(header, encoded);
}

Result<Frames> encode_message_payloads(const MessageHeader& header, std::span<const EncodedTensor> tensors) {
  if (tensors.size() > kMaxWireTensors) {
    return invalid_argument("{} tensors exceed the wire format's bound of {}", tensors.size(), kMaxWireTensors);
  }
  if (header.error_text.size() > kMaxWireText) {
    return invalid_argument("error text of {} bytes exceeds the wire format's bound of {}",
                            header.error_text.size(), kMaxWireText);
  }
  if (header.credential.size() > kMaxWireCredential) {
    return invalid_argument("a credential of {} bytes exceeds the wire format's bound of {}",
                            header.credential.size(), kMaxWireCredential);
  }
  if (header.hop_chain.size() > kMaxWireHopChain) {
    return invalid_argument("a hop chain of {} bytes exceeds the wire format's bound of {}", header.hop_chain.size(),
                            kMaxWireHopChain);
  }
  if (header.reply_to.size() > kMaxWireReplyTo) {
    return invalid_argument("a reply_to of {} bytes exceeds the wire format's bound of {}", header.reply_to.size(),
                            kMaxWireReplyTo);
  }
  MessageHeader filled = header;
  filled.tensors.clear();
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const EncodedTensor& tensor = tensors[i];
    SWARM_ASSIGN_OR_RETURN(Shape shape, Shape::from_dims(tensor.dims));
    SWARM_ASSIGN_OR_RETURN(uint64_t expected,
                           expected_payload_bytes(tensor.dtype, static_cast<uint64_t>(shape.numel()), tensor.codec));
    if (tensor.payload.size() != expected) {
      return invalid_argument("tensor {}: payload of {} bytes, shape {} with codec {} needs {}", i,
                              tensor.payload.size(), shape.to_string(), codec_name(tensor.codec), expected);
    }
    filled.tensors.push_back({static_cast<uint8_t>(tensor.dtype), static_cast<uint8_t>(tensor.codec), tensor.dims,
                              expected});
  }
  Frames frames;
  frames.parts.reserve(tensors.size() + 1);
  try {
    frames.parts.push_back(serialize_header(filled));
  } catch (const std::exception& error) {
    return resource_exhausted("encoding a message: {}", error.what());
  }
  for (const EncodedTensor& tensor : tensors) frames.parts.push_back(tensor.payload);
  return frames;
}

Result<DecodedMessage> decode_message(const std::vector<std::string_view>& frames, const Limits& limits,
                                      ValidationCounters& counters) {
  DecodedMessage message;
  std::optional<Rejected> rejected;
  try {
    rejected = decode_into(frames, limits, message);
  } catch (const std::exception& error) {  // bad_alloc of a bounded vector: not the peer's fault
    return resource_exhausted("decoding a message: {}", error.what());
  }
  if (rejected) {
    count(counters, rejected->reason);
    return rejected->status;
  }
  return message;
}

Result<DecodedMessage> decode_message(const std::vector<std::string_view>& frames, const Limits& limits) {
  ValidationCounters unused;
  return decode_message(frames, limits, unused);
}

Frames make_error_reply(uint64_t request_id, uint32_t stage, const Status& status) {
  MessageHeader header;
  header.kind = MessageKind::error;
  header.stage = stage;
  header.request_id = request_id;
  header.error_code = static_cast<uint16_t>(status.code());
  header.error_text = truncate_text(status.message(), Limits{}.max_error_text);
  Frames frames;
  frames.parts.push_back(serialize_header(header));
  return frames;
}

Status status_from_error_reply(const MessageHeader& header) {
  if (header.kind != MessageKind::error) {
    return internal("expected an error reply, got message kind {}", static_cast<unsigned>(header.kind));
  }
  if (header.error_code == 0 || header.error_code > static_cast<uint16_t>(StatusCode::internal)) {
    return internal("peer sent an error reply with code {}: {}", header.error_code, header.error_text);
  }
  return Status(static_cast<StatusCode>(header.error_code), header.error_text);
}

Status validate_against_spec(const MessageHeader& header, const TensorListSpec& spec) {
  if (header.stage != spec.stage) {
    return invalid_argument("message is for stage {}, this peer serves stage {}", header.stage, spec.stage);
  }
  if (header.tensors.size() != spec.inputs.size()) {
    return invalid_argument("stage {} takes {} tensors, message has {}", spec.stage, spec.inputs.size(),
                            header.tensors.size());
  }
  for (std::size_t i = 0; i < spec.inputs.size(); ++i) {
    const auto& [dtype, dims] = spec.inputs[i];
    const TensorHeader& tensor = header.tensors[i];
    if (tensor.dtype_code != static_cast<uint8_t>(dtype)) {
      return invalid_argument("tensor {}: stage {} expects {}, got dtype code {}", i, spec.stage,
                              dtype_name(dtype), static_cast<unsigned>(tensor.dtype_code));
    }
    if (tensor.dims.size() != dims.size()) {
      return invalid_argument("tensor {}: stage {} expects rank {}, got {}", i, spec.stage, dims.size(),
                              tensor.dims.size());
    }
    for (std::size_t axis = 0; axis < dims.size(); ++axis) {
      if (dims[axis] != -1 && dims[axis] != tensor.dims[axis]) {
        return invalid_argument("tensor {}: stage {} expects dim {} = {}, got {}", i, spec.stage, axis,
                                dims[axis], tensor.dims[axis]);
      }
    }
  }
  return Status::ok();
}

}  // namespace swarm::wire
