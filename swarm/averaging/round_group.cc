#include "swarm/averaging/round_group.h"

#include <algorithm>

#include <xxhash.h>

#include "swarm/averaging/robust_mean.h"

namespace swarm {

uint64_t make_group_id(int64_t step, const std::string& leader, uint64_t round_counter) {
  const std::string text = std::to_string(step) + '\n' + leader + '\n' + std::to_string(round_counter);
  const uint64_t id = XXH3_64bits(text.data(), text.size());
  return id == 0 ? 1 : id;  // 0 means "no group"
}

RoundGroup::RoundGroup(GroupSpec spec, RoundCodec codec) : spec_(std::move(spec)), codec_(codec) {
  me_ = member_index(spec_.me);
}

int RoundGroup::member_index(const std::string& peer_id) const {
  for (size_t i = 0; i < spec_.members.size(); ++i) {
    if (spec_.members[i].peer_id == peer_id) return static_cast<int>(i);
  }
  return -1;
}

std::vector<RoundGroup::Range> RoundGroup::chunks_of(int part) const {
  std::vector<Range> out;
  // A robust group's members send each other the whole gradient.
  const Range r = robust() ? Range{0, static_cast<int64_t>(mean_.size())} : parts_[static_cast<size_t>(part)];
  const int64_t max = std::max<int64_t>(spec_.max_chunk_elements, 1);
  if (r.size() == 0) out.push_back({r.begin, r.begin});
  for (int64_t b = r.begin; b < r.end; b += max) out.push_back({b, std::min(r.end, b + max)});
  return out;
}

RoundMessage RoundGroup::part_header(int phase, int part, int chunk) const {
  RoundMessage m;
  m.op = RoundOp::part;
  m.stage = spec_.stage;
  m.step = spec_.step;
  m.sender = spec_.me;
  m.leader = spec_.leader;
  m.group = spec_.group;
  m.phase = phase;
  m.part = part;
  m.chunk = chunk;
  m.from = me_;
  m.params_hash = spec_.params_hash;
  if (phase == 0) m.samples = samples_of_.at(me_);
  return m;
}

Status RoundGroup::send_part(int to, const RoundMessage& header, const wire::Frame& payload, int64_t count) {
  SWARM_ASSIGN_OR_RETURN(wire::Frames frames, encode_round_part(header, codec_.codec, count, payload));
  const RoundMember& member = spec_.members[static_cast<size_t>(to)];
  outgoing_.push_back({member.peer_id, member.address, RoundOp::part, spec_.group, std::move(frames)});
  payload_bytes_sent_ += static_cast<int64_t>(payload.size());
  payload_values_sent_ += count;
  return Status::ok();
}

Status RoundGroup::start(std::vector<float> mean, int64_t samples) {
  if (me_ < 0) return invalid_argument("peer {} is not a member of group {:016x}", spec_.me, spec_.group);
  if (started_) return failed_precondition("group {:016x} started already", spec_.group);
  started_ = true;
  mean_ = std::move(mean);
  samples_of_[me_] = std::clamp<int64_t>(samples, 0, spec_.max_member_samples);
  hashes_[spec_.me] = spec_.params_hash;
  const int64_t n = size();
  const int64_t total = static_cast<int64_t>(mean_.size());
  for (int64_t i = 0, begin = 0; i < n; ++i) {
    const int64_t len = total / n + (i < total % n ? 1 : 0);
    parts_.push_back({begin, begin + len});
    begin += len;
  }
  if (n == 1) {
    averaged_ = mean_;
    reduced_ = true;
    gathered_values_ = total;
    return Status::ok();
  }
  averaged_.assign(mean_.size(), 0.0f);
  SWARM_RETURN_IF_ERROR(send_contributions());
  return maybe_reduce();  // anything that arrived before this member started
}

Status RoundGroup::send_contributions() {
  if (robust()) return send_whole_contributions();
  for (int j = 0; j < size(); ++j) {
    const std::vector<Range> chunks = chunks_of(j);
    for (size_t c = 0; c < chunks.size(); ++c) {
      const std::span<const float> values(mean_.data() + chunks[c].begin, static_cast<size_t>(chunks[c].size()));
      SWARM_ASSIGN_OR_RETURN(wire::Frame payload, codec_.encode_values(values));
      if (j == me_) {  // mine goes through the codec like everyone else's
        std::vector<float> decoded(values.size());
        SWARM_RETURN_IF_ERROR(codec_.decode_values(
            std::as_bytes(std::span<const char>(payload.data(), payload.size())), decoded));
        contributions_[{me_, static_cast<int>(c)}] = std::move(decoded);
        continue;
      }
      SWARM_RETURN_IF_ERROR(send_part(j, part_header(0, j, static_cast<int>(c)), payload, chunks[c].size()));
    }
  }
  return Status::ok();
}

// Encoded once per chunk, the same bytes to every other member; this member keeps
// its own after the same round trip, so it reduces what the others decode.
Status RoundGroup::send_whole_contributions() {
  const std::vector<Range> chunks = chunks_of(me_);
  for (size_t c = 0; c < chunks.size(); ++c) {
    const std::span<const float> values(mean_.data() + chunks[c].begin, static_cast<size_t>(chunks[c].size()));
    SWARM_ASSIGN_OR_RETURN(wire::Frame payload, codec_.encode_values(values));
    std::vector<float> decoded(values.size());
    SWARM_RETURN_IF_ERROR(
        codec_.decode_values(std::as_bytes(std::span<const char>(payload.data(), payload.size())), decoded));
    contributions_[{me_, static_cast<int>(c)}] = std::move(decoded);
    for (int j = 0; j < size(); ++j) {
      if (j != me_) SWARM_RETURN_IF_ERROR(send_part(j, part_header(0, j, static_cast<int>(c)), payload, chunks[c].size()));
    }
  }
  return Status::ok();
}

Status RoundGroup::receive(const RoundMessage& m) {
  if (m.group != spec_.group || m.step != spec_.step) return invalid_argument("a part of another round");
  if (m.from < 0 || m.from >= size() || spec_.members[static_cast<size_t>(m.from)].peer_id != m.sender) {
    return invalid_argument("part from {} under member index {}", m.sender, m.from);
  }
  if (m.part >= size() || (m.phase == 0 && m.part != me_)) return invalid_argument("part {} is not for this member", m.part);
  if (robust() && m.phase == 1) {
    return invalid_argument("a reduced part from {}: in a group of {} every member reduces the whole gradient itself",
                            m.sender, size());
  }
  if (parts_.empty()) {
    // Not started: sizes are not known yet; the caller holds early parts until start().
    return failed_precondition("group {:016x} has not started", spec_.group);
  }
  const std::vector<Range> chunks = chunks_of(m.part);
  if (m.chunk >= static_cast<int>(chunks.size()) ||
      static_cast<int64_t>(m.values.size()) != chunks[static_cast<size_t>(m.chunk)].size()) {
    return invalid_argument("part {} chunk {} of {} values does not fit", m.part, m.chunk, m.values.size());
  }
  auto& store = m.phase == 0 ? contributions_ : gathered_;
  const std::pair<int, int> key{m.from, m.chunk};
  if (store.count(key) != 0) return already_exists("part {} chunk {} from {} is held already", m.part, m.chunk, m.sender);
  if (m.phase == 0) {
    const int64_t samples = std::clamp<int64_t>(m.samples, 0, spec_.max_member_samples);
    auto [it, first] = samples_of_.emplace(m.from, samples);
    if (!first && it->second != samples) {
      return invalid_argument("{}'s contributions claim {} and {} samples", m.sender, it->second, samples);
    }
  }
  store[key] = m.values;
  hashes_[m.sender] = m.params_hash;
  if (m.phase == 1) {
    std::copy(m.values.begin(), m.values.end(), averaged_.begin() + chunks[static_cast<size_t>(m.chunk)].begin);
    gathered_values_ += static_cast<int64_t>(m.values.size());
    return Status::ok();
  }
  return maybe_reduce();
}

Status RoundGroup::maybe_reduce() {
  if (reduced_ || !started_) return Status::ok();
  const std::vector<Range> mine = chunks_of(me_);
  for (int i = 0; i < size(); ++i) {
    for (size_t c = 0; c < mine.size(); ++c) {
      if (contributions_.count({i, static_cast<int>(c)}) == 0) return Status::ok();
    }
  }
  reduced_ = true;
  const int64_t begin = mine.front().begin;
  const int64_t len = mine.back().end - begin;
  std::vector<std::vector<float>> whole(static_cast<size_t>(size()));
  std::vector<Contribution> in;
  for (int i = 0; i < size(); ++i) {
    std::vector<float>& x = whole[static_cast<size_t>(i)];
    x.reserve(static_cast<size_t>(len));
    for (size_t c = 0; c < mine.size(); ++c) {
      const std::vector<float>& chunk = contributions_.at({i, static_cast<int>(c)});
      x.insert(x.end(), chunk.begin(), chunk.end());
    }
    in.push_back({x, static_cast<double>(samples_of_.at(i))});
  }
  contributions_.clear();
  // A butterfly's owner has one or two contributions: the weighted mean.
  RobustMean reduced = centered_clip(in);
  for (int i = 0; i < size(); ++i) {
    const ContributionJudgement& j = reduced.judged[static_cast<size_t>(i)];
    if (j.judged) judgements_.emplace_back(spec_.members[static_cast<size_t>(i)].peer_id, j);
  }
  if (robust()) {  // every member reduced the same contributions alike: nothing to gather
    averaged_ = std::move(reduced.mean);
    gathered_values_ = len;
    return Status::ok();
  }
  for (size_t c = 0; c < mine.size(); ++c) {
    const int64_t offset = mine[c].begin - begin;
    std::vector<float> mean(reduced.mean.begin() + offset, reduced.mean.begin() + offset + mine[c].size());
    // Encoded once, sent to all; this owner keeps exactly what they decode.
    SWARM_ASSIGN_OR_RETURN(wire::Frame encoded, codec_.encode_values(mean));
    SWARM_RETURN_IF_ERROR(
        codec_.decode_values(std::as_bytes(std::span<const char>(encoded.data(), encoded.size())), mean));
    std::copy(mean.begin(), mean.end(), averaged_.begin() + mine[c].begin);
    gathered_values_ += mine[c].size();
    for (int j = 0; j < size(); ++j) {
      if (j != me_) SWARM_RETURN_IF_ERROR(send_part(j, part_header(1, me_, static_cast<int>(c)), encoded, mine[c].size()));
    }
  }
  return Status::ok();
}

bool RoundGroup::complete() const {
  return started_ && reduced_ && gathered_values_ == static_cast<int64_t>(averaged_.size());
}

std::vector<std::string> RoundGroup::missing() const {
  // Only contributions to this member's own part: an owner that sent no averaged
  // part may itself be waiting for someone else's contribution.
  std::vector<std::string> out;
  if (!started_ || reduced_) return out;
  const size_t chunks = chunks_of(me_).size();
  for (int i = 0; i < size(); ++i) {
    if (i == me_) continue;
    for (size_t c = 0; c < chunks; ++c) {
      if (contributions_.count({i, static_cast<int>(c)}) == 0) {
        out.push_back(spec_.members[static_cast<size_t>(i)].peer_id);
        break;
      }
    }
  }
  return out;
}

std::vector<std::pair<std::string, uint64_t>> RoundGroup::hashes() const { return {hashes_.begin(), hashes_.end()}; }

std::vector<Outgoing> RoundGroup::take_outgoing() { return std::exchange(outgoing_, {}); }

}  // namespace swarm
