#include "swarm/averaging/all_reduce.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include <xxhash.h>

namespace swarm {

Status AllReduceConfig::validate() const {
  if (max_chunk_elements < 1) return invalid_argument("max_chunk_elements must be >= 1");
  if (!(part_timeout_seconds > 0) || !(round_timeout_seconds > 0) || !(ping_timeout_seconds > 0)) {
    return invalid_argument("all-reduce timeouts must be > 0");
  }
  if (max_members < 1) return invalid_argument("max_members must be >= 1");
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

namespace {

// a * b, or INT64_MAX when that does not fit (both >= 0).
int64_t saturating_mul(int64_t a, int64_t b) { return b != 0 && a > INT64_MAX / b ? INT64_MAX : a * b; }
int64_t saturating_add(int64_t a, int64_t b) { return a > INT64_MAX - b ? INT64_MAX : a + b; }

}  // namespace

InboxLimits inbox_limits(int64_t gradient_values, const AllReduceConfig& config, double max_weight) {
  const int64_t values = std::max<int64_t>(gradient_values, 1);
  const int64_t chunk = std::max<int64_t>(config.max_chunk_elements, 1);
  const int64_t members = std::max(config.max_members, 1);
  // 2 steps x 2 runs x (2 gradients of values, in 2 x (chunks + members) messages).
  const int64_t chunks = values / chunk + 1;
  InboxLimits limits;
  limits.max_values = saturating_mul(8, saturating_add(values, chunk));
  limits.max_parts = std::min<int64_t>(saturating_mul(8, saturating_add(chunks, members)), INT32_MAX);
  limits.max_chunk_elements = chunk;
  limits.max_members = static_cast<int>(members);
  limits.max_weight = max_weight;
  return limits;
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

Status AllReduceInbox::deliver(const wire::DecodedMessage& message, const PeerIdentity& from) {
  return deliver(message, Decoder{CodecId::none, &raw_encoded_bytes, &raw_decode}, from);
}

// The fields of a part, checked before anything is allocated for its values.
struct AllReduceInbox::Parsed {
  Key key;
  Part part;  // values still encoded
  const wire::DecodedTensor* values = nullptr;
  int64_t count = 0;
};

namespace {

// JSON fields by type: nlohmann would turn 1.5 into 1, or 2^64-1 into -1, silently.
Result<int64_t> integer_field(const nlohmann::json& meta, const char* key) {
  const auto it = meta.find(key);
  if (it == meta.end() || !it->is_number_integer() ||
      (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))) {
    return invalid_argument("all-reduce part: field '{}' must be a 64-bit integer", key);
  }
  return it->get<int64_t>();
}

Result<int> index_field(const nlohmann::json& meta, const char* key, int64_t limit) {
  SWARM_ASSIGN_OR_RETURN(int64_t value, integer_field(meta, key));
  if (value < 0 || value >= limit) return invalid_argument("all-reduce part: '{}' {} is outside [0, {})", key, value, limit);
  return static_cast<int>(value);
}

Result<std::string> string_field(const nlohmann::json& meta, const char* key) {
  const auto it = meta.find(key);
  if (it == meta.end() || !it->is_string()) return invalid_argument("all-reduce part: field '{}' must be text", key);
  return it->get<std::string>();
}

}  // namespace

Result<AllReduceInbox::Parsed> AllReduceInbox::parse(const wire::DecodedMessage& message,
                                                     const Decoder& decoder) const {
  if (decoder.encoded_bytes == nullptr || decoder.decode == nullptr) {
    return internal("all-reduce inbox: a decoder without its functions");
  }
  SWARM_ASSIGN_OR_RETURN(nlohmann::json meta, control_json(message));
  if (message.tensors.size() != 2 || message.tensors[1].dtype != DType::f32 || message.tensors[1].shape.rank() != 1) {
    return invalid_argument("all-reduce part: tensor 1 must be f32 values");
  }
  Parsed p;
  p.values = &message.tensors[1];
  if (p.values->codec != decoder.codec) {
    return invalid_argument("all-reduce part in codec {} (code {}); the parts of this round travel in {}",
                            codec_name(p.values->codec), static_cast<unsigned>(p.values->codec),
                            codec_name(decoder.codec));
  }
  p.count = p.values->shape[0];
  const InboxLimits& limits = options_.limits;
  if (p.count < 0 || p.count > limits.max_chunk_elements) {
    return invalid_argument("all-reduce part of {} values; a chunk holds at most {}", p.count,
                            limits.max_chunk_elements);
  }
  SWARM_ASSIGN_OR_RETURN(std::string group, string_field(meta, "group"));
  SWARM_ASSIGN_OR_RETURN(uint64_t digest, parse_hex64(group));
  SWARM_ASSIGN_OR_RETURN(int phase, index_field(meta, "phase", 2));
  SWARM_ASSIGN_OR_RETURN(int part, index_field(meta, "part", limits.max_members));
  SWARM_ASSIGN_OR_RETURN(int chunk, index_field(meta, "chunk", limits.max_parts));
  SWARM_ASSIGN_OR_RETURN(int from, index_field(meta, "from", limits.max_members));
  // Phase 0 goes to the part's owner from someone else; phase 1 comes from the owner.
  if ((phase == 0) == (part == from)) {
    return invalid_argument("all-reduce part: phase {} part {} cannot come from member {}", phase, part, from);
  }
  p.key = {digest, phase, part, chunk, from};
  SWARM_ASSIGN_OR_RETURN(p.part.step, integer_field(meta, "step"));
  SWARM_ASSIGN_OR_RETURN(p.part.sender, string_field(meta, "sender"));
  if (p.part.sender.empty()) return invalid_argument("all-reduce part: no sender");
  SWARM_ASSIGN_OR_RETURN(std::string hash, string_field(meta, "hash"));
  SWARM_ASSIGN_OR_RETURN(p.part.params_hash, parse_hex64(hash));
  const auto weight = meta.find("weight");
  if (weight == meta.end() || !weight->is_number()) return invalid_argument("all-reduce part: weight must be a number");
  p.part.weight = weight->get<double>();
  return p;
}

Status AllReduceInbox::check_claims(const Parsed& parsed, const PeerIdentity& from) {
  const double weight = parsed.part.weight;
  if (!std::isfinite(weight) || weight < 0 || weight > options_.limits.max_weight) {
    ++bad_weight_;
    return invalid_argument("all-reduce part from {}: weight {} is not in [0, {}]", parsed.part.sender, weight,
                            options_.limits.max_weight);
  }
  if (options_.speaks_for && !options_.speaks_for(parsed.part.sender, from)) {
    ++impostor_;
    return permission_denied("all-reduce part: the connection does not speak for {}", parsed.part.sender);
  }
  if (options_.is_member && !options_.is_member(parsed.part.sender)) {
    ++not_member_;
    return permission_denied("all-reduce part from {}, who is no stage-mate of this peer", parsed.part.sender);
  }
  return Status::ok();
}

// Steps finished_step_ + 1 (this peer's) and + 2 (a stage-mate a step ahead) only.
Status AllReduceInbox::step_window(int64_t step) {
  if (step <= finished_step_) {
    ++stale_;
    return failed_precondition("all-reduce part for step {}: this peer has finished step {}", step, finished_step_);
  }
  // step > finished_step_ >= -1 here, so step - 2 cannot wrap.
  if (step - 2 > finished_step_) {
    ++far_future_;
    return out_of_range("all-reduce part for step {}: this peer takes parts for steps {} and {} only", step,
                        finished_step_ + 1, finished_step_ + 2);
  }
  return Status::ok();
}

// Admits a part before its values are decoded: its key and its size are held, so
// concurrent deliveries cannot together pass the bounds one of them checked.
Status AllReduceInbox::reserve(const Parsed& parsed) {
  std::lock_guard lock(mu_);
  SWARM_RETURN_IF_ERROR(step_window(parsed.part.step));
  const Slot slot{parsed.key, parsed.part.sender};
  if (mail_.count(slot) != 0 || reserved_.count(slot) != 0) {
    ++duplicate_;
    return already_exists("all-reduce part from {}: this inbox holds that part already", parsed.part.sender);
  }
  const InboxLimits& limits = options_.limits;
  if (parts_held_ >= limits.max_parts || parsed.count > limits.max_values - values_held_) {
    ++full_;
    return resource_exhausted("all-reduce inbox full: {} parts, {} values held", parts_held_, values_held_);
  }
  reserved_.insert(slot);
  ++parts_held_;
  values_held_ += parsed.count;
  return Status::ok();
}

void AllReduceInbox::release(const Parsed& parsed) {
  reserved_.erase({parsed.key, parsed.part.sender});
  --parts_held_;
  values_held_ -= parsed.count;
}

Status AllReduceInbox::store(Parsed parsed, const Decoder& decoder) {
  const wire::DecodedTensor& values = *parsed.values;
  const uint64_t count = static_cast<uint64_t>(parsed.count);
  Status decoded = [&]() -> Status {
    SWARM_ASSIGN_OR_RETURN(uint64_t expected, decoder.encoded_bytes(values.codec, count));
    if (values.payload.size() != expected) {
      return invalid_argument("all-reduce part: {} payload bytes; {} values in codec {} take {}",
                              values.payload.size(), count, codec_name(values.codec), expected);
    }
    parsed.part.values.resize(static_cast<size_t>(count));
    Status s = decoder.decode(values.codec,
                              std::as_bytes(std::span<const char>(values.payload.data(), values.payload.size())),
                              parsed.part.values);
    if (!s.is_ok()) return invalid_argument("all-reduce part: {}", s.message());
    // The codecs promise finite values; a table that breaks the promise must not
    // put a NaN into every replica.
    uint32_t bad = 0;
    for (float v : parsed.part.values) {
      bad |= static_cast<uint32_t>((std::bit_cast<uint32_t>(v) & 0x7f800000u) == 0x7f800000u);
    }
    if (bad != 0) {
      return invalid_argument("all-reduce part: codec {} decoded a value that is not finite", codec_name(values.codec));
    }
    return Status::ok();
  }();
  {
    std::lock_guard lock(mu_);
    release(parsed);
    if (!decoded.is_ok()) {
      ++malformed_;
      return decoded;
    }
    // finish_step may have run while this part was decoded.
    SWARM_RETURN_IF_ERROR(step_window(parsed.part.step));
    ++parts_held_;
    values_held_ += parsed.count;
    Slot slot{parsed.key, parsed.part.sender};
    mail_.emplace(std::move(slot), std::move(parsed.part));
  }
  cv_.notify_all();
  return Status::ok();
}

Status AllReduceInbox::deliver(const wire::DecodedMessage& message, const Decoder& decoder,
                               const PeerIdentity& from) {
  Result<Parsed> parsed = parse(message, decoder);
  if (!parsed.is_ok()) {
    ++malformed_;
    return parsed.status();
  }
  SWARM_RETURN_IF_ERROR(check_claims(*parsed, from));
  SWARM_RETURN_IF_ERROR(reserve(*parsed));
  return store(std::move(parsed).value(), decoder);
}

InboxCounters AllReduceInbox::counters() const {
  InboxCounters c;
  c.malformed = malformed_.load();
  c.bad_weight = bad_weight_.load();
  c.impostor = impostor_.load();
  c.not_member = not_member_.load();
  c.stale = stale_.load();
  c.far_future = far_future_.load();
  c.duplicate = duplicate_.load();
  c.full = full_.load();
  c.wrong_sender = wrong_sender_.load();
  c.over_published = over_published_.load();
  return c;
}

std::optional<AllReduceInbox::Part> AllReduceInbox::take(const Key& key, const std::string& sender) {
  std::lock_guard lock(mu_);
  std::optional<Part> out;
  // Every sender of one key sits together: the map orders by key first.
  for (auto it = mail_.lower_bound({key, std::string()}); it != mail_.end() && it->first.first == key;) {
    --parts_held_;
    values_held_ -= static_cast<int64_t>(it->second.values.size());
    if (it->first.second == sender) {
      out = std::move(it->second);
    } else {
      ++wrong_sender_;
    }
    it = mail_.erase(it);
  }
  return out;
}

void AllReduceInbox::finish_step(int64_t step) {
  std::lock_guard lock(mu_);
  finished_step_ = std::max(finished_step_, step);
  for (auto it = mail_.begin(); it != mail_.end();) {
    if (it->second.step > finished_step_) {
      ++it;
      continue;
    }
    --parts_held_;
    values_held_ -= static_cast<int64_t>(it->second.values.size());
    it = mail_.erase(it);
  }
}

size_t AllReduceInbox::size() const {
  std::lock_guard lock(mu_);
  return mail_.size();
}

int64_t AllReduceInbox::values_held() const {
  std::lock_guard lock(mu_);
  return values_held_;
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

bool delivered(const Result<ReceivedMessage>& reply) {
  return reply.is_ok() || reply.status().code() == StatusCode::already_exists;
}

bool usable_contribution(const AllReduceInbox::Part& part, const AllReduceMember& member, int64_t size,
                         AllReduceInbox& inbox) {
  if (!(part.weight <= member.max_weight)) {
    inbox.count_over_published();
    return false;
  }
  return static_cast<int64_t>(part.values.size()) == size;
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
