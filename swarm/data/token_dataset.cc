#include "swarm/data/token_dataset.h"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <string_view>
#include <system_error>

namespace swarm {
namespace {

namespace fs = std::filesystem;

struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};
using FileHandle = std::unique_ptr<std::FILE, FileCloser>;

Status error_from_errno(const std::string& path, int error_number) {
  switch (error_number) {
    case ENOENT:
    case ENOTDIR: return not_found("{}: no such file or directory", path);
    case EACCES:
    case EPERM: return permission_denied("{}: permission denied", path);
    default: return unavailable("{}: cannot open: {}", path, std::strerror(error_number));
  }
}

Result<FileHandle> open_for_reading(const std::string& path) {
  FileHandle file(std::fopen(path.c_str(), "rb"));
  if (file == nullptr) return error_from_errno(path, errno);
  return file;
}

Result<int64_t> size_of_open_file(std::FILE* file, const std::string& path) {
  struct stat info {};
  if (fstat(fileno(file), &info) != 0) return error_from_errno(path, errno);
  if (S_ISDIR(info.st_mode)) return invalid_argument("{} is a directory, not a file", path);
  return static_cast<int64_t>(info.st_size);
}

Status read_exactly(std::FILE* file, void* destination, size_t bytes, const std::string& path) {
  size_t got = std::fread(destination, 1, bytes, file);
  if (got != bytes) {
    // The size was checked before reading, so a short read means the file
    // changed underneath us or the disk failed.
    return data_loss("{}: read {} of {} bytes", path, got, bytes);
  }
  return Status::ok();
}

// Appends a file's bytes as tokens. Reads until end of file rather than
// trusting the reported size, which is wrong for pipes and /proc files.
Status append_file_bytes(const std::string& path, std::vector<int32_t>* tokens) {
  SWARM_ASSIGN_OR_RETURN(FileHandle file, open_for_reading(path));
  SWARM_ASSIGN_OR_RETURN(int64_t expected_size, size_of_open_file(file.get(), path));
  tokens->reserve(tokens->size() + static_cast<size_t>(expected_size));
  std::array<unsigned char, 1 << 16> chunk;
  while (true) {
    size_t got = std::fread(chunk.data(), 1, chunk.size(), file.get());
    tokens->insert(tokens->end(), chunk.begin(), chunk.begin() + got);
    if (got < chunk.size()) break;
  }
  if (std::ferror(file.get())) return data_loss("{}: read error after {} bytes", path, tokens->size());
  return Status::ok();
}

bool is_fortune_index_file(std::string_view name) {
  return name.ends_with(".dat") || name.ends_with(".u8");
}

Result<TokenDataset> load_text_directory(const std::string& path) {
  std::error_code error;
  std::vector<fs::path> entries;
  for (fs::directory_iterator it(path, error), end; !error && it != end; it.increment(error)) {
    entries.push_back(it->path());
  }
  if (error) return error_from_errno(path, error.value());
  std::sort(entries.begin(), entries.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename() < b.filename(); });

  TokenDataset dataset{.tokens = {}, .vocab_size = kByteVocabSize, .source = path};
  std::set<fs::path> files_read;  // canonical paths, so a symlink does not repeat a text
  for (const fs::path& entry : entries) {
    if (is_fortune_index_file(entry.filename().string())) continue;
    // status() follows symlinks: a link to a directory or a dangling link is skipped here.
    if (!fs::is_regular_file(fs::status(entry, error)) || error) continue;
    fs::path canonical = fs::canonical(entry, error);
    if (error || !files_read.insert(canonical).second) continue;
    SWARM_RETURN_IF_ERROR(append_file_bytes(entry.string(), &dataset.tokens));
  }
  if (dataset.tokens.empty()) {
    return invalid_argument("{}: the directory holds no text ({} files read, all empty)", path,
                            files_read.size());
  }
  return dataset;
}

uint32_t little_endian_u32(const unsigned char* bytes) {
  return static_cast<uint32_t>(bytes[0]) | static_cast<uint32_t>(bytes[1]) << 8 |
         static_cast<uint32_t>(bytes[2]) << 16 | static_cast<uint32_t>(bytes[3]) << 24;
}

}  // namespace

Result<TokenDataset> load_text_bytes(const std::string& path) {
  std::error_code error;
  fs::file_status status = fs::status(path, error);
  if (status.type() == fs::file_type::not_found) return not_found("{}: no such file or directory", path);
  if (error) return error_from_errno(path, error.value());
  if (fs::is_directory(status)) return load_text_directory(path);

  TokenDataset dataset{.tokens = {}, .vocab_size = kByteVocabSize, .source = path};
  SWARM_RETURN_IF_ERROR(append_file_bytes(path, &dataset.tokens));
  if (dataset.tokens.empty()) return invalid_argument("{}: the file is empty", path);
  return dataset;
}

Result<TokenDataset> load_gpt2_bin(const std::string& path) {
  SWARM_ASSIGN_OR_RETURN(FileHandle file, open_for_reading(path));
  SWARM_ASSIGN_OR_RETURN(int64_t file_bytes, size_of_open_file(file.get(), path));
  if (file_bytes == 0) return invalid_argument("{}: the file is empty", path);

  constexpr int64_t kHeaderBytes = kGpt2BinHeaderInts * 4;
  if (file_bytes < kHeaderBytes) {
    return data_loss("{}: {} bytes is shorter than the {}-byte header", path, file_bytes,
                     kHeaderBytes);
  }
  std::array<unsigned char, kHeaderBytes> header;
  SWARM_RETURN_IF_ERROR(read_exactly(file.get(), header.data(), header.size(), path));
  const auto magic = static_cast<int32_t>(little_endian_u32(&header[0]));
  const auto version = static_cast<int32_t>(little_endian_u32(&header[4]));
  const auto token_count = static_cast<int32_t>(little_endian_u32(&header[8]));
  if (magic != kGpt2BinMagic) {
    return invalid_argument("{}: not an llm.c token file: expected magic {}, found {}", path,
                            kGpt2BinMagic, magic);
  }
  if (version != kGpt2BinVersion) {
    return unimplemented("{}: version {} is not supported (only version {}, uint16 GPT-2 tokens)",
                         path, version, kGpt2BinVersion);
  }
  if (token_count < 0) return invalid_argument("{}: negative token count {}", path, token_count);

  const int64_t promised_bytes = int64_t{token_count} * 2;
  const int64_t present_bytes = file_bytes - kHeaderBytes;
  if (present_bytes < promised_bytes) {
    return data_loss("{}: truncated: the header promises {} tokens ({} bytes) but {} bytes follow it",
                     path, token_count, promised_bytes, present_bytes);
  }
  if (present_bytes > promised_bytes) {
    return invalid_argument("{}: {} bytes follow the header's {} tokens ({} bytes)", path,
                            present_bytes, token_count, promised_bytes);
  }

  TokenDataset dataset{.tokens = {}, .vocab_size = kGpt2VocabSize, .source = path};
  dataset.tokens.resize(static_cast<size_t>(token_count));
  // Chunked so the raw bytes never need a second full-size buffer.
  std::vector<unsigned char> chunk(size_t{1} << 20);
  int64_t position = 0;
  while (position < token_count) {
    const int64_t chunk_tokens = std::min<int64_t>(token_count - position, chunk.size() / 2);
    SWARM_RETURN_IF_ERROR(
        read_exactly(file.get(), chunk.data(), static_cast<size_t>(chunk_tokens * 2), path));
    for (int64_t i = 0; i < chunk_tokens; ++i) {
      const int32_t id = chunk[2 * i] | chunk[2 * i + 1] << 8;
      if (id >= kGpt2VocabSize) {
        return invalid_argument("{}: token {} at position {} is outside the GPT-2 vocabulary of {}",
                                path, id, position + i, kGpt2VocabSize);
      }
      dataset.tokens[static_cast<size_t>(position + i)] = id;
    }
    position += chunk_tokens;
  }
  return dataset;
}

}  // namespace swarm
