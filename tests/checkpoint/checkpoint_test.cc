#include "swarm/checkpoint/checkpoint.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <string>

#include <cereal/archives/binary.hpp>
#include <doctest/doctest.h>
#include <xxhash.h>

namespace swarm {
namespace {

namespace fs = std::filesystem;

fs::path fresh_directory(const std::string& name) {
  const char* root = std::getenv("TEST_TMPDIR");
  fs::path directory = fs::path(root != nullptr ? root : fs::temp_directory_path().string()) / name;
  fs::remove_all(directory);
  fs::create_directories(directory);
  return directory;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

// Fills a tensor with bytes that differ from tensor to tensor and position to position.
Tensor patterned(const Shape& shape, DType dtype, uint8_t salt) {
  Tensor tensor = *Tensor::empty(shape, dtype);
  auto* bytes = static_cast<uint8_t*>(tensor.raw_data());
  for (size_t i = 0; i < tensor.size_bytes(); ++i) bytes[i] = static_cast<uint8_t>(i * 31 + salt);
  return tensor;
}

Checkpoint sample_checkpoint() {
  Checkpoint checkpoint;
  checkpoint.step = 123456789012LL;
  checkpoint.metadata = {{"model_config", R"({"layers": 2, "dim": 16})"}, {"seed", "42"}, {"", "empty key"}};
  checkpoint.tensors = {
      {"embedding.weight", patterned(Shape{5, 4}, DType::f32, 1)},
      {"layer0.norm", patterned(Shape{4}, DType::bf16, 2)},
      {"layer0.mlp.bias", patterned(Shape{3}, DType::f16, 3)},
      {"adam.step_counts", patterned(Shape{2, 1, 3}, DType::i64, 4)},
      {"token_histogram", patterned(Shape{7}, DType::i32, 5)},
      {"mask", patterned(Shape{9}, DType::u8, 6)},
      {"scalar", patterned(Shape{}, DType::f32, 7)},
      {"empty", patterned(Shape{0, 3}, DType::f32, 8)},
  };
  return checkpoint;
}

void check_same(const Checkpoint& loaded, const Checkpoint& saved) {
  CHECK(loaded.step == saved.step);
  CHECK(loaded.metadata == saved.metadata);
  REQUIRE(loaded.tensors.size() == saved.tensors.size());
  for (size_t i = 0; i < saved.tensors.size(); ++i) {
    CAPTURE(saved.tensors[i].name);
    CHECK(loaded.tensors[i].name == saved.tensors[i].name);
    CHECK(loaded.tensors[i].tensor.device() == Device::cpu);
    CHECK(bitwise_equal(loaded.tensors[i].tensor, saved.tensors[i].tensor));
  }
  CHECK(content_hash(loaded.tensors) == content_hash(saved.tensors));
}

TEST_CASE("a checkpoint round-trips step, metadata and tensors of every dtype bit for bit") {
  fs::path file = fresh_directory("round_trip") / "step.ckpt";
  Checkpoint saved = sample_checkpoint();
  // NaN payloads and negative zero must survive: bytes are copied, not values.
  float* values = saved.tensors[0].tensor.data<float>();
  values[0] = std::numeric_limits<float>::quiet_NaN();
  values[1] = -0.0f;
  std::memcpy(&values[2], "\x01\x00\xc0\x7f", 4);  // a NaN with a payload

  REQUIRE(save_checkpoint(file.string(), saved).is_ok());
  auto loaded = load_checkpoint(file.string());
  REQUIRE(loaded.is_ok());
  check_same(*loaded, saved);
}

TEST_CASE("save leaves no .tmp file behind and replaces an older checkpoint") {
  fs::path directory = fresh_directory("replace");
  fs::path file = directory / "latest.ckpt";
  Checkpoint first = sample_checkpoint();
  REQUIRE(save_checkpoint(file.string(), first).is_ok());
  CHECK(fs::exists(file));
  CHECK_FALSE(fs::exists(file.string() + ".tmp"));

  Checkpoint second = sample_checkpoint();
  second.step = 7;
  second.tensors.resize(2);
  second.tensors[1].tensor = patterned(Shape{4}, DType::bf16, 99);
  REQUIRE(save_checkpoint(file.string(), second).is_ok());
  CHECK_FALSE(fs::exists(file.string() + ".tmp"));
  CHECK(std::distance(fs::directory_iterator(directory), fs::directory_iterator()) == 1);
  auto loaded = load_checkpoint(file.string());
  REQUIRE(loaded.is_ok());
  check_same(*loaded, second);
}

TEST_CASE("a flipped bit anywhere past the magic and version is data_loss") {
  fs::path directory = fresh_directory("bit_flips");
  fs::path original = directory / "original.ckpt";
  fs::path corrupted = directory / "corrupted.ckpt";
  REQUIRE(save_checkpoint(original.string(), sample_checkpoint()).is_ok());
  const std::string bytes = read_bytes(original);
  const size_t prefix = sizeof(kCheckpointMagic) + sizeof(uint32_t);
  REQUIRE(bytes.size() > prefix);

  for (size_t position = prefix; position < bytes.size(); ++position) {
    std::string flipped = bytes;
    flipped[position] = static_cast<char>(flipped[position] ^ (1 << (position % 8)));
    write_bytes(corrupted, flipped);
    auto loaded = load_checkpoint(corrupted.string());
    CAPTURE(position);
    REQUIRE(loaded.status().code() == StatusCode::data_loss);
    REQUIRE(loaded.status().message().find(corrupted.string()) != std::string::npos);
  }
}

TEST_CASE("a file of another kind or another format version is named as such") {
  fs::path directory = fresh_directory("magic_version");
  fs::path file = directory / "model.ckpt";
  REQUIRE(save_checkpoint(file.string(), sample_checkpoint()).is_ok());
  const std::string bytes = read_bytes(file);

  std::string wrong_magic = bytes;
  wrong_magic[0] = 'X';
  write_bytes(file, wrong_magic);
  auto not_ours = load_checkpoint(file.string());
  CHECK(not_ours.status().code() == StatusCode::invalid_argument);
  CHECK(not_ours.status().message().find(file.string()) != std::string::npos);

  std::string future = bytes;
  future[sizeof(kCheckpointMagic)] = 2;  // version 2, little-endian
  write_bytes(file, future);
  auto newer = load_checkpoint(file.string());
  CHECK(newer.status().code() == StatusCode::unimplemented);
  CHECK(newer.status().message().find("version 2") != std::string::npos);
}

TEST_CASE("every truncation of a checkpoint is data_loss, not a crash") {
  fs::path directory = fresh_directory("truncated");
  fs::path original = directory / "original.ckpt";
  fs::path truncated = directory / "truncated.ckpt";
  REQUIRE(save_checkpoint(original.string(), sample_checkpoint()).is_ok());
  const std::string bytes = read_bytes(original);
  for (size_t length = 0; length < bytes.size(); ++length) {
    write_bytes(truncated, bytes.substr(0, length));
    auto loaded = load_checkpoint(truncated.string());
    CAPTURE(length);
    REQUIRE(loaded.status().code() == StatusCode::data_loss);
  }
}

TEST_CASE("a missing checkpoint is not_found and names the path") {
  fs::path missing = fresh_directory("missing") / "never-saved.ckpt";
  auto loaded = load_checkpoint(missing.string());
  CHECK(loaded.status().code() == StatusCode::not_found);
  CHECK(loaded.status().message().find(missing.string()) != std::string::npos);
}

TEST_CASE("content_hash depends on every name, dtype, shape and byte, and only on them") {
  Checkpoint base = sample_checkpoint();
  const uint64_t hash = content_hash(base.tensors);

  Checkpoint copy = sample_checkpoint();  // separate memory, same content
  CHECK(content_hash(copy.tensors) == hash);

  Checkpoint renamed = sample_checkpoint();
  renamed.tensors[2].name = "layer0.mlp.biaz";
  CHECK(content_hash(renamed.tensors) != hash);

  Checkpoint reshaped = sample_checkpoint();
  reshaped.tensors[0].tensor = *reshaped.tensors[0].tensor.reshaped(Shape{4, 5});
  CHECK(content_hash(reshaped.tensors) != hash);

  Checkpoint retyped = sample_checkpoint();  // same bytes read as i32 instead of f32
  retyped.tensors[0].tensor = patterned(Shape{5, 4}, DType::i32, 1);
  CHECK(content_hash(retyped.tensors) != hash);

  Checkpoint one_bit = sample_checkpoint();
  static_cast<uint8_t*>(one_bit.tensors[3].tensor.raw_data())[5] ^= 0x10;
  CHECK(content_hash(one_bit.tensors) != hash);

  Checkpoint reordered = sample_checkpoint();
  std::swap(reordered.tensors[0], reordered.tensors[1]);
  CHECK(content_hash(reordered.tensors) != hash);

  // Moving a character across the name boundary must not collide.
  Tensor empty_u8 = *Tensor::empty(Shape{0}, DType::u8);
  std::vector<NamedTensor> ab_c = {{"ab", empty_u8}, {"c", empty_u8}};
  std::vector<NamedTensor> a_bc = {{"a", empty_u8}, {"bc", empty_u8}};
  CHECK(content_hash(ab_c) != content_hash(a_bc));
}

TEST_CASE("save rejects what it cannot load back, and leaves nothing behind") {
  fs::path directory = fresh_directory("save_errors");
  fs::path file = directory / "bad.ckpt";

  Checkpoint undefined = sample_checkpoint();
  undefined.tensors.push_back({"never_allocated", Tensor()});
  CHECK(save_checkpoint(file.string(), undefined).code() == StatusCode::invalid_argument);

  Checkpoint repeated = sample_checkpoint();
  repeated.tensors.push_back({"mask", patterned(Shape{1}, DType::u8, 0)});
  Status repeated_status = save_checkpoint(file.string(), repeated);
  CHECK(repeated_status.code() == StatusCode::invalid_argument);
  CHECK(repeated_status.message().find("mask") != std::string::npos);

  fs::path no_folder = directory / "no-such-folder" / "x.ckpt";
  CHECK(save_checkpoint(no_folder.string(), sample_checkpoint()).code() == StatusCode::not_found);

  CHECK(fs::is_empty(directory));
}

// Builds a checkpoint file by hand, following the layout in checkpoint.h, so a
// test can write headers that save_checkpoint never would.
struct HandMadeFile {
  std::ostringstream header_stream;
  cereal::BinaryOutputArchive header{header_stream};

  void name(const std::string& text) {
    header(static_cast<uint64_t>(text.size()));
    header(cereal::binary_data(text.data(), text.size()));
  }
  void tensor(const std::string& tensor_name, uint8_t dtype_code, std::vector<int64_t> dims) {
    name(tensor_name);
    header(dtype_code, static_cast<uint32_t>(dims.size()));
    for (int64_t dim : dims) header(dim);
  }
  std::string bytes(const std::string& blobs) const {
    const std::string header_bytes = header_stream.str();
    std::ostringstream file;
    cereal::BinaryOutputArchive archive(file);
    archive(cereal::binary_data(kCheckpointMagic, sizeof(kCheckpointMagic)), kCheckpointVersion,
            static_cast<uint64_t>(header_bytes.size()));
    archive(cereal::binary_data(header_bytes.data(), header_bytes.size()));
    archive(static_cast<uint64_t>(XXH3_64bits(header_bytes.data(), header_bytes.size())));
    return file.str() + blobs;
  }
};

TEST_CASE("a hand-made file that follows the documented layout loads") {
  Tensor abc = *Tensor::empty(Shape{3}, DType::u8);
  std::memcpy(abc.raw_data(), "abc", 3);
  std::vector<NamedTensor> tensors = {{"x", abc}};

  HandMadeFile made;
  made.header(int64_t{5}, uint64_t{1});
  made.name("seed");
  made.name("9");
  made.header(uint64_t{1});
  made.tensor("x", static_cast<uint8_t>(DType::u8), {3});
  made.header(content_hash(tensors));
  fs::path file = fresh_directory("hand_made") / "made.ckpt";
  write_bytes(file, made.bytes("abc"));

  auto loaded = load_checkpoint(file.string());
  REQUIRE(loaded.is_ok());
  CHECK(loaded->step == 5);
  CHECK(loaded->metadata.at("seed") == "9");
  REQUIRE(loaded->tensors.size() == 1);
  CHECK(bitwise_equal(loaded->tensors[0].tensor, abc));
}

TEST_CASE("absurd sizes in a well-formed header are data_loss before any allocation") {
  fs::path file = fresh_directory("absurd") / "absurd.ckpt";
  const auto f32 = static_cast<uint8_t>(DType::f32);
  auto load_with = [&](auto&& fill_header) {
    HandMadeFile made;
    made.header(int64_t{0});
    fill_header(made);
    write_bytes(file, made.bytes("0123456789abcdef"));
    return load_checkpoint(file.string()).status();
  };
  auto one_tensor = [&](uint8_t dtype_code, std::vector<int64_t> dims) {
    return load_with([&](HandMadeFile& made) {
      made.header(uint64_t{0}, uint64_t{1});
      made.tensor("huge", dtype_code, dims);
      made.header(uint64_t{0});
    });
  };

  // 2^80 elements: past int64.
  CHECK(one_tensor(f32, {int64_t{1} << 40, int64_t{1} << 40}).code() == StatusCode::data_loss);
  // 2^60 elements fit, but not their 2^62 bytes... which do fit int64 yet not the 16-byte file.
  Status exabytes = one_tensor(f32, {int64_t{1} << 30, int64_t{1} << 30});
  CHECK(exabytes.code() == StatusCode::data_loss);
  CHECK(exabytes.message().find("truncated") != std::string::npos);
  // 2^62 f32 elements: bytes past int64.
  CHECK(one_tensor(f32, {int64_t{1} << 62}).code() == StatusCode::data_loss);
  CHECK(one_tensor(f32, {-4}).code() == StatusCode::data_loss);
  CHECK(one_tensor(f32, {1, 1, 1, 1, 1, 1, 1, 1, 1}).code() == StatusCode::data_loss);
  CHECK(one_tensor(77, {4}).code() == StatusCode::data_loss);
  // 16 bytes of blobs hold a [4] f32 but not a [5] one, and not a [3] one exactly.
  CHECK(one_tensor(f32, {5}).code() == StatusCode::data_loss);
  CHECK(one_tensor(f32, {3}).code() == StatusCode::data_loss);

  Status endless_metadata = load_with([](HandMadeFile& made) { made.header(uint64_t{1} << 63); });
  CHECK(endless_metadata.code() == StatusCode::data_loss);
  Status huge_name = load_with([](HandMadeFile& made) {
    made.header(uint64_t{0}, uint64_t{1}, uint64_t{1} << 62);
  });
  CHECK(huge_name.code() == StatusCode::data_loss);
  CHECK(huge_name.message().find("claims") != std::string::npos);
}

}  // namespace
}  // namespace swarm
