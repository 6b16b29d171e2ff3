#include "swarm/data/token_dataset.h"

#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <fmt/core.h>

namespace swarm {
namespace {

namespace fs = std::filesystem;

// A fresh directory under Bazel's per-test scratch space.
fs::path fresh_directory(const std::string& name) {
  const char* root = std::getenv("TEST_TMPDIR");
  fs::path directory = fs::path(root != nullptr ? root : fs::temp_directory_path().string()) / name;
  fs::remove_all(directory);
  fs::create_directories(directory);
  return directory;
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

std::vector<int32_t> byte_tokens(const std::string& text) {
  return std::vector<int32_t>(reinterpret_cast<const unsigned char*>(text.data()),
                              reinterpret_cast<const unsigned char*>(text.data()) + text.size());
}

void append_le32(std::string* bytes, int32_t value) {
  auto bits = static_cast<uint32_t>(value);
  for (int shift = 0; shift < 32; shift += 8) bytes->push_back(static_cast<char>(bits >> shift));
}

// llm.c's layout with every header field settable, so tests can break one at a time.
std::string gpt2_bin(const std::vector<uint16_t>& tokens, int32_t magic = kGpt2BinMagic,
                     int32_t version = kGpt2BinVersion, int64_t declared_count = -1) {
  std::string bytes;
  append_le32(&bytes, magic);
  append_le32(&bytes, version);
  append_le32(&bytes, static_cast<int32_t>(declared_count >= 0 ? declared_count : tokens.size()));
  while (bytes.size() < kGpt2BinHeaderInts * 4) append_le32(&bytes, 0);
  for (uint16_t token : tokens) {
    bytes.push_back(static_cast<char>(token & 0xff));
    bytes.push_back(static_cast<char>(token >> 8));
  }
  return bytes;
}

bool mentions(const Status& status, const fs::path& path) {
  return status.message().find(path.string()) != std::string::npos;
}

TEST_CASE("load_text_bytes reads a file's bytes as tokens 0..255") {
  fs::path file = fresh_directory("text_file") / "notes.txt";
  const std::string text = "Hello, swarm!\n\xff\x80";  // high bytes must not turn negative
  write_file(file, text);

  auto dataset = load_text_bytes(file.string());
  REQUIRE(dataset.is_ok());
  CHECK(dataset->vocab_size == 256);
  CHECK(dataset->source == file.string());
  CHECK(dataset->tokens == byte_tokens(text));
  CHECK(dataset->tokens.back() == 0x80);
  CHECK(dataset->tokens[dataset->tokens.size() - 2] == 255);
}

TEST_CASE("load_text_bytes reads a fortunes-style directory in name order, skipping the extras") {
  fs::path directory = fresh_directory("fortunes_like");
  write_file(directory / "zen", "The way.\n%\n");
  write_file(directory / "art", "Art is long.\n%\n");
  write_file(directory / "art.dat", std::string("\x00\x00\x00\x02strfile", 11));
  fs::create_symlink("art", directory / "art.u8");
  write_file(directory / "zen.dat", "index");
  fs::create_symlink("zen", directory / "zen.u8");
  fs::create_symlink("art", directory / "mirror-of-art");  // a second name for a text already read
  fs::create_directory(directory / "off");
  write_file(directory / "off" / "rude", "must not be read\n");
  fs::create_symlink("off", directory / "link-to-off");
  write_file(directory / "empty", "");

  auto dataset = load_text_bytes(directory.string());
  REQUIRE(dataset.is_ok());
  CHECK(dataset->vocab_size == 256);
  CHECK(dataset->tokens == byte_tokens("Art is long.\n%\nThe way.\n%\n"));
}

TEST_CASE("load_text_bytes errors name the path and carry the right code") {
  fs::path directory = fresh_directory("text_errors");

  fs::path missing = directory / "no-such-file";
  auto not_there = load_text_bytes(missing.string());
  CHECK(not_there.status().code() == StatusCode::not_found);
  CHECK(mentions(not_there.status(), missing));

  fs::path empty = directory / "empty.txt";
  write_file(empty, "");
  auto empty_file = load_text_bytes(empty.string());
  CHECK(empty_file.status().code() == StatusCode::invalid_argument);
  CHECK(mentions(empty_file.status(), empty));

  fs::path only_indexes = directory / "only-indexes";
  fs::create_directory(only_indexes);
  write_file(only_indexes / "art.dat", "index bytes");
  write_file(only_indexes / "art.u8", "skipped by name");
  auto no_text = load_text_bytes(only_indexes.string());
  CHECK(no_text.status().code() == StatusCode::invalid_argument);
  CHECK(mentions(no_text.status(), only_indexes));

  fs::path nothing = directory / "nothing";
  fs::create_directory(nothing);
  CHECK(load_text_bytes(nothing.string()).status().code() == StatusCode::invalid_argument);
}

TEST_CASE("load_gpt2_bin round-trips a shard written in llm.c's layout") {
  fs::path file = fresh_directory("gpt2_valid") / "shard.bin";
  const std::vector<uint16_t> tokens = {50256, 0, 1, 258, 0x1234, 50000, 42};
  write_file(file, gpt2_bin(tokens));

  auto dataset = load_gpt2_bin(file.string());
  REQUIRE(dataset.is_ok());
  CHECK(dataset->vocab_size == 50257);
  CHECK(dataset->source == file.string());
  CHECK(dataset->tokens == std::vector<int32_t>(tokens.begin(), tokens.end()));
}

TEST_CASE("load_gpt2_bin reads a shard larger than its read chunk") {
  fs::path file = fresh_directory("gpt2_large") / "shard.bin";
  std::vector<uint16_t> tokens(1'500'000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 7919) % 50257);
  write_file(file, gpt2_bin(tokens));

  auto dataset = load_gpt2_bin(file.string());
  REQUIRE(dataset.is_ok());
  REQUIRE(dataset->tokens.size() == tokens.size());
  CHECK(dataset->tokens == std::vector<int32_t>(tokens.begin(), tokens.end()));
}

TEST_CASE("load_gpt2_bin reports each kind of bad file with its code and the file's name") {
  fs::path directory = fresh_directory("gpt2_errors");
  const std::vector<uint16_t> tokens = {1, 2, 3, 4};

  SUBCASE("missing file") {
    fs::path file = directory / "absent.bin";
    auto result = load_gpt2_bin(file.string());
    CHECK(result.status().code() == StatusCode::not_found);
    CHECK(mentions(result.status(), file));
  }
  SUBCASE("empty file") {
    fs::path file = directory / "empty.bin";
    write_file(file, "");
    auto result = load_gpt2_bin(file.string());
    CHECK(result.status().code() == StatusCode::invalid_argument);
    CHECK(mentions(result.status(), file));
  }
  SUBCASE("wrong magic names the expected and the found magic") {
    fs::path file = directory / "magic.bin";
    write_file(file, gpt2_bin(tokens, 20240801));
    auto result = load_gpt2_bin(file.string());
    CHECK(result.status().code() == StatusCode::invalid_argument);
    CHECK(mentions(result.status(), file));
    CHECK(result.status().message().find("20240520") != std::string::npos);
    CHECK(result.status().message().find("20240801") != std::string::npos);
  }
  SUBCASE("unsupported version") {
    fs::path file = directory / "version.bin";
    write_file(file, gpt2_bin(tokens, kGpt2BinMagic, 2));
    auto result = load_gpt2_bin(file.string());
    CHECK(result.status().code() == StatusCode::unimplemented);
    CHECK(mentions(result.status(), file));
    CHECK(result.status().message().find("version 2") != std::string::npos);
  }
  SUBCASE("truncated tokens say what the header promised and what is there") {
    fs::path file = directory / "truncated.bin";
    write_file(file, gpt2_bin(tokens, kGpt2BinMagic, kGpt2BinVersion, 100));
    auto result = load_gpt2_bin(file.string());
    CHECK(result.status().code() == StatusCode::data_loss);
    CHECK(mentions(result.status(), file));
    CHECK(result.status().message().find("100 tokens") != std::string::npos);
    CHECK(result.status().message().find("8 bytes") != std::string::npos);
  }
  SUBCASE("truncated header") {
    fs::path file = directory / "short-header.bin";
    write_file(file, gpt2_bin(tokens).substr(0, 100));
    auto result = load_gpt2_bin(file.string());
    CHECK(result.status().code() == StatusCode::data_loss);
    CHECK(mentions(result.status(), file));
  }
  SUBCASE("bytes past the declared tokens") {
    fs::path file = directory / "long.bin";
    write_file(file, gpt2_bin(tokens, kGpt2BinMagic, kGpt2BinVersion, 3));
    auto result = load_gpt2_bin(file.string());
    CHECK(result.status().code() == StatusCode::invalid_argument);
    CHECK(mentions(result.status(), file));
  }
  SUBCASE("negative token count") {
    fs::path file = directory / "negative.bin";
    std::string bytes = gpt2_bin(tokens);
    bytes[11] = '\x80';  // sign bit of header[2]
    write_file(file, bytes);
    auto result = load_gpt2_bin(file.string());
    CHECK(result.status().code() == StatusCode::invalid_argument);
    CHECK(mentions(result.status(), file));
  }
  SUBCASE("a token id outside the vocabulary names its position") {
    fs::path file = directory / "vocab.bin";
    write_file(file, gpt2_bin({5, 6, 50257, 7}));
    auto result = load_gpt2_bin(file.string());
    CHECK(result.status().code() == StatusCode::invalid_argument);
    CHECK(mentions(result.status(), file));
    CHECK(result.status().message().find("50257 at position 2") != std::string::npos);
  }
}

TEST_CASE("the default corpus, when installed, holds over a megabyte of text") {
  if (!fs::exists(kDefaultCorpus)) {
    fmt::print("skipped: {} is not installed (Debian package fortunes)\n", kDefaultCorpus);
    CHECK_FALSE(load_text_bytes(kDefaultCorpus).is_ok());
    return;
  }
  auto corpus = load_text_bytes(kDefaultCorpus);
  REQUIRE(corpus.is_ok());
  CHECK(corpus->tokens.size() > 1'000'000);
  CHECK(corpus->vocab_size == 256);
  // The .dat index files are binary; text is mostly printable ASCII.
  int64_t printable = 0;
  for (int32_t token : corpus->tokens) printable += (token >= 32 && token < 127) || token == '\n';
  CHECK(printable > static_cast<int64_t>(corpus->tokens.size()) * 95 / 100);
}

}  // namespace
}  // namespace swarm
