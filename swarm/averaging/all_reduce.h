// all_reduce: butterfly averaging of a stage's gradients among its live peers.
//
// The flat gradient is cut into one part per member. Reduce-scatter: every member
// sends part j of its local mean gradient, with its sample count as the weight, to
// member j. Member j averages what arrives by its deadline (in member order, so the
// result does not depend on arrival order), then all-gather: it sends the averaged
// part to everyone. Parts are cut into chunks of bounded size; every wait has a
// deadline. A member that dies or stalls is dropped: its contributions are left out
// of the parts that did not get them, and if it owned a part the survivors ping the
// group and run the round again without it, until the round's deadline, provided
// they are a strict majority of the starting group (so a split can never leave two
// sides that both step). Every
// message names the round by a digest of (step, members), so members that disagree
// about the group never mix their numbers; they time out and regroup instead.
// Every surviving member ends with the same averaged vector, bit for bit, because
// each part is computed once, by its owner.
//
// Parts travel in the round's codec (AllReduceConfig::codec, from a CodecTable the
// caller names; this package sees only the concept). The owner decodes every
// contribution, its own included after the same encode/decode round trip, and
// keeps decode(encode(mean)) of its part: exactly what the others decode from the
// bytes it sends, so the lossy codecs keep the replicas bit-identical too.
//
//   swarm::AllReduceInbox inbox;                 // the peer's server delivers parts here:
//   //   inbox.deliver<Codecs>(message, config.codec)
//   SWARM_ASSIGN_OR_RETURN(swarm::AllReduceResult r,
//       swarm::butterfly_all_reduce<Codecs>(clients, inbox, round, local_mean, config));
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "swarm/api/codec.h"
#include "swarm/averaging/averaging_messages.h"
#include "swarm/protocol/client_cache.h"
#include "swarm/core/status.h"
#include "swarm/api/transport.h"

namespace swarm {

struct AllReduceMember {
  std::string peer_id;
  std::string address;
  // The member's nonce for this round, as published when it joined (0 if not seen).
  // Part of the group digest: a round a peer re-runs for the same step, or one a
  // stalled peer resumes, never takes parts from another run of that step.
  uint64_t round_nonce = 0;
  friend bool operator==(const AllReduceMember&, const AllReduceMember&) = default;
};

struct AllReduceConfig {
  int64_t max_chunk_elements = 1 << 18;  // 1 MiB of f32 per message
  double part_timeout_seconds = 5.0;     // each phase's wait for its parts
  double round_timeout_seconds = 30.0;   // all attempts together
  double ping_timeout_seconds = 1.0;     // who is still alive, after a failed attempt
  // How the parts travel, both phases. Every member of a round must use the same
  // one: an inbox refuses parts in another codec.
  CodecId codec = CodecId::none;

  Status validate() const;
};

struct ElementRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  friend bool operator==(const ElementRange&, const ElementRange&) = default;
};

// `parts` contiguous ranges covering [0, total), sizes differing by at most one.
std::vector<ElementRange> split_evenly(int64_t total, int64_t parts);
// `range` cut into pieces of at most max_size elements (one empty piece for an empty range).
std::vector<ElementRange> split_bounded(ElementRange range, int64_t max_size);

// Names a round: equal for equal (step, sorted member ids and their nonces), different otherwise.
uint64_t group_digest(int64_t step, const std::vector<AllReduceMember>& members);

// One round of one peer: who takes part, and what this peer brings.
struct AllReduceRound {
  int stage = 0;
  int64_t step = 0;
  std::string my_id;
  std::vector<AllReduceMember> members;  // including this peer; any order
  double weight = 0;                     // samples behind the local mean; 0 adds nothing
  uint64_t params_hash = 0;              // this replica's parameters, compared in the round
};

struct AllReduceResult {
  std::vector<float> averaged;
  std::vector<AllReduceMember> members;  // the group that completed the round
  // Parameter hashes of every member heard from, this peer included.
  std::vector<std::pair<std::string, uint64_t>> params_hashes;
  int attempts = 0;
  int64_t messages_sent = 0;
  // What this peer sent of the gradient parts, over all attempts, both phases: the
  // encoded payload bytes (control fields not included) and the float values they
  // carry. Their ratio is the round's bytes per value: 4 for none, 2 for fp16 and
  // bf16, 1 + 4/4096 and a little per chunk for 8bit.
  int64_t payload_bytes_sent = 0;
  int64_t payload_values_sent = 0;
};

// Test hooks. Called after each part this peer sends; an error aborts the round at
// once, as if the process died there (the peer makes itself unreachable first).
struct AllReduceHooks {
  std::function<Status(int64_t parts_sent)> after_send;
};

// Where a peer's server puts the parts it receives, until its own round reads them.
class AllReduceInbox {
 public:
  struct Part {
    int64_t step = 0;
    double weight = 0;
    uint64_t params_hash = 0;
    std::string sender;
    std::vector<float> values;  // decoded: always finite
  };
  // phase 0: a contribution to part `part` from member `from`; phase 1: the averaged part from its owner.
  using Key = std::tuple<uint64_t /*digest*/, int /*phase*/, int /*part*/, int /*chunk*/, int /*from*/>;

  // A CodecTable's members, type-erased, so the inbox itself is no template.
  struct Decoder {
    CodecId codec = CodecId::none;  // the round's codec: a part in any other is refused
    Result<uint64_t> (*encoded_bytes)(CodecId, uint64_t) = nullptr;
    Status (*decode)(CodecId, std::span<const std::byte>, std::span<float>) = nullptr;
  };

  // From the server handler: validates, decodes with the codec named in the
  // part's tensor header, and stores the values. Refused with invalid_argument: a
  // malformed part, a codec other than `codec` (the round's), a payload whose size
  // is not that codec's for the element count, a value or scale that is not
  // finite. Parts of rounds at or before a step this peer has finished are refused
  // (failed_precondition), so stale mail cannot pile up. Every refusal is counted.
  template <CodecTable Codecs>
  Status deliver(const wire::DecodedMessage& message, CodecId codec) {
    return deliver(message, Decoder{codec,
                                    [](CodecId id, uint64_t n) { return Codecs::encoded_bytes(id, n); },
                                    [](CodecId id, std::span<const std::byte> encoded, std::span<float> values) {
                                      return Codecs::decode(id, encoded, values);
                                    }});
  }
  Status deliver(const wire::DecodedMessage& message, const Decoder& decoder);
  // A round in codec none (raw f32), which needs no codec table.
  Status deliver(const wire::DecodedMessage& message);
  // Parts deliver refused so far, for any reason.
  int64_t refused() const { return refused_.load(); }

  // Waits until `done()` (called under the lock) or the deadline.
  template <typename Predicate>
  bool wait_until(Deadline deadline, Predicate done) {
    std::unique_lock lock(mu_);
    return cv_.wait_until(lock, deadline, [&] { return done(); });
  }
  // Under the lock held by wait_until's predicate, or with none held.
  const Part* find_locked(const Key& key) const {
    auto it = mail_.find(key);
    return it == mail_.end() ? nullptr : &it->second;
  }
  std::optional<Part> take(const Key& key);

  // Drops everything for steps <= step.
  void finish_step(int64_t step);
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<Key, Part> mail_;
  int64_t finished_step_ = -1;
  std::atomic<int64_t> refused_{0};
};

namespace all_reduce_detail {

// One part message whose values are already encoded in `codec` (count values);
// the payload frame is shared, not copied.
Result<wire::Frames> encode_part(int stage, uint64_t digest, int64_t step, int phase, int part, int chunk, int from,
                                 const std::string& sender, double weight, uint64_t params_hash, CodecId codec,
                                 int64_t count, wire::Frame payload);
// The same with raw f32 values (codec none).
Result<wire::Frames> encode_part(int stage, uint64_t digest, int64_t step, int phase, int part, int chunk, int from,
                                 const std::string& sender, double weight, uint64_t params_hash,
                                 std::span<const float> values);

// values in `codec`, as one frame.
template <CodecTable Codecs>
Result<wire::Frame> encode_values(CodecId codec, std::span<const float> values) {
  SWARM_ASSIGN_OR_RETURN(uint64_t bytes, Codecs::encoded_bytes(codec, values.size()));
  std::string buffer(static_cast<size_t>(bytes), '\0');
  SWARM_RETURN_IF_ERROR(Codecs::encode(codec, values, std::as_writable_bytes(std::span<char>(buffer))));
  return wire::Frame(std::move(buffer));
}

// A frame of encode_values decoded into values (of the size it was encoded from):
// what every receiver of that frame decodes.
template <CodecTable Codecs>
Status decode_frame(CodecId codec, const wire::Frame& encoded, std::span<float> values) {
  return Codecs::decode(codec, std::as_bytes(std::span<const char>(encoded.data(), encoded.size())), values);
}

// Owner-side reduction of one chunk: contributions in member order; the weighted
// mean, accumulated in double. Missing contributions (nullptr) are skipped.
std::vector<float> weighted_mean(const std::vector<const std::vector<float>*>& values,
                                 const std::vector<double>& weights, int64_t size);

}  // namespace all_reduce_detail

// Codecs: the CodecTable that encodes and decodes config.codec (which it must
// support). An error of encoding this peer's own numbers (fp16 refuses |x| > 65504)
// ends the round with that error. A group of one returns local_mean as it is:
// nothing travels, so nothing is quantized.
template <CodecTable Codecs, Transport T>
Result<AllReduceResult> butterfly_all_reduce(ClientCache<T>& clients, AllReduceInbox& inbox, AllReduceRound round,
                                             std::span<const float> local_mean, const AllReduceConfig& config,
                                             const AllReduceHooks& hooks = {}) {
  using namespace all_reduce_detail;
  SWARM_RETURN_IF_ERROR(config.validate());
  const CodecId codec = config.codec;
  if (!Codecs::supports(codec)) {
    return invalid_argument("all-reduce: the codec table does not support codec {}", codec_name(codec));
  }
  auto seconds = [](double s) { return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)); };
  const Deadline round_deadline = Clock::now() + seconds(config.round_timeout_seconds);
  const int64_t total = static_cast<int64_t>(local_mean.size());
  std::vector<AllReduceMember> members = round.members;
  std::sort(members.begin(), members.end(),
            [](const AllReduceMember& a, const AllReduceMember& b) { return a.peer_id < b.peer_id; });
  members.erase(std::unique(members.begin(), members.end(),
                            [](const auto& a, const auto& b) { return a.peer_id == b.peer_id; }),
                members.end());
  const size_t starting_size = members.size();
  AllReduceResult result;
  uint64_t request_id = 1;
  // This peer's part, reduced, per group: the values it keeps (already through the
  // codec's round trip) and, per chunk, the encoded bytes it sends.
  struct Reduced {
    std::vector<float> values;
    std::vector<wire::Frame> encoded;
  };
  std::map<uint64_t, Reduced> reduced_by_group;
  std::map<uint64_t, int> tries_by_group;
  std::map<std::string, uint64_t> contributor_hashes;
  for (;;) {
    ++result.attempts;
    const int n = static_cast<int>(members.size());
    int me = -1;
    for (int i = 0; i < n; ++i) {
      if (members[i].peer_id == round.my_id) me = i;
    }
    if (me < 0) return invalid_argument("peer {} is not a member of its own all-reduce group", round.my_id);
    std::map<std::string, uint64_t> hashes{{round.my_id, round.params_hash}};
    if (n == 1) {
      result.averaged.assign(local_mean.begin(), local_mean.end());
      result.members = members;
      result.params_hashes.assign(hashes.begin(), hashes.end());
      return result;
    }
    const uint64_t digest = group_digest(round.step, members);
    // Everyone answers pings, yet the same group failed twice: its members disagree
    // about who is in it (or one is in another round). Give up; the caller re-syncs.
    if (++tries_by_group[digest] > 2) {
      return unavailable("all-reduce of step {}: the group of {} stayed incomplete over {} attempts", round.step,
                         members.size(), result.attempts - 1);
    }
    const std::vector<ElementRange> parts = split_evenly(total, n);
    std::vector<std::vector<ElementRange>> chunks(n);
    for (int j = 0; j < n; ++j) chunks[j] = split_bounded(parts[j], config.max_chunk_elements);
    std::set<int> failed;
    int64_t parts_sent = 0;

    // Sends chunk messages to every other member, all in flight at once; a member
    // whose call fails is marked failed. payload_of(part, chunk) gives the encoded
    // values. Returns the hook's verdict, or an error of encoding.
    auto send_all = [&](int phase, auto payload_of) -> Status {
      struct Pending {
        int to;
        decltype(std::declval<typename T::client_type&>().call(wire::Frames{}, Deadline{})) call;
      };
      std::vector<Pending> pending;
      const Deadline deadline = std::min(round_deadline, Clock::now() + seconds(config.part_timeout_seconds));
      for (int j = 0; j < n; ++j) {
        if (j == me || failed.count(j)) continue;
        auto client = clients.get(members[j].address);
        if (client == nullptr) {
          failed.insert(j);
          continue;
        }
        const int part = phase == 0 ? j : me;
        for (size_t c = 0; c < chunks[part].size(); ++c) {
          const ElementRange range = chunks[part][c];
          SWARM_ASSIGN_OR_RETURN(wire::Frame payload, payload_of(part, c));
          const int64_t payload_bytes = static_cast<int64_t>(payload.size());
          SWARM_ASSIGN_OR_RETURN(
              wire::Frames frames,
              encode_part(round.stage, digest, round.step, phase, part, static_cast<int>(c), me, round.my_id,
                          round.weight, round.params_hash, codec, range.size(), std::move(payload)));
          pending.push_back({j, client->call(std::move(frames), deadline)});
          ++result.messages_sent;
          result.payload_bytes_sent += payload_bytes;
          result.payload_values_sent += range.size();
          ++parts_sent;
          if (hooks.after_send) SWARM_RETURN_IF_ERROR(hooks.after_send(parts_sent));
        }
      }
      for (auto& p : pending) {
        if (!decode_result_reply(p.call.get()).is_ok()) failed.insert(p.to);
      }
      return Status::ok();
    };

    // Members of a later attempt may start it up to one whole attempt apart (one
    // waited out a dead member that another saw fail at once), so later attempts
    // wait that much longer before leaving a live member's numbers out.
    const double wait_seconds =
        config.part_timeout_seconds +
        (result.attempts > 1 ? 2 * config.part_timeout_seconds + config.ping_timeout_seconds : 0.0);

    // Reduce-scatter.
    SWARM_RETURN_IF_ERROR(send_all(0, [&](int part, size_t c) {
      const ElementRange r = chunks[part][c];
      return encode_values<Codecs>(codec, local_mean.subspan(r.begin, r.size()));
    }));
    const auto& mine = chunks[me];
    // An owner computes its part once per group: a later attempt of the same group
    // re-sends the same numbers, so a late copy from an earlier attempt is identical.
    auto cached = reduced_by_group.find(digest);
    if (cached == reduced_by_group.end()) {
      inbox.wait_until(std::min(round_deadline, Clock::now() + seconds(wait_seconds)), [&] {
        for (int i = 0; i < n; ++i) {
          if (i == me || failed.count(i)) continue;
          for (size_t c = 0; c < mine.size(); ++c) {
            if (inbox.find_locked({digest, 0, me, static_cast<int>(c), i}) == nullptr) return false;
          }
        }
        return true;
      });
      Reduced reduced;
      reduced.values.resize(static_cast<size_t>(parts[me].size()));
      reduced.encoded.reserve(mine.size());
      for (size_t c = 0; c < mine.size(); ++c) {
        std::vector<std::optional<AllReduceInbox::Part>> got(n);
        std::vector<const std::vector<float>*> values(n, nullptr);
        std::vector<double> weights(n, 0.0);
        // This peer's own contribution goes through the codec like everyone else's.
        std::vector<float> own(static_cast<size_t>(mine[c].size()));
        {
          SWARM_ASSIGN_OR_RETURN(wire::Frame own_encoded,
                                 encode_values<Codecs>(codec, local_mean.subspan(mine[c].begin, mine[c].size())));
          SWARM_RETURN_IF_ERROR(decode_frame<Codecs>(codec, own_encoded, own));
        }
        for (int i = 0; i < n; ++i) {
          if (i == me) {
            values[i] = &own;
            weights[i] = round.weight;
            continue;
          }
          got[i] = inbox.take({digest, 0, me, static_cast<int>(c), i});
          if (!got[i] || static_cast<int64_t>(got[i]->values.size()) != mine[c].size()) continue;
          values[i] = &got[i]->values;
          weights[i] = got[i]->weight;
          contributor_hashes[members[i].peer_id] = got[i]->params_hash;
        }
        std::vector<float> mean = weighted_mean(values, weights, mine[c].size());
        // Encoded once, sent to all; the owner keeps exactly what they decode.
        SWARM_ASSIGN_OR_RETURN(wire::Frame encoded, encode_values<Codecs>(codec, mean));
        SWARM_RETURN_IF_ERROR(decode_frame<Codecs>(codec, encoded, mean));
        std::copy(mean.begin(), mean.end(), reduced.values.begin() + (mine[c].begin - parts[me].begin));
        reduced.encoded.push_back(std::move(encoded));
      }
      cached = reduced_by_group.emplace(digest, std::move(reduced)).first;
    }
    for (const auto& [id, h] : contributor_hashes) hashes[id] = h;
    const std::vector<float>& reduced = cached->second.values;
    const std::vector<wire::Frame>& reduced_encoded = cached->second.encoded;

    // All-gather: the same bytes to everyone.
    SWARM_RETURN_IF_ERROR(
        send_all(1, [&](int, size_t c) -> Result<wire::Frame> { return reduced_encoded[c]; }));
    inbox.wait_until(std::min(round_deadline, Clock::now() + seconds(wait_seconds)), [&] {
      for (int j = 0; j < n; ++j) {
        if (j == me || failed.count(j)) continue;  // an owner we could not reach sends nothing
        for (size_t c = 0; c < chunks[j].size(); ++c) {
          if (inbox.find_locked({digest, 1, j, static_cast<int>(c), j}) == nullptr) return false;
        }
      }
      return true;
    });
    std::vector<float> averaged(local_mean.size());
    std::copy(reduced.begin(), reduced.end(), averaged.begin() + parts[me].begin);
    bool complete = true;
    for (int j = 0; j < n; ++j) {
      if (j == me) continue;
      for (size_t c = 0; c < chunks[j].size(); ++c) {
        auto part = inbox.take({digest, 1, j, static_cast<int>(c), j});
        if (!part || static_cast<int64_t>(part->values.size()) != chunks[j][c].size()) {
          complete = false;
          failed.insert(j);
          continue;
        }
        hashes[members[j].peer_id] = part->params_hash;
        std::copy(part->values.begin(), part->values.end(), averaged.begin() + chunks[j][c].begin);
      }
    }
    if (complete) {
      result.averaged = std::move(averaged);
      result.members = members;
      result.params_hashes.assign(hashes.begin(), hashes.end());
      return result;
    }
    if (Clock::now() >= round_deadline) {
      return deadline_exceeded("all-reduce of step {} did not complete within {} s ({} attempts)", round.step,
                               config.round_timeout_seconds, result.attempts);
    }
    // Regroup: who still answers? Every survivor asks everyone, so they reach the same answer.
    std::vector<AllReduceMember> alive{members[me]};
    {
      struct Ping {
        int who;
        decltype(std::declval<typename T::client_type&>().call(wire::Frames{}, Deadline{})) call;
      };
      std::vector<Ping> pings;
      const Deadline deadline = std::min(round_deadline, Clock::now() + seconds(config.ping_timeout_seconds));
      for (int j = 0; j < n; ++j) {
        if (j == me) continue;
        auto client = clients.get(members[j].address);
        if (client == nullptr) continue;
        wire::MessageHeader header;
        header.kind = wire::MessageKind::ping;
        header.stage = static_cast<uint32_t>(round.stage);
        header.request_id = request_id++;
        SWARM_ASSIGN_OR_RETURN(wire::Frames frames, wire::encode_message(header, {}));
        pings.push_back({j, client->call(std::move(frames), deadline)});
      }
      for (auto& p : pings) {
        if (decode_result_reply(p.call.get()).is_ok()) {
          alive.push_back(members[p.who]);
        } else {
          clients.forget(members[p.who].address);
        }
      }
    }
    // Only a strict majority of the starting group may go on without the rest: two
    // halves that each lost sight of the other (a stalled process, a partition)
    // must not both step, or the stage would split into diverging replicas.
    if (2 * alive.size() <= starting_size) {
      return unavailable("all-reduce of step {}: {} of {} members answer, not a majority; the round is dropped",
                         round.step, alive.size(), starting_size);
    }
    std::sort(alive.begin(), alive.end(),
              [](const AllReduceMember& a, const AllReduceMember& b) { return a.peer_id < b.peer_id; });
    members = std::move(alive);
  }
}

}  // namespace swarm
