// state_transfer: a joining or lagging peer downloads a stage-mate's parameters and
// optimizer state, in chunks, verified by hash, resuming from another donor if one dies.
//
// The state is a Checkpoint (swarm/checkpoint) encoded in memory. Replicas of a stage
// at the same step hold bit-identical state, so their encodings are byte-identical:
// a download that loses its donor continues at the same offset from any other donor
// that offers the same hash, and starts over only if none does.
//
//   // donor, in its server handler:
//   return donor.handle(request, current_step, [&] { return snapshot_under_lock(); });
//   // joiner:
//   SWARM_ASSIGN_OR_RETURN(swarm::Checkpoint state,
//       swarm::download_state(clients, stage, donors_freshest_first, config, &report));
#pragma once

#include <chrono>
#include <cstdint>
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

 private:
  Result<wire::Frames> answer(const wire::DecodedMessage& request, int stage, int64_t current_step,
                              const Snapshot& snapshot);
  std::mutex mu_;
  int64_t step_ = -1;
  uint64_t hash_ = 0;
  std::string bytes_;
  int64_t chunks_served_ = 0;
};

struct StateDownloadReport {
  std::vector<std::string> donors_used;  // in order; more than one after a donor failed
  int64_t bytes = 0;
  int64_t resumed_at = -1;  // offset where a later donor took over, -1 if none did
};

Result<wire::Frames> encode_state_request(int stage, const nlohmann::json& meta);

// Tries donors in order. Errors: unavailable when every donor failed.
template <Transport T>
Result<Checkpoint> download_state(ClientCache<T>& clients, int stage, const std::vector<AllReduceMember>& donors,
                                  const StateTransferConfig& config, StateDownloadReport* report) {
  const auto timeout = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(config.call_timeout_seconds));
  std::string bytes;
  uint64_t hash = 0;
  int64_t total = -1;
  Status last = unavailable("no donors for stage {}", stage);
  for (const AllReduceMember& donor : donors) {
    auto client = clients.get(donor.address);
    if (client == nullptr) {
      last = unavailable("cannot connect to donor {} at {}", donor.peer_id, donor.address);
      continue;
    }
    auto call = [&](const nlohmann::json& meta) -> Result<ReceivedMessage> {
      SWARM_ASSIGN_OR_RETURN(wire::Frames frames, encode_state_request(stage, meta));
      return decode_result_reply(client->call(std::move(frames), Clock::now() + timeout).get());
    };
    auto info = call({{"op", "info"}});
    if (!info.is_ok()) {
      last = info.status().with_context(fmt::format("donor {}", donor.peer_id));
      clients.forget(donor.address);
      continue;
    }
    auto meta = control_json(info->message);
    auto donor_info = meta.is_ok() ? parse_state_info(*meta, config.max_state_bytes) : Result<StateInfo>(meta.status());
    if (!donor_info.is_ok()) {
      last = data_loss("donor {} answered a bad state info: {}", donor.peer_id, donor_info.status().message());
      continue;
    }
    const int64_t donor_total = donor_info->bytes;
    if (donor_info->hash != hash || donor_total != total) {
      // Another snapshot: what we have is of no use with it.
      if (!bytes.empty() && report != nullptr) report->resumed_at = -1;
      bytes.clear();
      hash = donor_info->hash;
      total = donor_total;
    } else if (!bytes.empty() && report != nullptr) {
      report->resumed_at = static_cast<int64_t>(bytes.size());
    }
    if (report != nullptr) report->donors_used.push_back(donor.peer_id);
    bool failed = false;
    while (static_cast<int64_t>(bytes.size()) < total) {
      const int64_t offset = static_cast<int64_t>(bytes.size());
      const int64_t length = std::min<int64_t>(config.chunk_bytes, total - offset);
      auto chunk = call({{"op", "chunk"}, {"hash", hex64(hash)}, {"offset", offset}, {"length", length}});
      if (!chunk.is_ok() || chunk->message.tensors.size() != 2 ||
          static_cast<int64_t>(chunk->message.tensors[1].payload.size()) != length) {
        last = chunk.is_ok() ? data_loss("donor {} sent a malformed chunk", donor.peer_id)
                             : chunk.status().with_context(fmt::format("donor {}", donor.peer_id));
        clients.forget(donor.address);
        failed = true;
        break;
      }
      bytes.append(chunk->message.tensors[1].payload);
    }
    if (failed) continue;
    if (XXH3_64bits(bytes.data(), bytes.size()) != hash) {
      last = data_loss("state from {} does not match its hash", donor.peer_id);
      bytes.clear();
      total = -1;
      continue;
    }
    if (report != nullptr) report->bytes = static_cast<int64_t>(bytes.size());
    return decode_checkpoint(bytes, fmt::format("state of stage {} from {}", stage, donor.peer_id));
  }
  return last;
}

}  // namespace swarm
