#include "swarm/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <system_error>

#include <cereal/archives/binary.hpp>
#include <xxhash.h>

#include "swarm/core/check.h"
#include "swarm/core/log.h"

namespace swarm {
namespace {

namespace fs = std::filesystem;

// Cereal's binary archive writes native byte order; the format is defined as
// little-endian, which every machine this project targets is.
static_assert(std::endian::native == std::endian::little, "checkpoints assume a little-endian host");

constexpr int64_t kPrefixBytes = sizeof(kCheckpointMagic) + sizeof(uint32_t) + sizeof(uint64_t);

struct Xxh3StateDeleter {
  void operator()(XXH3_state_t* state) const { XXH3_freeState(state); }
};

class Xxh3Hasher {
 public:
  Xxh3Hasher() : state_(XXH3_createState()) {
    SWARM_CHECK(state_ != nullptr, "cannot allocate an XXH3 state");
    XXH3_64bits_reset(state_.get());
  }
  void add_bytes(const void* data, size_t size) { XXH3_64bits_update(state_.get(), data, size); }
  template <typename T>
  void add_value(T value) { add_bytes(&value, sizeof(value)); }
  uint64_t digest() const { return XXH3_64bits_digest(state_.get()); }

 private:
  std::unique_ptr<XXH3_state_t, Xxh3StateDeleter> state_;
};

Status error_from_errno(const std::string& path, std::string_view action, int error_number) {
  switch (error_number) {
    case ENOENT:
    case ENOTDIR: return not_found("{}: {}: no such file or directory", path, action);
    case EACCES:
    case EPERM: return permission_denied("{}: {}: permission denied", path, action);
    case ENOSPC:
    case EDQUOT: return resource_exhausted("{}: {}: no space left", path, action);
    default: return unavailable("{}: {}: {}", path, action, std::strerror(error_number));
  }
}

// ---------------------------------------------------------------- writing

void write_string(cereal::BinaryOutputArchive& archive, const std::string& text) {
  archive(static_cast<uint64_t>(text.size()));
  archive(cereal::binary_data(text.data(), text.size()));
}

std::string encode_header(const Checkpoint& checkpoint, uint64_t tensors_hash) {
  std::ostringstream stream;
  {
    cereal::BinaryOutputArchive archive(stream);
    archive(checkpoint.step);
    archive(static_cast<uint64_t>(checkpoint.metadata.size()));
    for (const auto& [key, value] : checkpoint.metadata) {
      write_string(archive, key);
      write_string(archive, value);
    }
    archive(static_cast<uint64_t>(checkpoint.tensors.size()));
    for (const NamedTensor& named : checkpoint.tensors) {
      write_string(archive, named.name);
      archive(static_cast<uint8_t>(named.tensor.dtype()));
      archive(static_cast<uint32_t>(named.tensor.shape().rank()));
      for (int64_t dim : named.tensor.shape().dims()) archive(dim);
    }
    archive(tensors_hash);
  }
  return std::move(stream).str();
}

Status check_saveable(const Checkpoint& checkpoint) {
  std::set<std::string_view> names;
  for (const NamedTensor& named : checkpoint.tensors) {
    if (!named.tensor.defined()) return invalid_argument("tensor '{}' is undefined", named.name);
    if (named.tensor.device() != Device::cpu) {
      return invalid_argument("tensor '{}' is on {}; copy it to the CPU before saving", named.name,
                              device_name(named.tensor.device()));
    }
    if (!names.insert(named.name).second) {
      return invalid_argument("two tensors are named '{}'", named.name);
    }
  }
  return Status::ok();
}

// Flushes the file's data to the disk, so that the rename below cannot
// become durable before the contents it names.
Status sync_to_disk(const std::string& path, int open_flags) {
  int descriptor = ::open(path.c_str(), open_flags);
  if (descriptor < 0) return error_from_errno(path, "opening to sync", errno);
  int result = ::fsync(descriptor);
  int sync_errno = errno;
  ::close(descriptor);
  if (result != 0) return error_from_errno(path, "syncing", sync_errno);
  return Status::ok();
}

// The whole file format, to any stream: a file on disk, or the bytes a joining peer downloads.
void write_checkpoint(std::ostream& out, const Checkpoint& checkpoint) {
  const std::string header = encode_header(checkpoint, content_hash(checkpoint.tensors));
  const uint64_t header_checksum = XXH3_64bits(header.data(), header.size());
  cereal::BinaryOutputArchive archive(out);
  archive(cereal::binary_data(kCheckpointMagic, sizeof(kCheckpointMagic)));
  archive(kCheckpointVersion);
  archive(static_cast<uint64_t>(header.size()));
  archive(cereal::binary_data(header.data(), header.size()));
  archive(header_checksum);
  for (const NamedTensor& named : checkpoint.tensors) {
    archive(cereal::binary_data(named.tensor.raw_data(), named.tensor.size_bytes()));
  }
}

Status write_file(const std::string& path, const Checkpoint& checkpoint) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return error_from_errno(path, "creating", errno);
  write_checkpoint(out, checkpoint);
  out.flush();
  // Cereal notices short writes only at the stream buffer; the final flush
  // is where a full disk shows up.
  if (!out) return error_from_errno(path, "writing", errno);
  out.close();
  if (out.fail()) return error_from_errno(path, "closing", errno);
  return sync_to_disk(path, O_RDONLY);
}

// ---------------------------------------------------------------- reading

// Reads through a Cereal archive, but checks each read against the bytes
// left first: Cereal would allocate a corrupted length before noticing that
// the data is not there, and throws on short reads.
class BoundedReader {
 public:
  BoundedReader(std::istream& stream, int64_t available, std::string what)
      : archive_(stream), available_(available), what_(std::move(what)) {}

  int64_t available() const { return available_; }

  Status read_bytes(void* destination, int64_t size, std::string_view field) {
    if (size < 0 || size > available_) {
      return data_loss("{}: truncated: {} needs {} bytes, {} remain", what_, field, size, available_);
    }
    archive_(cereal::binary_data(destination, static_cast<size_t>(size)));
    available_ -= size;
    return Status::ok();
  }

  template <typename T>
  Status read(T* value, std::string_view field) {
    return read_bytes(value, sizeof(T), field);
  }

  Status read_string(std::string* text, std::string_view field) {
    uint64_t length = 0;
    SWARM_RETURN_IF_ERROR(read(&length, field));
    if (length > static_cast<uint64_t>(available_)) {
      return data_loss("{}: {} claims {} bytes, {} remain", what_, field, length, available_);
    }
    text->resize(length);
    return read_bytes(text->data(), static_cast<int64_t>(length), field);
  }

 private:
  cereal::BinaryInputArchive archive_;
  int64_t available_;
  std::string what_;
};

struct TensorEntry {
  std::string name;
  DType dtype;
  Shape shape;
};

struct ParsedHeader {
  int64_t step = 0;
  std::map<std::string, std::string> metadata;
  std::vector<TensorEntry> entries;
  int64_t total_tensor_bytes = 0;
  uint64_t tensors_hash = 0;
};

Result<ParsedHeader> parse_header(const std::string& header, const std::string& path) {
  std::istringstream stream(header);
  BoundedReader reader(stream, static_cast<int64_t>(header.size()), path + " header");
  ParsedHeader parsed;
  SWARM_RETURN_IF_ERROR(reader.read(&parsed.step, "the step"));

  uint64_t metadata_count = 0;
  SWARM_RETURN_IF_ERROR(reader.read(&metadata_count, "the metadata count"));
  for (uint64_t i = 0; i < metadata_count; ++i) {  // each entry consumes bytes, so this ends
    std::string key, value;
    SWARM_RETURN_IF_ERROR(reader.read_string(&key, "a metadata key"));
    SWARM_RETURN_IF_ERROR(reader.read_string(&value, "a metadata value"));
    if (!parsed.metadata.emplace(std::move(key), std::move(value)).second) {
      return data_loss("{}: a metadata key appears twice", path);
    }
  }

  uint64_t tensor_count = 0;
  SWARM_RETURN_IF_ERROR(reader.read(&tensor_count, "the tensor count"));
  std::set<std::string> names;
  for (uint64_t i = 0; i < tensor_count; ++i) {
    TensorEntry entry;
    SWARM_RETURN_IF_ERROR(reader.read_string(&entry.name, "a tensor name"));
    uint8_t dtype_code = 0;
    uint32_t rank = 0;
    SWARM_RETURN_IF_ERROR(reader.read(&dtype_code, "a dtype"));
    SWARM_RETURN_IF_ERROR(reader.read(&rank, "a rank"));
    std::optional<DType> dtype = dtype_from_code(dtype_code);
    if (!dtype) return data_loss("{}: tensor '{}' has unknown dtype code {}", path, entry.name, dtype_code);
    entry.dtype = *dtype;
    if (rank > static_cast<uint32_t>(Shape::kMaxRank)) {
      return data_loss("{}: tensor '{}' has rank {}, above the maximum of {}", path, entry.name, rank,
                       Shape::kMaxRank);
    }
    int64_t dims[Shape::kMaxRank] = {};
    for (uint32_t axis = 0; axis < rank; ++axis) {
      SWARM_RETURN_IF_ERROR(reader.read(&dims[axis], "a dimension"));
    }
    Result<Shape> shape = Shape::from_dims(std::span<const int64_t>(dims, rank));
    if (!shape) {
      return data_loss("{}: tensor '{}': {}", path, entry.name, shape.status().message());
    }
    entry.shape = *shape;
    Result<int64_t> bytes = checked_size_bytes(entry.shape, static_cast<int64_t>(size_of(entry.dtype)));
    if (!bytes || __builtin_add_overflow(parsed.total_tensor_bytes, *bytes, &parsed.total_tensor_bytes)) {
      return data_loss("{}: tensor '{}' of shape {} is impossibly large", path, entry.name,
                       entry.shape.to_string());
    }
    if (!names.insert(entry.name).second) {
      return data_loss("{}: two tensors are named '{}'", path, entry.name);
    }
    parsed.entries.push_back(std::move(entry));
  }
  SWARM_RETURN_IF_ERROR(reader.read(&parsed.tensors_hash, "the content hash"));
  if (reader.available() != 0) {
    return data_loss("{}: {} unexpected bytes at the end of the header", path, reader.available());
  }
  return parsed;
}

// `path` only names the source in errors.
Result<Checkpoint> read_checkpoint(std::istream& in, int64_t file_bytes, const std::string& path) {
  BoundedReader reader(in, file_bytes, path);

  char magic[sizeof(kCheckpointMagic)] = {};
  SWARM_RETURN_IF_ERROR(reader.read_bytes(magic, sizeof(magic), "the magic"));
  if (std::memcmp(magic, kCheckpointMagic, sizeof(magic)) != 0) {
    return invalid_argument("{} is not a swarm checkpoint: it does not start with \"SWARMCKP\"", path);
  }
  uint32_t version = 0;
  SWARM_RETURN_IF_ERROR(reader.read(&version, "the version"));
  if (version != kCheckpointVersion) {
    return unimplemented("{}: checkpoint format version {} is not supported (this build reads {})",
                         path, version, kCheckpointVersion);
  }

  uint64_t header_length = 0;
  SWARM_RETURN_IF_ERROR(reader.read(&header_length, "the header length"));
  if (header_length > static_cast<uint64_t>(reader.available())) {
    return data_loss("{}: truncated: the header claims {} bytes, {} remain", path, header_length,
                     reader.available());
  }
  std::string header(header_length, '\0');
  SWARM_RETURN_IF_ERROR(reader.read_bytes(header.data(), static_cast<int64_t>(header_length), "the header"));
  uint64_t stored_checksum = 0;
  SWARM_RETURN_IF_ERROR(reader.read(&stored_checksum, "the header checksum"));
  const uint64_t header_checksum = XXH3_64bits(header.data(), header.size());
  if (header_checksum != stored_checksum) {
    return data_loss("{}: the header is corrupted (checksum {:016x}, expected {:016x})", path,
                     header_checksum, stored_checksum);
  }

  SWARM_ASSIGN_OR_RETURN(ParsedHeader parsed, parse_header(header, path));
  // All sizes are known and bounded by the file before anything is allocated.
  if (parsed.total_tensor_bytes != reader.available()) {
    if (parsed.total_tensor_bytes > reader.available()) {
      return data_loss("{}: truncated: the tensors need {} bytes, {} remain", path,
                       parsed.total_tensor_bytes, reader.available());
    }
    return data_loss("{}: {} unexpected bytes after the tensors", path,
                     reader.available() - parsed.total_tensor_bytes);
  }

  Checkpoint checkpoint{.step = parsed.step, .metadata = std::move(parsed.metadata), .tensors = {}};
  checkpoint.tensors.reserve(parsed.entries.size());
  for (TensorEntry& entry : parsed.entries) {
    SWARM_ASSIGN_OR_RETURN(Tensor tensor, Tensor::empty(entry.shape, entry.dtype));
    SWARM_RETURN_IF_ERROR(reader.read_bytes(tensor.raw_data(),
                                            static_cast<int64_t>(tensor.size_bytes()), entry.name));
    checkpoint.tensors.push_back({std::move(entry.name), std::move(tensor)});
  }
  const uint64_t tensors_hash = content_hash(checkpoint.tensors);
  if (tensors_hash != parsed.tensors_hash) {
    return data_loss("{}: tensor contents are corrupted (content hash {:016x}, expected {:016x})",
                     path, tensors_hash, parsed.tensors_hash);
  }
  return checkpoint;
}

Result<Checkpoint> read_file(const std::string& path, int64_t file_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return error_from_errno(path, "opening", errno);
  return read_checkpoint(in, file_bytes, path);
}

}  // namespace

Result<std::string> encode_checkpoint(const Checkpoint& checkpoint) {
  SWARM_RETURN_IF_ERROR(check_saveable(checkpoint));
  std::ostringstream out(std::ios::binary);
  write_checkpoint(out, checkpoint);
  return std::move(out).str();
}

Result<Checkpoint> decode_checkpoint(std::string_view bytes, const std::string& what) {
  std::istringstream in(std::string(bytes), std::ios::binary);
  try {
    return read_checkpoint(in, static_cast<int64_t>(bytes.size()), what);
  } catch (const std::exception& exception) {
    return data_loss("{}: {}", what, exception.what());
  }
}

uint64_t content_hash(std::span<const NamedTensorView> tensors) {
  Xxh3Hasher hasher;
  hasher.add_value(static_cast<uint64_t>(tensors.size()));
  for (const NamedTensorView& named : tensors) {
    const TensorView& tensor = named.view;
    SWARM_CHECK(tensor.raw_data() != nullptr || tensor.size_bytes() == 0,
                "content_hash of tensor '{}' without data", named.name);
    SWARM_CHECK(tensor.device() == Device::cpu, "content_hash of tensor '{}' that is not on the CPU", named.name);
    // Lengths and ranks go in too, so that ("ab", "c") and ("a", "bc") differ.
    hasher.add_value(static_cast<uint64_t>(named.name.size()));
    hasher.add_bytes(named.name.data(), named.name.size());
    hasher.add_value(static_cast<uint8_t>(tensor.dtype()));
    hasher.add_value(static_cast<uint32_t>(tensor.shape().rank()));
    for (int64_t dim : tensor.shape().dims()) hasher.add_value(dim);
    hasher.add_bytes(tensor.raw_data(), tensor.size_bytes());
  }
  return hasher.digest();
}

uint64_t content_hash(std::span<const NamedTensor> tensors) {
  std::vector<NamedTensorView> views;
  views.reserve(tensors.size());
  for (const NamedTensor& named : tensors) {
    SWARM_CHECK(named.tensor.defined(), "content_hash of tensor '{}' that is undefined", named.name);
    views.push_back({named.name, named.tensor.view()});
  }
  return content_hash(views);
}

Status save_checkpoint(const std::string& path, const Checkpoint& checkpoint) {
  SWARM_RETURN_IF_ERROR(check_saveable(checkpoint));
  const std::string temporary = path + ".tmp";
  Status written;
  errno = 0;
  try {
    written = write_file(temporary, checkpoint);
  } catch (const std::exception& error) {  // Cereal reports short writes by throwing
    const bool disk_full = errno == ENOSPC || errno == EDQUOT;
    written = disk_full ? resource_exhausted("{}: writing: no space left ({})", temporary, error.what())
                        : unavailable("{}: writing: {}", temporary, error.what());
  }
  std::error_code ignored;
  if (!written.is_ok()) {
    fs::remove(temporary, ignored);
    return written;
  }
  std::error_code error;
  fs::rename(temporary, path, error);
  if (error) {
    fs::remove(temporary, ignored);
    return error_from_errno(path, "renaming the finished .tmp file", error.value());
  }
  // Makes the rename itself durable. Best effort: some file systems cannot
  // sync a directory, and the checkpoint is complete under its name already.
  fs::path folder = fs::path(path).parent_path();
  Status synced = sync_to_disk(folder.empty() ? "." : folder.string(), O_RDONLY | O_DIRECTORY);
  if (!synced.is_ok()) log_warn("checkpoint {} saved, but {}", path, synced.message());
  return Status::ok();
}

Result<Checkpoint> load_checkpoint(const std::string& path) {
  std::error_code error;
  fs::file_status status = fs::status(path, error);
  if (status.type() == fs::file_type::not_found) return not_found("{}: no such checkpoint", path);
  if (error) return error_from_errno(path, "opening", error.value());
  if (!fs::is_regular_file(status)) return invalid_argument("{} is not a regular file", path);
  const auto file_bytes = fs::file_size(path, error);
  if (error) return error_from_errno(path, "reading its size", error.value());
  try {
    return read_file(path, static_cast<int64_t>(file_bytes));
  } catch (const std::exception& exception) {
    // Only if the file changed under us: every size was checked before reading.
    return data_loss("{}: {}", path, exception.what());
  }
}

}  // namespace swarm
