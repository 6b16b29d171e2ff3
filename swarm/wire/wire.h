// wire: builds and validates the frames of one peer-to-peer message.
//
// A message is a list of frames: frame 0 is a small Cereal-binary MessageHeader,
// frames 1..n hold the raw bytes of tensor i-1 (tensors never go through Cereal).
// Transports carry the frames; this package only builds them and, on receipt,
// checks every field before trusting or allocating anything it claims.
//
//   SWARM_ASSIGN_OR_RETURN(swarm::wire::Frames out, swarm::wire::encode_message(header, views));
//   auto got = swarm::wire::decode_message(out.views(), swarm::wire::Limits{}, counters);
//   if (!got) send(swarm::wire::make_error_reply(id, stage, got.status()));
//   float first = got->tensors[0].view.span<const float>()[0];
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <cereal/cereal.hpp>
#include <cereal/details/helpers.hpp>

#include "swarm/api/codec.h"
#include "swarm/core/codebook8.h"
#include "swarm/core/dtype.h"
#include "swarm/core/shape.h"
#include "swarm/core/status.h"
#include "swarm/core/tensor.h"
#include "swarm/core/frame.h"

namespace swarm::wire {

// 2: reply_codec; 3: microbatch_id, deadline_unix_ms; 4: waited_us (withdrawn in 5); 5: credential;
// 6: hop_chain; 7: reply_to, return_id, pipeline_result
constexpr uint16_t kWireVersion = 7;

enum class MessageKind : uint8_t {
  forward = 0,
  backward = 1,
  result = 2,
  error = 3,
  info = 4,
  state_chunk = 5,
  allreduce_part = 6,
  ping = 7,
  pipeline = 8,  // peer to peer: the rest of the pipeline from this stage on, forward and backward
  // Peer to peer, answered at once: a pipeline's outcome (its input gradient and
  // loss, or its error), sent as a request of its own back to the peer that passed
  // it on (header.reply_to of the pipeline named it, header.return_id is its token).
  pipeline_result = 9,
};
constexpr uint8_t kMaxMessageKindCode = 9;

// How a tensor's payload is encoded (the codes of swarm/api/codec.h); the
// TensorHeader dtype is the logical (source) dtype, which must be f32 for the
// lossy codecs.
using Codec = CodecId;
constexpr uint8_t kMaxCodecCode = kMaxCodecId;
// The blockwise codecs: the per-block f32 absmax values ("block scales") first
// (4-byte aligned at the frame's start), then the codes; a block is this many values.
// blockwise8: one byte per element.
constexpr uint64_t kBlockwise8BlockSize = static_cast<uint64_t>(compression::kBlockwise8BlockSize);
// blockwise4: two elements per byte, low nibble first (ceil(numel/2) bytes). The
// same value as compression::kBlockwise4BlockSize (swarm/compression/blockwise4.h),
// which wire does not depend on; tests/compression/codecs_test.cc checks that the
// sizes agree for every codec.
constexpr uint64_t kBlockwise4BlockSize = 64;

// Absolute bounds of the header format, far above any sane Limits. The
// decoder refuses a count beyond them before it reserves anything, so a
// forged count cannot make it allocate; Limits then apply the real policy.
constexpr uint32_t kMaxWireTensors = 1024;
constexpr uint32_t kMaxWireRank = 64;
constexpr uint32_t kMaxWireText = 64 << 10;
// A credential is one certificate's text (swarm/security/certificate.h, at most 400).
constexpr uint32_t kMaxWireCredential = 512;
// A hop chain (swarm/security/hop_chain.h) is some 300 bytes a link; a pipeline has
// a link per stage it crossed.
constexpr uint32_t kMaxWireHopChain = 16 << 10;
// A reply_to is a peer id (registry records bound theirs far lower).
constexpr uint32_t kMaxWireReplyTo = 256;

// The bytes a payload must have; errors on a codec that does not apply to the
// dtype and on sizes beyond uint64. decode_message also rejects (non_finite) a
// lossy payload whose fp16/bf16 values or block scales are NaN/Inf; the rest of a
// blockwise frame (its codes, a 4-bit padding nibble) is the codec's to check.
Result<uint64_t> expected_payload_bytes(DType dtype, uint64_t numel, Codec codec);

struct TensorHeader {
  uint8_t dtype_code = 0;
  uint8_t codec = 0;
  std::vector<int64_t> dims;
  uint64_t payload_bytes = 0;

  template <class Archive>
  void save(Archive& archive) const {
    archive(dtype_code, codec, static_cast<uint32_t>(dims.size()));
    for (int64_t dim : dims) archive(dim);
    archive(payload_bytes);
  }
  template <class Archive>
  void load(Archive& archive) {
    uint32_t rank = 0;
    archive(dtype_code, codec, rank);
    if (rank > kMaxWireRank) throw cereal::Exception("tensor rank beyond the wire format's bound");
    dims.clear();
    // Grows with the dims actually read, so a short frame stops it early.
    for (uint32_t i = 0; i < rank; ++i) {
      int64_t dim = 0;
      archive(dim);
      dims.push_back(dim);
    }
    archive(payload_bytes);
  }
};

// Split save/load rather than one serialize(): loading must bound each
// count before resizing, which Cereal's std::vector/std::string loaders do not.
// load() throws cereal::Exception on malformed input; decode_message catches it.
struct MessageHeader {
  uint16_t version = kWireVersion;
  MessageKind kind = MessageKind::ping;
  uint32_t stage = 0;
  uint64_t request_id = 0;
  uint16_t error_code = 0;
  // Requests: the codec the caller wants float tensors of the reply in.
  uint8_t reply_codec = 0;
  // Stage requests: which microbatch this is (retries of it keep the id, so a peer
  // can refuse to accumulate it twice) and when the caller stops waiting, in
  // milliseconds since the Unix epoch (it crosses processes; 0: none). Never negative.
  uint64_t microbatch_id = 0;
  int64_t deadline_unix_ms = 0;
  // Stage requests in a swarm with an owner: the caller's certificate, as text, for
  // the key the transport authenticated; empty otherwise. Checked by the peer.
  std::string credential;
  // Pipeline requests in a secured swarm: who handed this microbatch to whom, from
  // its trainer to this peer, signed (security::hop_chain_bytes); empty otherwise.
  std::string hop_chain;
  // Peer to peer, a pipeline passed on by a peer: the sender's peer id, which wants
  // the answer at once (accepted, busy, or a kept reply) and the outcome later as a
  // pipeline_result under return_id, a token of the sender's. A pipeline_result: its
  // sender's peer id and the token it answers. Empty and 0 otherwise.
  std::string reply_to;
  uint64_t return_id = 0;
  std::string error_text;
  std::vector<TensorHeader> tensors;

  template <class Archive>
  void save(Archive& archive) const {
    archive(version, static_cast<uint8_t>(kind), stage, request_id, error_code, reply_codec);
    archive(microbatch_id, deadline_unix_ms);
    archive(static_cast<uint32_t>(credential.size()));
    archive(cereal::binary_data(credential.data(), credential.size()));
    archive(static_cast<uint32_t>(hop_chain.size()));
    archive(cereal::binary_data(hop_chain.data(), hop_chain.size()));
    archive(static_cast<uint32_t>(reply_to.size()));
    archive(cereal::binary_data(reply_to.data(), reply_to.size()));
    archive(return_id);
    archive(static_cast<uint32_t>(error_text.size()));
    archive(cereal::binary_data(error_text.data(), error_text.size()));
    archive(static_cast<uint32_t>(tensors.size()));
    for (const TensorHeader& tensor : tensors) tensor.save(archive);
  }
  template <class Archive>
  void load(Archive& archive) {
    archive(version);
    // Another version may lay out the rest differently; stop so the caller
    // reports the version rather than a confusing parse error.
    if (version != kWireVersion) return;
    uint8_t kind_code = 0;
    archive(kind_code, stage, request_id, error_code, reply_codec);
    archive(microbatch_id, deadline_unix_ms);
    kind = static_cast<MessageKind>(kind_code);  // range-checked by the decoder
    uint32_t credential_size = 0;
    archive(credential_size);
    if (credential_size > kMaxWireCredential) throw cereal::Exception("credential beyond the wire format's bound");
    credential.resize(credential_size);
    archive(cereal::binary_data(credential.data(), credential.size()));
    uint32_t chain_size = 0;
    archive(chain_size);
    if (chain_size > kMaxWireHopChain) throw cereal::Exception("hop chain beyond the wire format's bound");
    hop_chain.resize(chain_size);
    archive(cereal::binary_data(hop_chain.data(), hop_chain.size()));
    uint32_t reply_to_size = 0;
    archive(reply_to_size);
    if (reply_to_size > kMaxWireReplyTo) throw cereal::Exception("reply_to beyond the wire format's bound");
    reply_to.resize(reply_to_size);
    archive(cereal::binary_data(reply_to.data(), reply_to.size()));
    archive(return_id);
    uint32_t text_size = 0;
    archive(text_size);
    if (text_size > kMaxWireText) throw cereal::Exception("error text beyond the wire format's bound");
    error_text.resize(text_size);
    archive(cereal::binary_data(error_text.data(), error_text.size()));
    uint32_t count = 0;
    archive(count);
    if (count > kMaxWireTensors) throw cereal::Exception("tensor count beyond the wire format's bound");
    tensors.clear();
    for (uint32_t i = 0; i < count; ++i) {
      TensorHeader tensor;
      tensor.load(archive);
      tensors.push_back(std::move(tensor));
    }
  }
};

struct Limits {
  uint64_t max_message_bytes = 256 << 20;  // all frames, header included
  uint64_t max_tensor_elements = 1 << 28;
  uint32_t max_tensors = 16;
  uint32_t max_rank = 8;  // also capped by Shape::kMaxRank
  uint32_t max_header_bytes = 64 << 10;
  uint32_t max_error_text = 4096;
};

struct DecodedTensor {
  DType dtype = DType::f32;
  Codec codec = Codec::none;
  Shape shape;
  std::string_view payload;  // always set
  // Codec::none only (otherwise data is null): points INTO the received
  // frame. Valid only while the frames live; treat it as read-only, since
  // the frame memory was handed over as const.
  TensorView view;
};

struct DecodedMessage {
  MessageHeader header;
  std::vector<DecodedTensor> tensors;  // tensors[i] describes frame i + 1
};

// One counter per rejection reason; shared by a peer's receive threads.
struct ValidationCounters {
  std::atomic<uint64_t> bad_header{0};      // unparsable or trailing bytes in frame 0
  std::atomic<uint64_t> bad_version{0};
  std::atomic<uint64_t> bad_kind{0};
  std::atomic<uint64_t> bad_dtype{0};       // unknown dtype, or codec unknown / not for this dtype
  std::atomic<uint64_t> bad_shape{0};       // rank, negative dim, int64 overflow
  std::atomic<uint64_t> too_large{0};       // any Limits bound exceeded
  std::atomic<uint64_t> frame_mismatch{0};  // frame count or sizes disagree with the header
  std::atomic<uint64_t> misaligned{0};
  std::atomic<uint64_t> non_finite{0};

  uint64_t total() const {
    return bad_header + bad_version + bad_kind + bad_dtype + bad_shape + too_large +
           frame_mismatch + misaligned + non_finite;
  }
};

// The header bytes of frame 0, without any validation (tests forge bad ones with it).
std::string serialize_header(const MessageHeader& header);

// Fills header.tensors from `tensors` (codec none) and copies their bytes into
// frames 1..n. Errors: a tensor not on the CPU, too many tensors, a text or
// count that the wire format cannot carry.
Result<Frames> encode_message(const MessageHeader& header, std::span<const TensorView> tensors);

// A tensor whose payload is already in its wire encoding (the caller applied the
// codec); the payload frame is shared, never copied.
struct EncodedTensor {
  DType dtype = DType::f32;  // the logical dtype
  Codec codec = Codec::none;
  std::vector<int64_t> dims;
  Frame payload;
};

// The same for payloads already encoded. Errors also: a payload whose size is not
// what dtype, shape and codec require.
Result<Frames> encode_message_payloads(const MessageHeader& header, std::span<const EncodedTensor> tensors);

// Checks everything before trusting it (see wire.cc for the order). Errors:
//   invalid_argument    malformed header (a negative deadline too), kind, dtype, codec, shape, frame count
//                       or size, NaN/Inf in a floating payload (names the tensor);
//   unimplemented       another wire version;
//   resource_exhausted  a Limits bound exceeded;
//   failed_precondition a payload not aligned for its element type.
Result<DecodedMessage> decode_message(const std::vector<std::string_view>& frames, const Limits& limits);
// The same, counting the rejection reason.
Result<DecodedMessage> decode_message(const std::vector<std::string_view>& frames, const Limits& limits,
                                      ValidationCounters& counters);

// kind error, error_code = the status code number, text cut to Limits{}.max_error_text.
Frames make_error_reply(uint64_t request_id, uint32_t stage, const Status& status);
// The Status an error reply carries; internal() if it is not a well-formed one.
Status status_from_error_reply(const MessageHeader& header);

// A stage's declared inputs; a dim of -1 matches any size (batch, sequence).
struct TensorListSpec {
  uint32_t stage = 0;
  std::vector<std::pair<DType, std::vector<int64_t>>> inputs;
};

// Checks stage id, tensor count, dtype, rank and each fixed dim (invalid_argument).
Status validate_against_spec(const MessageHeader& header, const TensorListSpec& spec);

}  // namespace swarm::wire
