#include "swarm/averaging/all_reduce.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include <xxhash.h>

namespace swarm {

Status AllReduceConfig::validate() const {
  if (max_chunk_elements < 1) return invalid_argument("max_chunk_elements must be >= 1");
  if (!(part_timeout_seconds > 0) || !(round_timeout_seconds > 0) || !(ping_timeout_seconds > 0)) {
    return invalid_argument("all-reduce timeouts must be > 0");
  }
  if (!codec_from_code(static_cast<uint8_t>(codec))) {
    return invalid_argument("all-reduce codec {} is not a codec", static_cast<unsigned>(codec));
  }
  return Status::ok();
}

std::vector<ElementRange> split_evenly(int64_t total, int64_t parts) {
  std::vector<ElementRange> out;
  if (parts < 1) return out;
  const int64_t base = total / parts;
  const int64_t extra = total % parts;
  int64_t begin = 0;
  for (int64_t i = 0; i < parts; ++i) {
    const int64_t size = base + (i < extra ? 1 : 0);
    out.push_back({begin, begin + size});
    begin += size;
  }
  return out;
}

std::vector<ElementRange> split_bounded(ElementRange range, int64_t max_size) {
  std::vector<ElementRange> out;
  if (range.size() <= 0 || max_size < 1) {
    out.push_back({range.begin, range.begin});
    return out;
  }
  for (int64_t begin = range.begin; begin < range.end; begin += max_size) {
    out.push_back({begin, std::min(range.end, begin + max_size)});
  }
  return out;
}

uint64_t group_digest(int64_t step, const std::vector<AllReduceMember>& members) {
  std::vector<std::string> ids;
  for (const auto& m : members) ids.push_back(m.peer_id + '\t' + hex64(m.round_nonce));
  std::sort(ids.begin(), ids.end());
  std::string text = std::to_string(step);
  for (const auto& id : ids) {
    text += '\n';
    text += id;
  }
  return XXH3_64bits(text.data(), text.size());
}

namespace {

// Codec none without a codec table: the f32 bytes as they are.
Result<uint64_t> raw_encoded_bytes(CodecId codec, uint64_t n) {
  if (codec != CodecId::none) return invalid_argument("codec {} needs a codec table", codec_name(codec));
  if (n > UINT64_MAX / sizeof(float)) return invalid_argument("{} f32 values do not fit in 64 bits of bytes", n);
  return n * sizeof(float);
}

Status raw_decode(CodecId codec, std::span<const std::byte> encoded, std::span<float> values) {
  SWARM_ASSIGN_OR_RETURN(uint64_t bytes, raw_encoded_bytes(codec, values.size()));
  if (encoded.size() != bytes) return invalid_argument("{} bytes for {} f32 values", encoded.size(), values.size());
  if (!values.empty()) std::memcpy(values.data(), encoded.data(), encoded.size());
  return Status::ok();
}

}  // namespace

Status AllReduceInbox::deliver(const wire::DecodedMessage& message) {
  return deliver(message, Decoder{CodecId::none, &raw_encoded_bytes, &raw_decode});
}

Status AllReduceInbox::deliver(const wire::DecodedMessage& message, const Decoder& decoder) {
  auto store = [&]() -> Status {
    if (decoder.encoded_bytes == nullptr || decoder.decode == nullptr) {
      return internal("all-reduce inbox: a decoder without its functions");
    }
    SWARM_ASSIGN_OR_RETURN(nlohmann::json meta, control_json(message));
    if (message.tensors.size() != 2 || message.tensors[1].dtype != DType::f32 ||
        message.tensors[1].shape.rank() != 1) {
      return invalid_argument("all-reduce part: tensor 1 must be f32 values");
    }
    const wire::DecodedTensor& values = message.tensors[1];
    if (values.codec != decoder.codec) {
      return invalid_argument("all-reduce part in codec {} (code {}); the parts of this round travel in {}",
                              codec_name(values.codec), static_cast<unsigned>(values.codec),
                              codec_name(decoder.codec));
    }
    Part part;
    Key key;
    try {
      SWARM_ASSIGN_OR_RETURN(uint64_t digest, parse_hex64(meta.at("group").get<std::string>()));
      const int phase = meta.at("phase").get<int>();
      if (phase != 0 && phase != 1) return invalid_argument("all-reduce part: phase must be 0 or 1");
      key = {digest, phase, meta.at("part").get<int>(), meta.at("chunk").get<int>(), meta.at("from").get<int>()};
      part.step = meta.at("step").get<int64_t>();
      part.weight = meta.at("weight").get<double>();
      part.sender = meta.value("sender", "");
      SWARM_ASSIGN_OR_RETURN(part.params_hash, parse_hex64(meta.at("hash").get<std::string>()));
    } catch (const nlohmann::json::exception& e) {
      return invalid_argument("all-reduce part: {}", e.what());
    }
    if (!(part.weight >= 0) || !std::isfinite(part.weight)) return invalid_argument("all-reduce part: bad weight");
    {
      std::lock_guard lock(mu_);
      if (part.step <= finished_step_) {
        return failed_precondition("all-reduce part for step {}: this peer has finished step {}", part.step,
                                   finished_step_);
      }
    }
    // Sizes first, so a forged element count never sizes an allocation: the wire
    // decoder checked this too, but deliver also takes hand-built messages.
    const uint64_t count = static_cast<uint64_t>(values.shape[0]);
    SWARM_ASSIGN_OR_RETURN(uint64_t expected, decoder.encoded_bytes(values.codec, count));
    if (values.payload.size() != expected) {
      return invalid_argument("all-reduce part: {} payload bytes; {} values in codec {} take {}",
                              values.payload.size(), count, codec_name(values.codec), expected);
    }
    part.values.resize(static_cast<size_t>(count));
    Status decoded = decoder.decode(
        values.codec, std::as_bytes(std::span<const char>(values.payload.data(), values.payload.size())),
        part.values);
    if (!decoded.is_ok()) return invalid_argument("all-reduce part: {}", decoded.message());
    // The codecs promise finite values; a table that breaks the promise must not
    // put a NaN into every replica.
    uint32_t bad = 0;
    for (float v : part.values) bad |= static_cast<uint32_t>((std::bit_cast<uint32_t>(v) & 0x7f800000u) == 0x7f800000u);
    if (bad != 0) return invalid_argument("all-reduce part: codec {} decoded a value that is not finite",
                                          codec_name(values.codec));
    {
      std::lock_guard lock(mu_);
      if (part.step <= finished_step_) {
        return failed_precondition("all-reduce part for step {}: this peer has finished step {}", part.step,
                                   finished_step_);
      }
      mail_[key] = std::move(part);
    }
    cv_.notify_all();
    return Status::ok();
  };
  Status status = store();
  if (!status.is_ok()) ++refused_;
  return status;
}

std::optional<AllReduceInbox::Part> AllReduceInbox::take(const Key& key) {
  std::lock_guard lock(mu_);
  auto it = mail_.find(key);
  if (it == mail_.end()) return std::nullopt;
  Part part = std::move(it->second);
  mail_.erase(it);
  return part;
}

void AllReduceInbox::finish_step(int64_t step) {
  std::lock_guard lock(mu_);
  finished_step_ = std::max(finished_step_, step);
  std::erase_if(mail_, [&](const auto& entry) { return entry.second.step <= finished_step_; });
}

size_t AllReduceInbox::size() const {
  std::lock_guard lock(mu_);
  return mail_.size();
}

namespace all_reduce_detail {

Result<wire::Frames> encode_part(int stage, uint64_t digest, int64_t step, int phase, int part, int chunk, int from,
                                 const std::string& sender, double weight, uint64_t params_hash, CodecId codec,
                                 int64_t count, wire::Frame payload) {
  nlohmann::json meta = {{"group", hex64(digest)}, {"step", step},     {"phase", phase},
                         {"part", part},           {"chunk", chunk},   {"from", from},
                         {"sender", sender},       {"weight", weight}, {"hash", hex64(params_hash)}};
  std::string text = meta.dump();
  const int64_t text_size = static_cast<int64_t>(text.size());
  wire::MessageHeader header;
  header.kind = wire::MessageKind::allreduce_part;
  header.stage = static_cast<uint32_t>(stage);
  header.request_id = 0;
  // The layout of encode_control_message: tensor 0 the JSON, tensor 1 the values.
  const wire::EncodedTensor tensors[] = {
      {DType::u8, wire::Codec::none, {text_size}, wire::Frame(std::move(text))},
      {DType::f32, codec, {count}, std::move(payload)},
  };
  return wire::encode_message_payloads(header, tensors);
}

Result<wire::Frames> encode_part(int stage, uint64_t digest, int64_t step, int phase, int part, int chunk, int from,
                                 const std::string& sender, double weight, uint64_t params_hash,
                                 std::span<const float> values) {
  wire::Frame payload(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  return encode_part(stage, digest, step, phase, part, chunk, from, sender, weight, params_hash, CodecId::none,
                     static_cast<int64_t>(values.size()), std::move(payload));
}

std::vector<float> weighted_mean(const std::vector<const std::vector<float>*>& values,
                                 const std::vector<double>& weights, int64_t size) {
  std::vector<double> sum(static_cast<size_t>(size), 0.0);
  double total = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] == nullptr || !(weights[i] > 0)) continue;
    total += weights[i];
    const float* x = values[i]->data();
    for (int64_t k = 0; k < size; ++k) sum[k] += weights[i] * static_cast<double>(x[k]);
  }
  std::vector<float> out(static_cast<size_t>(size), 0.0f);
  if (total > 0) {
    for (int64_t k = 0; k < size; ++k) out[k] = static_cast<float>(sum[k] / total);
  }
  return out;
}

}  // namespace all_reduce_detail
}  // namespace swarm
