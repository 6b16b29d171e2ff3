// round_group: one member's side of one agreed group's all-reduce, driven by messages.
//
// A group of three or more trusts no member's arithmetic: every member sends its
// whole mean gradient (in chunks of bounded size, in the round's codec, saying the
// samples it holds) to every other member, and each reduces all of them itself by
// centered clipping (robust_mean.h), in member order, the weights capped: one
// member's bad numbers move the average by a bounded step, and there is no reduced
// part to forge. Each member judges every contribution as it reduces; the round
// protocol bans on those judgements. It costs traffic: a member sends (n - 1)
// gradients where a butterfly sends 2 (n - 1) / n: 1.5x for three, 2x for four.
//
// A group of two has no majority to clip towards, and is a butterfly: the flat
// gradient is cut into one part per member (in the BEGIN's member order);
// reduce-scatter: member i sends part j of its mean gradient to member j; the
// owner of a part takes the mean weighted by the samples each contribution says
// it holds (capped), in member order and in double, encodes it once and keeps
// decode(encode(mean)): exactly what the other decodes. All-gather: it sends those
// bytes to everyone.
//
// Either way the group is agreed, so nobody is left out silently: a missing member
// fails the round. A member keeps its own contribution after the same
// encode/decode round trip, so every complete member holds the same vector, bit
// for bit.
//
// Pure: messages in, messages out; the caller sends them and keeps the time.
//
//   RoundGroup group(spec, codec);
//   SWARM_RETURN_IF_ERROR(group.start(mean, samples));  // then send group.take_outgoing()
//   SWARM_RETURN_IF_ERROR(group.receive(part));    // ... until group.complete()
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "swarm/averaging/robust_mean.h"
#include "swarm/averaging/round_messages.h"
#include "swarm/core/status.h"

namespace swarm {

// One message for the caller to send.
struct Outgoing {
  std::string to;       // peer id
  std::string address;  // its control server
  RoundOp op = RoundOp::join;
  uint64_t group = 0;
  wire::Frames frames;
};

struct GroupSpec {
  int stage = 0;
  int64_t step = 0;
  std::string leader;
  uint64_t group = 0;
  std::vector<RoundMember> members;  // ordered by id, this peer among them
  std::string me;
  // The most samples one member's contribution counts for: a member cannot outweigh
  // the others by claiming more.
  int64_t max_member_samples = INT64_MAX;
  uint64_t params_hash = 0;
  int64_t max_chunk_elements = 1 << 18;
};

// The group id a leader gives its round: its step, its id and its own count of the
// rounds it led, so no two groups of a leader share one.
uint64_t make_group_id(int64_t step, const std::string& leader, uint64_t round_counter);

class RoundGroup {
 public:
  RoundGroup(GroupSpec spec, RoundCodec codec);

  const GroupSpec& spec() const { return spec_; }
  int member_index(const std::string& peer_id) const;
  int size() const { return static_cast<int>(spec_.members.size()); }
  // A group this large exchanges whole gradients and clips towards its majority
  // (with that many contributions holding samples: the round protocol's leader
  // waits a while for them).
  static constexpr int kRobustGroupSize = 3;
  bool robust() const { return size() >= kRobustGroupSize; }

  // This member's mean gradient over `samples` samples: its contributions go out (in
  // the codec, each saying its samples), its own is kept after the same encode/decode
  // round trip. The members weigh contributions by the samples they took, not by
  // what the leader heard in their JOINs: samples that reach a member between its
  // JOIN and the BEGIN would otherwise count for nothing, or for another's. A group
  // of one is complete at once with `mean` as it is (nothing travels, nothing is
  // quantized).
  Status start(std::vector<float> mean, int64_t samples);
  bool started() const { return started_; }

  // A PART of this group: a member's contribution. invalid_argument for one that
  // does not fit (wrong sender for its index, chunk or size, or a reduced part:
  // phase 1); already_exists for a duplicate (the first stays).
  Status receive(const RoundMessage& part);

  bool complete() const;
  // The members whose contributions to this member never came: who kept the group
  // from completing (a butterfly owner waiting on them sends nothing either).
  std::vector<std::string> missing() const;
  const std::vector<float>& averaged() const { return averaged_; }
  // How each member's contribution lay against the others' (once this member
  // reduced, with three contributions or more): what bans are made of.
  const std::vector<std::pair<std::string, ContributionJudgement>>& judgements() const { return judgements_; }
  // The parameters hashes the members sent with their parts (this peer's included).
  std::vector<std::pair<std::string, uint64_t>> hashes() const;
  std::vector<Outgoing> take_outgoing();
  int64_t payload_bytes_sent() const { return payload_bytes_sent_; }
  int64_t payload_values_sent() const { return payload_values_sent_; }

 private:
  struct Range {
    int64_t begin = 0;
    int64_t end = 0;
    int64_t size() const { return end - begin; }
  };
  RoundMessage part_header(int phase, int part, int chunk) const;
  Status send_contributions();
  Status send_whole_contributions();
  Status maybe_reduce();
  Status send_part(int to, const RoundMessage& header, const wire::Frame& payload, int64_t count);
  std::vector<Range> chunks_of(int part) const;

  GroupSpec spec_;
  RoundCodec codec_;
  int me_ = -1;
  bool started_ = false;
  std::vector<float> mean_;
  std::map<int, int64_t> samples_of_;  // member index -> the samples its contribution holds, capped
  std::vector<Range> parts_;
  std::map<std::pair<int, int>, std::vector<float>> contributions_;  // (from, chunk) to my part (robust: the whole)
  bool reduced_ = false;
  std::map<std::pair<int, int>, std::vector<float>> gathered_;  // (owner, chunk)
  std::vector<float> averaged_;
  int64_t gathered_values_ = 0;
  std::vector<std::pair<std::string, ContributionJudgement>> judgements_;
  std::map<std::string, uint64_t> hashes_;
  std::vector<Outgoing> outgoing_;
  int64_t payload_bytes_sent_ = 0;
  int64_t payload_values_sent_ = 0;
};

}  // namespace swarm
