// `swarm bench time-to-target` end to end on a tiny model: real training runs with
// validations along the way, timed runs behind emulated links at an emulated
// device's pace, and the report's arithmetic checked against the runs' own records.
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <doctest/doctest.h>

#include "tests/apps/swarm_process.h"

namespace {

namespace fs = std::filesystem;
using namespace swarm::test_apps;

std::string bench_command(const fs::path& out, const std::string& configurations) {
  return fmt::format(
      "{} bench time-to-target --out {} --configurations '{}' --seeds 1 --peers-per-stage 1 --microbatch 2 "
      "--microbatches-per-step 4 --steps 8 --eval-every 2 --eval-windows 4 --target-at 6 --timed-steps 6 "
      "--warmup-steps 1 --local-flag=--d-model=32 --local-flag=--layers=2 --local-flag=--heads=2 "
      "--local-flag=--seq-len=32 2>&1",
      kSwarmBinary, out.string(), configurations);
}

TEST_CASE("time to target: the baseline's own loss at --target-at is the target, peer to peer unloads the trainer") {
  const fs::path out = temp_dir("time-to-target");
  const Run run = run_command(bench_command(out, "none|none|none,8bit|8bit|none"));
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  const auto report = nlohmann::json::parse(read_all(out / "time_to_target.json"));
  // The target is the baseline's validation at step 6, as its run recorded it.
  double at_6 = -1;
  for (const auto& r : read_metrics(out / "train" / "none-seed1")) {
    if (r["kind"] == "validation" && r["step"] == 6) at_6 = r["validation_loss"].get<double>();
  }
  CHECK(report["target"].get<double>() == doctest::Approx(at_6));
  const auto& scores = report["scores"];
  REQUIRE(scores.size() == 2);
  CHECK(scores[0]["steps_to_target_mean"].get<double>() <= 6.0);  // reached by its own step 6 at the latest
  for (const auto& score : scores) {
    REQUIRE(score["timed"].size() == 2);
    const auto& hub = score["timed"][0];
    const auto& p2p = score["timed"][1];
    CHECK(hub["mode"] == "hub");
    CHECK(p2p["mode"] == "p2p");
    CHECK(hub["step_seconds"].get<double>() > 0.1);  // four 50 ms crossings at least
    // The trainer's link carries the activations in hub mode, only tokens and targets peer to peer.
    CHECK(p2p["trainer_link_bytes_per_microbatch"]["up"].get<double>() <
          0.5 * hub["trainer_link_bytes_per_microbatch"]["up"].get<double>());
    CHECK(hub["seconds_to_target"].get<double>() ==
          doctest::Approx(score["steps_to_target_mean"].get<double>() * hub["step_seconds"].get<double>()));
    // The simulator's model of each timed run, from its config.json: links set its pace as well.
    for (const auto* t : {&hub, &p2p}) {
      INFO((*t)["mode"].get<std::string>(), ": ", (*t)["simulator_error"].get<std::string>());
      CHECK((*t)["simulator_error"] == "");
      REQUIRE((*t)["simulated_step_seconds"].is_number());
      CHECK((*t)["simulated_step_seconds"].get<double>() > 0.1);
    }
    CHECK(p2p["simulated_trainer_link_bytes_per_microbatch"]["up"].get<double>() <
          0.5 * hub["simulated_trainer_link_bytes_per_microbatch"]["up"].get<double>());
  }
  // 8-bit sends a quarter of the activation bytes; the trainer's link shows it in hub mode.
  CHECK(scores[1]["timed"][0]["trainer_link_bytes_per_microbatch"]["up"].get<double>() <
        0.5 * scores[0]["timed"][0]["trainer_link_bytes_per_microbatch"]["up"].get<double>());
  const std::string md = read_all(out / "time_to_target.md");
  CHECK(md.find("| 8bit | ") != std::string::npos);
  CHECK(md.find("## The simulator against the timed runs") != std::string::npos);
  CHECK(read_all(out / "time_to_target.svg").find("<svg") != std::string::npos);

  // Run again over records a crash might leave: a torn line and a field of the wrong type are
  // passed over. Every run is reused, and the report is the same.
  std::ofstream(out / "time" / "none-hub" / "metrics.jsonl", std::ios::app)
      << "{\"kind\":\"step\",\"ti\n{\"kind\":\"step\",\"step\":99,\"time\":\"late\"}\n";
  const Run again = run_command(bench_command(out, "none|none|none,8bit|8bit|none"));
  CHECK(again.exit_code == 0);
  CHECK(again.output.find("already measured") != std::string::npos);
  CHECK(again.output.find("swarm local") == std::string::npos);
  const auto second = nlohmann::json::parse(read_all(out / "time_to_target.json"));
  CHECK(second["target"] == report["target"]);
  CHECK(second["scores"][0]["timed"][0]["step_seconds"] == report["scores"][0]["timed"][0]["step_seconds"]);
}

TEST_CASE("time to target: a malformed configuration or a target past the steps is refused before any run") {
  const fs::path out = temp_dir("time-to-target-bad");
  const Run malformed = run_command(bench_command(out, "none|none"));
  CHECK(malformed.exit_code == 2);
  CHECK(malformed.output.find("label|codec|boundary") != std::string::npos);
  CHECK(!fs::exists(out / "train"));
  const Run late = run_command(fmt::format("{} bench time-to-target --out {} --steps 20 --target-at 30 2>&1",
                                           kSwarmBinary, out.string()));
  CHECK(late.exit_code == 2);
  CHECK(late.output.find("--target-at") != std::string::npos);
}

}  // namespace
