#include "swarm/averaging/all_reduce.h"

#include <cmath>
#include <cstring>

#include <xxhash.h>

namespace swarm {

Status AllReduceConfig::validate() const {
  if (max_chunk_elements < 1) return invalid_argument("max_chunk_elements must be >= 1");
  if (!(part_timeout_seconds > 0) || !(round_timeout_seconds > 0) || !(ping_timeout_seconds > 0)) {
    return invalid_argument("all-reduce timeouts must be > 0");
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

Status AllReduceInbox::deliver(const wire::DecodedMessage& message) {
  SWARM_ASSIGN_OR_RETURN(nlohmann::json meta, control_json(message));
  if (message.tensors.size() != 2 || message.tensors[1].dtype != DType::f32 ||
      message.tensors[1].shape.rank() != 1 || message.tensors[1].codec != wire::Codec::none) {
    return invalid_argument("all-reduce part: tensor 1 must be f32 values");
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
  const auto& values = message.tensors[1];
  part.values.resize(static_cast<size_t>(values.shape[0]));
  if (!part.values.empty()) std::memcpy(part.values.data(), values.payload.data(), part.values.size() * sizeof(float));
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
                                 const std::string& sender, double weight, uint64_t params_hash,
                                 std::span<const float> values) {
  nlohmann::json meta = {{"group", hex64(digest)}, {"step", step},     {"phase", phase},
                         {"part", part},           {"chunk", chunk},   {"from", from},
                         {"sender", sender},       {"weight", weight}, {"hash", hex64(params_hash)}};
  TensorView payload(const_cast<float*>(values.data()), DType::f32, Shape{static_cast<int64_t>(values.size())},
                     Device::cpu);
  return encode_control_message(wire::MessageKind::allreduce_part, static_cast<uint32_t>(stage), 0, meta,
                                &payload);
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
