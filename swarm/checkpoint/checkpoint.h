// checkpoint: saves and loads a model's and optimizer's tensors, checked by content hashes.
//
// A run resumes from a checkpoint, and peers compare content hashes to agree
// that they hold the same stage state, so a load either returns exactly what
// was saved or an error: never a silently different model.
//
//   swarm::Checkpoint checkpoint{.step = 1000, .metadata = {{"seed", "42"}}, .tensors = params};
//   SWARM_RETURN_IF_ERROR(swarm::save_checkpoint("run/step-1000.ckpt", checkpoint));
//   SWARM_ASSIGN_OR_RETURN(swarm::Checkpoint resumed, swarm::load_checkpoint("run/step-1000.ckpt"));
//
// File layout (version 1, integers little-endian, everything written through a
// Cereal binary archive):
//   8 bytes  "SWARMCKP"
//   u32      format version
//   u64      header length H
//   H bytes  header: i64 step; u64 metadata count, then per entry key and value
//            (u64 length + bytes); u64 tensor count, then per tensor name
//            (u64 length + bytes), u8 dtype code, u32 rank, rank x i64 dims;
//            u64 content_hash of the tensors
//   u64      XXH3-64 of the H header bytes (covers step and metadata too)
//   each tensor's raw row-major bytes, in order, as one blob
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "swarm/core/status.h"
#include "swarm/core/tensor.h"

namespace swarm {

inline constexpr char kCheckpointMagic[8] = {'S', 'W', 'A', 'R', 'M', 'C', 'K', 'P'};
inline constexpr uint32_t kCheckpointVersion = 1;

struct NamedTensor {
  std::string name;
  Tensor tensor;  // a defined CPU tensor, any dtype
};

// A tensor someone else owns, such as a stage's parameter, hashed in place.
struct NamedTensorView {
  std::string name;
  TensorView view;  // on the CPU
};

struct Checkpoint {
  int64_t step = 0;
  std::map<std::string, std::string> metadata;  // e.g. "model_config" as JSON text, "seed"
  std::vector<NamedTensor> tensors;             // names are unique
};

// XXH3-64 over each tensor's name, dtype, shape and bytes, in order. Equal
// content gives an equal hash on every machine; any changed bit changes it.
// Tensors must be defined and on the CPU (a failed SWARM_CHECK otherwise).
uint64_t content_hash(std::span<const NamedTensor> tensors);
// The same hash without copying: equal to the owning overload's for equal content.
uint64_t content_hash(std::span<const NamedTensorView> tensors);

// Writes `path + ".tmp"`, syncs it to disk and renames it over `path`, so a
// crash leaves either the old checkpoint or the new one, never half of one.
// Errors: invalid_argument (undefined or non-CPU tensor, repeated name),
// not_found / permission_denied (the folder), resource_exhausted (disk full),
// unavailable (other I/O failures).
Status save_checkpoint(const std::string& path, const Checkpoint& checkpoint);

// Validates every size against the file's length before allocating, and
// checks the header checksum and the content hash. Errors: not_found,
// invalid_argument (not a checkpoint), unimplemented (another format version),
// data_loss (truncated, corrupted or hash mismatch).
Result<Checkpoint> load_checkpoint(const std::string& path);

// The same format in memory, for state that travels between peers: the bytes
// a file would hold, and their checked decoding (errors as load_checkpoint;
// `what` names the source in them).
Result<std::string> encode_checkpoint(const Checkpoint& checkpoint);
Result<Checkpoint> decode_checkpoint(std::string_view bytes, const std::string& what);

}  // namespace swarm
