// round_group: one member's side of one agreed group's all-reduce, driven by messages.
//
// The flat gradient is cut into one part per member (in the BEGIN's member order),
// each sent in chunks of bounded size. Reduce-scatter: member i sends part j of its
// mean gradient to member j. The owner of a part waits for every member's
// contribution (the group is agreed, so nobody is left out silently: a missing
// member fails the round), takes the mean weighted by the samples each contribution
// says it holds (capped), in member order and in double, encodes it once and keeps decode(encode(mean)):
// exactly what the others decode. All-gather: it sends those bytes to everyone.
// The group is complete when this member holds every part; every complete member
// holds the same vector, bit for bit.
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

  // This member's mean gradient over `samples` samples: its contributions go out (in
  // the codec, each saying its samples), its own is kept after the same encode/decode
  // round trip. The members weigh contributions by the samples they took, not by
  // what the leader heard in their JOINs: samples that reach a member between its
  // JOIN and the BEGIN would otherwise count for nothing, or for another's. A group
  // of one is complete at once with `mean` as it is (nothing travels, nothing is
  // quantized).
  Status start(std::vector<float> mean, int64_t samples);
  bool started() const { return started_; }

  // A PART of this group. invalid_argument for one that does not fit (wrong sender
  // for its index, chunk or size); already_exists for a duplicate (the first stays).
  Status receive(const RoundMessage& part);

  bool complete() const;
  // The members whose contributions to this member's part never came: who kept
  // the group from completing (an owner waiting on them sends nothing either).
  std::vector<std::string> missing() const;
  const std::vector<float>& averaged() const { return averaged_; }
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
  Status maybe_reduce();
  Status send_part(int to, const RoundMessage& header, const wire::Frame& payload, int64_t count);
  std::vector<Range> chunks_of(int part) const;

  GroupSpec spec_;
  RoundCodec codec_;
  int me_ = -1;
  bool started_ = false;
  std::vector<float> mean_;
  std::vector<Range> parts_;
  std::map<int, int64_t> samples_of_;  // member index -> the samples its contribution holds, capped
  std::map<std::pair<int, int>, std::vector<float>> contributions_;  // (from, chunk) to my part
  bool reduced_ = false;
  std::map<std::pair<int, int>, std::vector<float>> gathered_;  // (owner, chunk)
  std::vector<float> averaged_;
  int64_t gathered_values_ = 0;
  std::map<std::string, uint64_t> hashes_;
  std::vector<Outgoing> outgoing_;
  int64_t payload_bytes_sent_ = 0;
  int64_t payload_values_sent_ = 0;
};

}  // namespace swarm
