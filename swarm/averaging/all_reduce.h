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
// An owner averages only what the members themselves sent: the inbox holds parts by
// sender (checked against the authenticated connection by the application's
// speaks_for), the owner reads each index's part under that member's id, and a
// contribution weighing more than the samples its member published is left out.
//
//   swarm::AllReduceInbox inbox(options);        // the peer's server delivers parts here:
//   //   inbox.deliver<Codecs>(message, config.codec, authenticated_sender)
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
#include <limits>
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
#include "swarm/core/ids.h"
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
  // The most samples its contribution may weigh: the count it published when it
  // joined. A member that claims more in its parts is left out of the mean, so no
  // one can outweigh the stage by writing a large number into a message.
  double max_weight = std::numeric_limits<double>::infinity();
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
  // A larger group is refused: the inbox's bounds (part indices, how much mail it
  // holds) are sized for at most this many members.
  int max_members = 256;

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
  // bf16, 1 + 4/4096 and a little per chunk for 8bit, 0.5 + 4/64 for 4bit.
  int64_t payload_bytes_sent = 0;
  int64_t payload_values_sent = 0;
};

// Test hooks. Called after each part this peer sends; an error aborts the round at
// once, as if the process died there (the peer makes itself unreachable first).
struct AllReduceHooks {
  std::function<Status(int64_t parts_sent)> after_send;
};

// Whether the transport's authenticated `identity` may send as `peer_id` (with CURVE
// the identity names the client's key). Supplied by the application, which knows
// how ids are bound to keys; unset, everyone passes: plaintext swarms cannot tell.
using SpeaksFor = std::function<bool(const std::string& peer_id, const PeerIdentity& identity)>;

// How much an inbox takes. The defaults fit any test; a peer sizes them from its
// gradient and config with inbox_limits().
struct InboxLimits {
  int64_t max_parts = 1 << 16;               // held at once, all steps together
  int64_t max_values = int64_t{1} << 28;     // decoded floats held at once
  int64_t max_chunk_elements = 1 << 18;      // in one part
  int max_members = 256;                     // part and member indices are below this
  double max_weight = std::numeric_limits<double>::infinity();  // samples one part may weigh
};

// Sized for what honest rounds over a gradient of `gradient_values` floats leave in
// one member's inbox. Per step and attempt a member receives at most n-1
// contributions to its part and every other part once: under two gradients of
// values, in under 2 x (chunks + members) messages. Two steps are held, and a
// re-run of a round may arrive beside the late parts of the run before it: room
// for two of those per step. max_weight: the global batch, in samples.
InboxLimits inbox_limits(int64_t gradient_values, const AllReduceConfig& config, double max_weight);

// What an inbox refused or left out so far, by reason (a snapshot; any thread may take one).
struct InboxCounters {
  int64_t malformed = 0;   // bad fields, codec, size or non-finite values
  int64_t bad_weight = 0;  // non-finite, negative, or above the global batch
  int64_t impostor = 0;    // the authenticated identity does not speak for the sender
  int64_t not_member = 0;  // the sender is not a known stage-mate
  int64_t stale = 0;       // for a step this peer has finished
  int64_t far_future = 0;  // beyond the step after this peer's current one
  int64_t duplicate = 0;   // that sender's part under that key is held already: the first one stays
  int64_t full = 0;        // the inbox holds all it may
  // Left out by the round that took them, not refused on arrival:
  int64_t wrong_sender = 0;    // under a member's key, sent as someone else
  int64_t over_published = 0;  // weighing more than the member published
  int64_t refused() const {
    return malformed + bad_weight + impostor + not_member + stale + far_future + duplicate + full;
  }
  int64_t ignored() const { return wrong_sender + over_published; }
};

// Where a peer's server puts the parts it receives, until its own round reads them.
// Bounded: it keeps parts for this peer's current step and the next one only, one
// per key and sender, and no more than its limits; hostile mail gets an error reply
// and a counter, and never grows it past them.
class AllReduceInbox {
 public:
  struct Part {
    int64_t step = 0;
    double weight = 0;
    uint64_t params_hash = 0;
    std::string sender;         // checked by speaks_for when the inbox has one
    std::vector<float> values;  // decoded: always finite
  };
  // phase 0: a contribution to part `part` from member `from`; phase 1: the averaged part from its owner.
  using Key = std::tuple<uint64_t /*digest*/, int /*phase*/, int /*part*/, int /*chunk*/, int /*from*/>;
  // Parts are held by key and sender, and read back with the sender the round
  // expects at that index: a part that names someone else cannot take the place
  // of the member's own, whichever arrives first.

  struct Options {
    InboxLimits limits;
    SpeaksFor speaks_for;
    // Whether `peer_id` is a stage-mate this peer knows (the round's members are
    // among them); unset, every sender is. Called on the server's threads.
    std::function<bool(const std::string& peer_id)> is_member;
  };

  // A CodecTable's members, type-erased, so the inbox itself is no template.
  struct Decoder {
    CodecId codec = CodecId::none;  // the round's codec: a part in any other is refused
    Result<uint64_t> (*encoded_bytes)(CodecId, uint64_t) = nullptr;
    Status (*decode)(CodecId, std::span<const std::byte>, std::span<float>) = nullptr;
  };

  AllReduceInbox() = default;
  explicit AllReduceInbox(Options options) : options_(std::move(options)) {}

  // From the server handler, with the identity the transport authenticated:
  // validates, decodes with the codec named in the part's tensor header, and stores
  // the values. Refused, each reason counted: invalid_argument for a malformed part
  // (fields, indices, a codec other than the round's, a payload whose size is not
  // that codec's for the element count, a value that is not finite) or a bad
  // weight; permission_denied for a sender the identity does not speak for, or one
  // that is no known stage-mate; failed_precondition for a step this peer has
  // finished; out_of_range for a step past the next one; already_exists for a
  // key held already (the first part stays); resource_exhausted when full.
  template <CodecTable Codecs>
  Status deliver(const wire::DecodedMessage& message, CodecId codec, const PeerIdentity& from) {
    return deliver(message,
                   Decoder{codec, [](CodecId id, uint64_t n) { return Codecs::encoded_bytes(id, n); },
                           [](CodecId id, std::span<const std::byte> encoded, std::span<float> values) {
                             return Codecs::decode(id, encoded, values);
                           }},
                   from);
  }
  Status deliver(const wire::DecodedMessage& message, const Decoder& decoder, const PeerIdentity& from);
  // A round in codec none (raw f32), which needs no codec table.
  Status deliver(const wire::DecodedMessage& message, const PeerIdentity& from);
  // Parts deliver refused so far, for any reason.
  int64_t refused() const { return counters().refused(); }
  InboxCounters counters() const;
  // A round left a part it took out of its mean.
  void count_over_published() { ++over_published_; }

  // Waits until `done()` (called under the lock) or the deadline.
  template <typename Predicate>
  bool wait_until(Deadline deadline, Predicate done) {
    std::unique_lock lock(mu_);
    return cv_.wait_until(lock, deadline, [&] { return done(); });
  }
  // Under the lock held by wait_until's predicate, or with none held.
  const Part* find_locked(const Key& key, const std::string& sender) const {
    auto it = mail_.find({key, sender});
    return it == mail_.end() ? nullptr : &it->second;
  }
  // The part `sender` sent under `key`. Parts under that key from anyone else are
  // dropped with it and counted (wrong_sender): the round has no use for them.
  std::optional<Part> take(const Key& key, const std::string& sender);

  // Drops everything for steps <= step; from then on it takes parts for steps
  // step + 1 (the one this peer is in) and step + 2 (stage-mates a step ahead).
  void finish_step(int64_t step);
  size_t size() const;
  int64_t values_held() const;

 private:
  struct Parsed;
  Result<Parsed> parse(const wire::DecodedMessage& message, const Decoder& decoder) const;
  Status check_claims(const Parsed& parsed, const PeerIdentity& from);  // weight and sender
  Status reserve(const Parsed& parsed);
  void release(const Parsed& parsed);  // under mu_
  Status step_window(int64_t step);    // under mu_
  Status store(Parsed parsed, const Decoder& decoder);

  const Options options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  using Slot = std::pair<Key, std::string /*sender*/>;
  std::map<Slot, Part> mail_;
  std::set<Slot> reserved_;    // admitted, being decoded
  int64_t parts_held_ = 0;     // mail_ and reserved_
  int64_t values_held_ = 0;    // in mail_ and reserved_
  int64_t finished_step_ = -1;
  std::atomic<int64_t> malformed_{0}, bad_weight_{0}, impostor_{0}, not_member_{0}, stale_{0}, far_future_{0},
      duplicate_{0}, full_{0}, wrong_sender_{0}, over_published_{0};
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

// Whether the receiver holds the part now. A duplicate refusal counts: an attempt
// of the same group re-sends the same bytes, and a late copy of the earlier
// attempt's may be there already.
bool delivered(const Result<ReceivedMessage>& reply);

// Whether an owner may average `member`'s part: of the chunk's size, weighing no
// more than the member published (counted in the inbox when it weighs more).
bool usable_contribution(const AllReduceInbox::Part& part, const AllReduceMember& member, int64_t size,
                         AllReduceInbox& inbox);

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
  if (members.size() > static_cast<size_t>(config.max_members)) {
    return invalid_argument("all-reduce of step {}: {} members, more than the {} an inbox is sized for", round.step,
                            members.size(), config.max_members);
  }
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
        if (!delivered(decode_result_reply(p.call.get()))) failed.insert(p.to);
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
            if (inbox.find_locked({digest, 0, me, static_cast<int>(c), i}, members[i].peer_id) == nullptr) return false;
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
          got[i] = inbox.take({digest, 0, me, static_cast<int>(c), i}, members[i].peer_id);
          if (!got[i] || !usable_contribution(*got[i], members[i], mine[c].size(), inbox)) continue;
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
          if (inbox.find_locked({digest, 1, j, static_cast<int>(c), j}, members[j].peer_id) == nullptr) return false;
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
        auto part = inbox.take({digest, 1, j, static_cast<int>(c), j}, members[j].peer_id);
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
