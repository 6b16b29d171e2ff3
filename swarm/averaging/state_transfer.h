// state_transfer: a joining or lagging peer downloads a stage-mate's parameters and
// optimizer state, in chunks, resuming from another donor if one dies, and checks
// what arrived before anyone loads it.
//
// The state is a Checkpoint (swarm/checkpoint) encoded in memory. Replicas of a stage
// at the same step hold bit-identical state, so their encodings are byte-identical:
// a download that loses its donor continues at the same offset from any other donor
// that offers the same hash, and starts over only if none does. That hash is the
// donor's own word, good for stitching chunks and nothing more: the caller's
// StateCheck decides whether a state is the stage's (StageSync: the parameters hash
// a strict majority of fresh stage-mates published for its step, finite values, the
// stage's layout). A state it refuses is dropped and the next donor tried.
//
//   // donor, in its server handler:
//   return donor.handle(request, current_step, [&] { return snapshot_under_lock(); });
//   // joiner:
//   SWARM_ASSIGN_OR_RETURN(swarm::Checkpoint state,
//       swarm::download_state(clients, stage, donors_freshest_first, config, &report, check));
#pragma once

#include <chrono>
#include <cstdint>
#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include <xxhash.h>

#include "swarm/averaging/all_reduce.h"
#include "swarm/averaging/averaging_messages.h"
#include "swarm/protocol/client_cache.h"
#include "swarm/checkpoint/checkpoint.h"
#include "swarm/api/transport.h"

namespace swarm {

struct StateTransferConfig {
  int64_t chunk_bytes = 1 << 20;
  double call_timeout_seconds = 5.0;
  // A donor claiming a larger state is refused before anything is fetched; the peer
  // derives it from its parameter count (parameters and optimizer state, with slack).
  int64_t max_state_bytes = int64_t{1} << 34;
  // A swarm with an owner: this peer's certificate, sent with its state requests,
  // since donors serve certified callers only. Empty otherwise.
  std::string credential;
};

// The cap for a stage of `parameters` f32 parameters: the values and two optimizer
// moments each, and room for names, shapes and counters.
constexpr int64_t state_bytes_cap(int64_t parameters) { return parameters * 4 * 4 + (int64_t{1} << 20); }

// The fields a donor sends back for {"op": "info"}, type- and range-checked.
struct StateInfo {
  int64_t step = 0;
  int64_t bytes = 0;
  uint64_t hash = 0;
};
Result<StateInfo> parse_state_info(const nlohmann::json& meta, int64_t max_bytes);

// Serves state_chunk requests: {"op": "info"} -> {step, bytes, hash}, and
// {"op": "chunk", "hash", "offset", "length"} -> the bytes. The encoding is made
// once per step and kept, so chunks of one download all come from one snapshot.
class StateDonor {
 public:
  using Snapshot = std::function<Result<Checkpoint>()>;
  // Test hook: called after each chunk served; an error makes this donor "die".
  std::function<Status(int64_t chunks_served)> after_chunk;

  wire::Frames handle(const wire::DecodedMessage& request, int stage, int64_t current_step, const Snapshot& snapshot);
  // Requests answered with an error: malformed, out of range, for another snapshot.
  int64_t refused_requests() const { return refused_.load(); }

 private:
  Result<wire::Frames> answer(const wire::DecodedMessage& request, int stage, int64_t current_step,
                              const Snapshot& snapshot);
  std::mutex mu_;
  int64_t step_ = -1;
  uint64_t hash_ = 0;
  std::string bytes_;
  int64_t chunks_served_ = 0;
  std::atomic<int64_t> refused_{0};
};

struct StateDownloadReport {
  std::vector<std::string> donors_used;  // in order; more than one after a donor failed
  int64_t bytes = 0;
  int64_t resumed_at = -1;  // offset where a later donor took over, -1 if none did
  // Offers the StateCheck refused ("donor: why"), before fetching (its step) or after.
  std::vector<std::string> refused;
};

// What must hold of a state before it is loaded. Either may be unset (not checked).
struct StateCheck {
  // Before a byte is fetched: may a state of the step a donor offers be taken at all?
  std::function<Status(int64_t step)> step;
  // The decoded state, before anyone loads it.
  std::function<Status(const Checkpoint& state)> state;
};

// invalid_argument naming the first floating-point tensor with a NaN or infinity.
Status check_finite(const Checkpoint& state);

Result<wire::Frames> encode_state_request(int stage, const nlohmann::json& meta, std::string credential = {});

namespace state_transfer_detail {

// A download in progress: the bytes of one snapshot, from one or more donors.
struct Partial {
  std::string bytes;
  uint64_t hash = 0;
  int64_t total = -1;
  void clear() {
    bytes.clear();
    total = -1;
  }
};

// Takes a donor's offer: continues what `partial` holds when it is the same
// snapshot (same hash and size), starts over otherwise.
void adopt_offer(Partial* partial, const StateInfo& offer, StateDownloadReport* report);

// Checks the bytes, decodes them and runs the caller's check on the result.
Result<Checkpoint> accept_state(const Partial& partial, const StateInfo& info, const StateCheck& check,
                                const std::string& what);

// One state request to a donor, with the config's deadline.
template <typename Client>
Result<ReceivedMessage> ask(Client& client, int stage, const nlohmann::json& meta, const StateTransferConfig& config) {
  const auto timeout = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(config.call_timeout_seconds));
  SWARM_ASSIGN_OR_RETURN(wire::Frames frames, encode_state_request(stage, meta, config.credential));
  return decode_result_reply(client.call(std::move(frames), Clock::now() + timeout).get());
}

// Fetches the rest of `partial` from one donor, chunk by chunk.
template <typename Client>
Status fetch_rest(Client& client, int stage, Partial* partial, const StateTransferConfig& config) {
  while (static_cast<int64_t>(partial->bytes.size()) < partial->total) {
    const int64_t offset = static_cast<int64_t>(partial->bytes.size());
    const int64_t length = std::min<int64_t>(config.chunk_bytes, partial->total - offset);
    SWARM_ASSIGN_OR_RETURN(
        ReceivedMessage chunk,
        ask(client, stage, {{"op", "chunk"}, {"hash", hex64(partial->hash)}, {"offset", offset}, {"length", length}},
            config));
    if (chunk.message.tensors.size() != 2 || static_cast<int64_t>(chunk.message.tensors[1].payload.size()) != length) {
      return data_loss("a malformed chunk");
    }
    partial->bytes.append(chunk.message.tensors[1].payload);
  }
  return Status::ok();
}

}  // namespace state_transfer_detail

// Tries donors in order, each state through `check`. Errors: unavailable when no
// donor answered; otherwise the last donor's failure or refusal.
template <Transport T>
Result<Checkpoint> download_state(ClientCache<T>& clients, int stage, const std::vector<AllReduceMember>& donors,
                                  const StateTransferConfig& config, StateDownloadReport* report,
                                  const StateCheck& check = {}) {
  using namespace state_transfer_detail;
  Partial partial;
  Status last = unavailable("no donors for stage {}", stage);
  for (const AllReduceMember& donor : donors) {
    const std::string what = fmt::format("state of stage {} from {}", stage, donor.peer_id);
    auto refuse = [&](const Status& why) {
      last = why.with_context(what);
      if (report != nullptr) report->refused.push_back(fmt::format("{}: {}", donor.peer_id, why.message()));
    };
    auto client = clients.get(donor.address);
    if (client == nullptr) {
      last = unavailable("cannot connect to donor {} at {}", donor.peer_id, donor.address);
      continue;
    }
    auto info = ask(*client, stage, {{"op", "info"}}, config);
    if (!info.is_ok()) {
      last = info.status().with_context(what);
      clients.forget(donor.address);
      continue;
    }
    auto meta = control_json(info->message);
    auto offer = meta.is_ok() ? parse_state_info(*meta, config.max_state_bytes) : Result<StateInfo>(meta.status());
    if (!offer.is_ok()) {
      last = data_loss("donor {} answered a bad state info: {}", donor.peer_id, offer.status().message());
      continue;
    }
    if (Status allowed = check.step ? check.step(offer->step) : Status::ok(); !allowed.is_ok()) {
      refuse(allowed);
      continue;
    }
    adopt_offer(&partial, *offer, report);
    if (report != nullptr) report->donors_used.push_back(donor.peer_id);
    if (Status fetched = fetch_rest(*client, stage, &partial, config); !fetched.is_ok()) {
      last = fetched.with_context(what);  // what arrived is kept: another donor may continue it
      clients.forget(donor.address);
      continue;
    }
    auto state = accept_state(partial, *offer, check, what);
    if (!state.is_ok()) {
      refuse(state.status());
      partial.clear();  // nothing of a refused state is resumed from
      continue;
    }
    if (report != nullptr) report->bytes = static_cast<int64_t>(partial.bytes.size());
    return state;
  }
  return last;
}

}  // namespace swarm
