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
//   swarm::AllReduceInbox inbox;                 // the peer's server delivers parts here
//   SWARM_ASSIGN_OR_RETURN(swarm::AllReduceResult r,
//       swarm::butterfly_all_reduce(clients, inbox, round, local_mean, config));
#pragma once

#include <algorithm>
#include <chrono>
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

#include "swarm/averaging/averaging_messages.h"
#include "transports/client_cache.h"
#include "swarm/core/status.h"
#include "transports/transport.h"

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
    std::vector<float> values;
  };
  // phase 0: a contribution to part `part` from member `from`; phase 1: the averaged part from its owner.
  using Key = std::tuple<uint64_t /*digest*/, int /*phase*/, int /*part*/, int /*chunk*/, int /*from*/>;

  // From the server handler: validates and stores. Parts of rounds at or before a
  // step this peer has finished are refused, so stale mail cannot pile up.
  Status deliver(const wire::DecodedMessage& message);

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
};

namespace all_reduce_detail {

Result<wire::Frames> encode_part(int stage, uint64_t digest, int64_t step, int phase, int part, int chunk, int from,
                                 const std::string& sender, double weight, uint64_t params_hash,
                                 std::span<const float> values);

// Owner-side reduction of one chunk: contributions in member order; the weighted
// mean, accumulated in double. Missing contributions (nullptr) are skipped.
std::vector<float> weighted_mean(const std::vector<const std::vector<float>*>& values,
                                 const std::vector<double>& weights, int64_t size);

}  // namespace all_reduce_detail

template <Transport T>
Result<AllReduceResult> butterfly_all_reduce(ClientCache<T>& clients, AllReduceInbox& inbox, AllReduceRound round,
                                             std::span<const float> local_mean, const AllReduceConfig& config,
                                             const AllReduceHooks& hooks = {}) {
  using namespace all_reduce_detail;
  SWARM_RETURN_IF_ERROR(config.validate());
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
  std::map<uint64_t, std::vector<float>> reduced_by_group;
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
    // whose call fails is marked failed. Returns the hook's verdict.
    auto send_all = [&](int phase, auto values_of) -> Status {
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
          SWARM_ASSIGN_OR_RETURN(
              wire::Frames frames,
              encode_part(round.stage, digest, round.step, phase, part, static_cast<int>(c), me, round.my_id,
                          round.weight, round.params_hash, values_of(range)));
          pending.push_back({j, client->call(std::move(frames), deadline)});
          ++result.messages_sent;
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
    SWARM_RETURN_IF_ERROR(send_all(0, [&](ElementRange r) { return local_mean.subspan(r.begin, r.size()); }));
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
      std::vector<float> reduced(static_cast<size_t>(parts[me].size()));
      for (size_t c = 0; c < mine.size(); ++c) {
        std::vector<std::optional<AllReduceInbox::Part>> got(n);
        std::vector<const std::vector<float>*> values(n, nullptr);
        std::vector<double> weights(n, 0.0);
        std::vector<float> own(local_mean.begin() + mine[c].begin, local_mean.begin() + mine[c].end);
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
        std::copy(mean.begin(), mean.end(), reduced.begin() + (mine[c].begin - parts[me].begin));
      }
      cached = reduced_by_group.emplace(digest, std::move(reduced)).first;
    }
    for (const auto& [id, h] : contributor_hashes) hashes[id] = h;
    const std::vector<float>& reduced = cached->second;

    // All-gather.
    SWARM_RETURN_IF_ERROR(send_all(1, [&](ElementRange r) {
      return std::span<const float>(reduced).subspan(r.begin - parts[me].begin, r.size());
    }));
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
