// Single-process training end to end on a small text: it learns, it resumes
// exactly, it samples, and bad options are clear errors.
#include "apps/local_training.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include <doctest/doctest.h>
#include <fmt/format.h>

namespace swarm::apps {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    const char* base = std::getenv("TEST_TMPDIR");
    path = fs::path(base ? base : "/tmp") / ("local_training_" + std::to_string(::getpid()) + "_" +
                                             std::to_string(counter++));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  static inline int counter = 0;
};

// A small, very regular text: a model that learns must beat byte frequencies on it.
std::string write_corpus(const fs::path& dir) {
  const fs::path file = dir / "corpus.txt";
  std::ofstream out(file);
  const char* lines[] = {"the cat sat on the mat.\n", "a dog ran in the fog.\n",
                         "we sat in the sun all day.\n", "the sun set on the bay.\n"};
  for (int i = 0; i < 2000; ++i) out << lines[(i * 7 + i / 3) % 4];
  return file.string();
}

LocalTrainingOptions small_options(const std::string& data) {
  LocalTrainingOptions options;
  options.data_path = data;
  options.model.d_model = 32;
  options.model.n_heads = 2;
  options.model.n_layers = 2;
  options.model.max_seq_len = 32;
  options.batch_size = 8;
  options.steps = 80;
  options.peak_lr = 1e-2f;
  options.warmup_steps = 10;
  options.eval_every = 40;
  options.eval_windows = 8;
  options.log_every = 20;
  options.sample_length = 40;
  options.sample_prompt = "the ";
  return options;
}

const ProgressSink kQuiet = [](std::string_view) {};

TEST_CASE("a small GPT learns a regular text well below the uniform loss") {
  TempDir dir;
  auto options = small_options(write_corpus(dir.path));
  options.metrics_path = (dir.path / "metrics.jsonl").string();
  int lines = 0;
  auto report = train_locally(options, [&](std::string_view) { ++lines; });
  REQUIRE_MESSAGE(report.is_ok(), report.status().to_string());
  CHECK(report->steps_done == 80);
  CHECK(report->first_validation_loss == doctest::Approx(std::log(256.0)).epsilon(0.05));
  // Byte frequencies alone give ~2.9 nats here; sequence structure gets far lower.
  CHECK(report->final_validation_loss < 1.5);
  CHECK(report->validation_curve.size() == 3);
  CHECK(report->sample.size() == 40);
  CHECK(lines > 5);
  std::ifstream metrics(options.metrics_path);
  std::string line;
  int records = 0;
  while (std::getline(metrics, line)) {
    CHECK(line.find("\"kind\"") != std::string::npos);
    ++records;
  }
  CHECK(records == 3 + 4);  // three evaluations, four logged steps
}

TEST_CASE("resuming from a checkpoint continues exactly like an unbroken run") {
  TempDir dir;
  auto options = small_options(write_corpus(dir.path));
  options.steps = 30;
  options.sample_length = 0;
  options.eval_every = 1000;
  auto plain = train_locally(options, kQuiet);
  REQUIRE(plain.is_ok());

  // The same run, checkpointing at steps 15 and 30; keep the step-15 file aside.
  options.eval_every = 15;
  options.checkpoint_path = (dir.path / "run.ckpt").string();
  const fs::path at15 = dir.path / "at15.ckpt";
  auto unbroken = train_locally(options, [&](std::string_view line) {
    if (line.starts_with("checkpoint:") && line.ends_with("(step 15)")) fs::copy_file(options.checkpoint_path, at15);
  });
  REQUIRE(unbroken.is_ok());
  REQUIRE(fs::exists(at15));
  // Evaluating does not disturb training.
  CHECK(unbroken->final_validation_loss == plain->final_validation_loss);

  auto resumed_options = options;
  resumed_options.checkpoint_path.clear();
  resumed_options.resume_path = at15.string();
  auto resumed = train_locally(resumed_options, kQuiet);
  REQUIRE_MESSAGE(resumed.is_ok(), resumed.status().to_string());
  CHECK(resumed->steps_done == 30);
  CHECK(resumed->validation_curve.front().first == 15);
  CHECK(resumed->final_validation_loss == unbroken->final_validation_loss);
}

TEST_CASE("a loaded checkpoint samples like the model that wrote it") {
  TempDir dir;
  auto options = small_options(write_corpus(dir.path));
  options.steps = 20;
  options.checkpoint_path = (dir.path / "model.ckpt").string();
  auto report = train_locally(options, kQuiet);
  REQUIRE(report.is_ok());
  auto model = load_model(options.checkpoint_path);
  REQUIRE_MESSAGE(model.is_ok(), model.status().to_string());
  auto text = sample_text(*model, options.sample_prompt, options.sample_length, 0.8f, options.seed);
  REQUIRE(text.is_ok());
  CHECK(*text == report->sample);
  CHECK(sample_text(*model, "x", 5, 0.0f, 1).status().code() == StatusCode::invalid_argument);
}

TEST_CASE("bad options and inputs are clear errors") {
  TempDir dir;
  auto options = small_options((dir.path / "missing.txt").string());
  auto missing = train_locally(options, kQuiet);
  CHECK(missing.status().code() == StatusCode::not_found);
  CHECK(missing.status().message().find("missing.txt") != std::string::npos);

  options = small_options(write_corpus(dir.path));
  options.optimizer = "sgd";
  CHECK(train_locally(options, kQuiet).status().code() == StatusCode::invalid_argument);

  options = small_options(write_corpus(dir.path));
  options.model.n_heads = 3;
  CHECK(train_locally(options, kQuiet).status().code() == StatusCode::invalid_argument);

  options = small_options(write_corpus(dir.path));
  options.steps = 5;
  options.checkpoint_path = (dir.path / "a.ckpt").string();
  REQUIRE(train_locally(options, kQuiet).is_ok());
  auto other = small_options(options.data_path);
  other.model.d_model = 64;
  other.resume_path = options.checkpoint_path;
  auto mismatch = train_locally(other, kQuiet);
  CHECK(mismatch.status().code() == StatusCode::invalid_argument);
  CHECK(mismatch.status().message().find("different model") != std::string::npos);

  CHECK(load_model((dir.path / "nope.ckpt").string()).status().code() == StatusCode::not_found);
}

TEST_CASE("a run directory's config.json is checked before any checkpoint is read") {
  const fs::path dir = fs::temp_directory_path() / fmt::format("swarm-run-config-{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string model = gpt::GptConfig{}.to_json();
  auto with_config = [&](const std::string& text) {
    std::ofstream(dir / "config.json") << text;
    return load_swarm_run(dir.string());
  };
  CHECK(load_swarm_run((dir / "none").string()).status().code() == StatusCode::not_found);
  CHECK(with_config("not json").status().code() == StatusCode::data_loss);
  CHECK(with_config(R"({"stages": 2})").status().code() == StatusCode::data_loss);
  CHECK(with_config(R"({"model": )" + model + R"(, "stages": "2"})").status().code() == StatusCode::data_loss);
  // Counts that int would wrap, or no split of the layers can hold.
  for (const char* stages : {"0", "-1", "4294967298", "18446744073709551615", "1000"}) {
    auto run = with_config(R"({"model": )" + model + R"(, "stages": )" + stages + "}");
    CHECK_MESSAGE(run.status().code() == StatusCode::data_loss, stages);
  }
  // A sound config without checkpoints names the stage that lacks one.
  auto run = with_config(R"({"model": )" + model + R"(, "stages": 2})");
  CHECK(run.status().code() == StatusCode::not_found);
  CHECK(run.status().message().find("stage 0 of") != std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace swarm::apps