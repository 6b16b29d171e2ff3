// The classifier of examples/classifier, a model that is not the GPT, given the
// program's roles by its plug-in (swarm::cli::main<Classifier>): `local` trains it
// with peer processes of the same binary, with and without a secret, and
// `status` shows its peers while it runs.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <regex>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <doctest/doctest.h>

#include "tests/apps/swarm_process.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using namespace swarm::test_apps;

constexpr const char* kClassifier = "examples/classifier/classifier";

struct Losses {
  double first_train = 0, last_train = 0, validation = 0;
  long long abandoned = -1;
};

// From the summary lines `local` ends with.
Losses summary_of(const std::string& output) {
  Losses losses;
  std::smatch m;
  if (std::regex_search(output, m, std::regex(R"(train loss ([0-9.]+) -> ([0-9.]+) \| validation loss ([0-9.]+) nats/sample)"))) {
    losses.first_train = std::stod(m[1]);
    losses.last_train = std::stod(m[2]);
    losses.validation = std::stod(m[3]);
  }
  if (std::regex_search(output, m, std::regex(R"((\d+) abandoned, \d+ retries)"))) losses.abandoned = std::stoll(m[1]);
  return losses;
}

void check_trained(const std::string& output, const fs::path& run_dir) {
  INFO(output);
  const Losses losses = summary_of(output);
  CHECK(losses.first_train > 0.9);  // about ln 3 at the start
  CHECK(losses.last_train < 0.3 * losses.first_train);
  CHECK(losses.validation < 0.3 * losses.first_train);
  CHECK(losses.abandoned == 0);
  CHECK(fs::file_size(run_dir / "report.html") > 1000);
  const auto config = nlohmann::json::parse(read_all(run_dir / "config.json"));
  CHECK(config["model_name"] == "classifier");
  CHECK(config["stages"] == 2);
  // The report counts in the model's units, not the GPT's.
  const std::string report = read_all(run_dir / "report.html");
  CHECK(report.find("nats/sample") != std::string::npos);
  CHECK(report.find("Samples per second") != std::string::npos);
  CHECK(report.find("nats/byte") == std::string::npos);
  // The head reports its accuracy: in the final line, every step record, the final record and the report.
  std::smatch m;
  REQUIRE(std::regex_search(output, m, std::regex(R"(validation loss [0-9.]+ nats/sample, accuracy ([0-9.]+))")));
  CHECK(std::stod(m[1]) > 0.9);
  int steps_with_accuracy = 0, steps = 0;
  std::optional<double> final_accuracy;
  std::istringstream records(read_all(run_dir / "metrics.jsonl"));
  for (std::string line; std::getline(records, line);) {
    const auto record = nlohmann::json::parse(line, nullptr, false);
    if (!record.is_object() || record.value("kind", "") != "step") continue;
    if (record.contains("validation_metrics")) {
      final_accuracy = record["validation_metrics"].value("accuracy", -1.0);
      continue;
    }
    ++steps;
    steps_with_accuracy += record.contains("metrics") && record["metrics"].contains("accuracy");
  }
  CHECK(steps > 0);
  CHECK(steps_with_accuracy == steps);
  REQUIRE(final_accuracy.has_value());
  CHECK(*final_accuracy == doctest::Approx(std::stod(m[1])).epsilon(1e-3));
  CHECK(report.find("final validation accuracy") != std::string::npos);
  CHECK(report.find("plot-metrics") != std::string::npos);
}

// Each stage's samples, accumulated (summed over the peers' sample ledgers) and
// completed by the trainers, from the summary's per-stage lines.
std::vector<std::pair<long long, long long>> stage_samples(const std::string& output) {
  const std::regex line(R"(stage (\d): (\d+) samples accumulated of (\d+) completed)");
  std::vector<std::pair<long long, long long>> stages;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line); it != std::sregex_iterator(); ++it) {
    stages.emplace_back(std::stoll((*it)[2]), std::stoll((*it)[3]));
  }
  return stages;
}

void check_each_stage_counted_once(const std::string& output) {
  const auto stages = stage_samples(output);
  CHECK(stages.size() == 2);
  for (const auto& [accumulated, completed] : stages) CHECK(accumulated == completed);
}

}  // namespace

TEST_CASE("a model of one's own trains through `local`: loss falls, nothing abandoned, a report written") {
  const fs::path dir = temp_dir("classifier-local");
  const Run run = run_command(fmt::format("{} local --run-dir {} --steps 150 --microbatch 16 --rebalance-period 0 2>&1",
                                          kClassifier, dir.string()));
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  check_trained(run.output, dir);
  // Both stage types served by peer processes of the same binary.
  int serving[2] = {0, 0};
  for (const auto& entry : fs::directory_iterator(dir / "peers")) {
    for (int stage = 0; stage < 2; ++stage) {
      serving[stage] += read_all(entry.path()).find(fmt::format("serving stage {} of 2", stage)) != std::string::npos;
    }
  }
  CHECK(serving[0] == 2);
  CHECK(serving[1] == 2);
}

TEST_CASE("with --secret, the model's swarm is sealed, and `status` shows its peers while it trains") {
  const fs::path dir = temp_dir("classifier-secret");
  fs::create_directories(dir);
  const fs::path log = dir / "local.log";
  const pid_t local = spawn({"local", "--run-dir", (dir / "run").string(), "--secret", "classifier-test",
                             "--microbatch", "16", "--steps", "100000", "--time-limit", "12", "--rebalance-period", "0"},
                            log, kClassifier);
  Reaped reaped{local};
  const std::string port = wait_for(log, R"(registry: OpenDHT via 127\.0\.0\.1:(\d+), sealed records, CURVE)", 30s);
  wait_for(log, R"(all 2 stages served after [0-9.]+ s; training)", 60s);

  const Run status = run_command(fmt::format("{} status --bootstrap 127.0.0.1:{} --secret classifier-test --json "
                                             "2>/dev/null",
                                             kClassifier, port));
  INFO(status.output);
  REQUIRE(status.exit_code == 0);
  const auto shown = nlohmann::json::parse(status.output);
  CHECK(shown["secured"] == true);
  REQUIRE(shown["peers"].size() == 4);
  for (const auto& peer : shown["peers"]) CHECK(peer["address"].get<std::string>().rfind("tcp://127.0.0.1:", 0) == 0);

  const int exit_status = wait_exit(local, 90s);
  reaped.done = true;
  CHECK(WIFEXITED(exit_status));
  CHECK(WEXITSTATUS(exit_status) == 0);
  const std::string output = read_all(log);
  CHECK(output.find("stopped by: time limit") != std::string::npos);
  check_trained(output, dir / "run");
}

namespace {

// The rate `local` ends with: the model's units (here samples) per second.
double rate_of(const std::string& output) {
  std::smatch m;
  return std::regex_search(output, m, std::regex(R"(\| ([0-9.]+) samples/s)")) ? std::stod(m[1]) : -1;
}

}  // namespace

// The last record of a run's metrics.jsonl.
nlohmann::json final_record(const fs::path& run_dir) {
  std::istringstream records(read_all(run_dir / "metrics.jsonl"));
  nlohmann::json last;
  for (std::string line; std::getline(records, line);) {
    if (!line.empty()) last = nlohmann::json::parse(line);
  }
  return last;
}

// Every call of the trainers crosses the emulated links each way: four 20 ms hops
// per microbatch, where the classifier computes one in well under a millisecond.
TEST_CASE("a slow link set by --link shows in the run's rate; a malformed one is refused by name") {
  const fs::path dir = temp_dir("classifier-link");
  auto train = [&](const std::string& name, const std::string& extra) {
    return run_command(fmt::format("{} local --run-dir {} --steps 30 --microbatch 16 --rebalance-period 0 {} 2>&1",
                                   kClassifier, (dir / name).string(), extra));
  };
  const Run perfect = train("perfect", "");
  const Run slow = train("slow", "--link 10mbit,20ms");
  INFO(perfect.output);
  INFO(slow.output);
  REQUIRE(perfect.exit_code == 0);
  REQUIRE(slow.exit_code == 0);
  const double perfect_rate = rate_of(perfect.output), slow_rate = rate_of(slow.output);
  MESSAGE(fmt::format("samples/s: {:.0f} over loopback, {:.0f} over 10mbit,20ms links", perfect_rate, slow_rate));
  CHECK(slow_rate > 0);
  CHECK(slow_rate < 0.5 * perfect_rate);
  CHECK(summary_of(slow.output).abandoned == 0);
  CHECK(nlohmann::json::parse(read_all(dir / "slow" / "config.json"))["link"] == "10mbit,20ms");

  // Every process was behind a link of its own: the trainers' and the four peers'. Each message
  // crossed its sender's up link and its receiver's down link, so the two sums agree only if every
  // server was found behind its address, the stage-mates' all-reduce included.
  const nlohmann::json links = final_record(dir / "slow")["link_bytes"];
  INFO(links.dump());
  REQUIRE(links.is_object());
  CHECK(links.size() == 5);
  CHECK(links.contains("trainers"));
  uint64_t up = 0, down = 0;
  for (const auto& [name, carried] : links.items()) {
    CHECK(carried["up"].get<uint64_t>() > 0);
    CHECK(carried["down"].get<uint64_t>() > 0);
    up += carried["up"].get<uint64_t>();
    down += carried["down"].get<uint64_t>();
  }
  CHECK(up == down);
  CHECK(final_record(dir / "perfect")["link_bytes"].empty());

  // Peer to peer over the same links: the trainers send inputs and targets and get losses; the
  // activations and gradients cross the peers' links only. Validation still goes through the
  // trainers (forwards only), so their link is not silent.
  const Run p2p = train("p2p", "--link 10mbit,20ms --hops p2p");
  INFO(p2p.output);
  REQUIRE(p2p.exit_code == 0);
  const Losses p2p_losses = summary_of(p2p.output);
  CHECK(p2p_losses.abandoned == 0);
  CHECK(p2p_losses.last_train < 0.5 * p2p_losses.first_train);
  check_each_stage_counted_once(p2p.output);
  const nlohmann::json p2p_links = final_record(dir / "p2p")["link_bytes"];
  INFO(p2p_links.dump());
  const auto per_microbatch = [](const Run& run, const nlohmann::json& carried, const char* way) {
    std::smatch m;
    REQUIRE(std::regex_search(run.output, m, std::regex(R"((\d+) completed, \d+ abandoned)")));
    return carried["trainers"][way].get<double>() / std::stod(m[1]);
  };
  const double hub_up = per_microbatch(slow, links, "up"), p2p_up = per_microbatch(p2p, p2p_links, "up");
  const double hub_down = per_microbatch(slow, links, "down"), p2p_down = per_microbatch(p2p, p2p_links, "down");
  MESSAGE(fmt::format("the trainers' link per microbatch: hub {:.0f} up, {:.0f} down; peer to peer {:.0f} up, {:.0f} down",
                      hub_up, hub_down, p2p_up, p2p_down));
  CHECK(p2p_up < 0.4 * hub_up);
  CHECK(p2p_down < 0.4 * hub_down);
  CHECK(nlohmann::json::parse(read_all(dir / "p2p" / "config.json"))["hops"] == "p2p");

  const Run bad_hops = train("bad-hops", "--hops mesh");
  CHECK(bad_hops.exit_code != 0);
  CHECK(bad_hops.output.find("--hops") != std::string::npos);

  const Run bad = train("bad", "--link fast");
  CHECK(bad.exit_code != 0);
  CHECK(bad.output.find("--link") != std::string::npos);
  CHECK(!fs::exists(dir / "bad" / "peers"));  // refused before any process started
}

// Peer to peer, a peer killed while it holds pipelines: some in its forward, some
// waiting for the next stage, some in its backward. The trainers retry those
// through a stage-mate; each hop chooses by the microbatch's id, so a retry comes
// back to the next-stage peer that may have accumulated it, which replays its
// reply instead of counting it twice. The stage that lost nobody accounts for every
// sample exactly; the other's dead peer took its ledger with it, so there the sum
// of the living is at most what completed.
TEST_CASE("peer to peer: a peer of either stage killed mid-run: nothing abandoned, no sample counted twice") {
  const fs::path dir = temp_dir("classifier-p2p-kill");
  for (int killed : {0, 1}) {
    CAPTURE(killed);
    const Run run = run_command(fmt::format(
        "{} local --run-dir {} --steps 1200 --microbatch 16 --in-flight 8 --rebalance-period 0 --hops p2p --forward-timeout 2 "
        "--backward-timeout 4 --chaos kill-peer:{}:1 2>&1",
        kClassifier, (dir / fmt::format("kill{}", killed)).string(), killed));
    INFO(run.output);
    REQUIRE(run.exit_code == 0);
    CHECK(run.output.find(fmt::format("chaos: kill-peer stage {}", killed)) != std::string::npos);
    const Losses losses = summary_of(run.output);
    CHECK(losses.abandoned == 0);
    CHECK(losses.last_train < 0.3 * losses.first_train);
    const auto stages = stage_samples(run.output);
    REQUIRE(stages.size() == 2);
    const auto& [lost_accumulated, lost_completed] = stages[killed];
    const auto& [kept_accumulated, kept_completed] = stages[1 - killed];
    CHECK(kept_accumulated == kept_completed);
    CHECK(lost_accumulated <= lost_completed);
    CHECK(run.output.find("(1 peers, 1 silent)") != std::string::npos);
  }
}

// Peer to peer, hops are answered at once. With one hop slot a peer (--hop-slots 1)
// and 48 microbatches in flight, stage 1's peers answer most pipelines busy; each
// stage-0 peer then tries the stage-mate at once, or both again a moment later, and
// busy is no failure that bans a peer: nothing is abandoned, and each stage counts
// every sample once. Had busy banned the peer as an error does, until its next
// announcement, the run would crawl: it kept 1% of the rate of a run with free
// slots when tried so, and keeps well over a fifth of it now.
TEST_CASE("peer to peer: a peer without a free hop slot answers busy at once; its sender tries a stage-mate") {
  const fs::path root = temp_dir("classifier-p2p-busy");
  const auto train = [&](const std::string& name, int slots) {
    return run_command(fmt::format(
        "{} local --run-dir {} --steps 60 --microbatch 16 --in-flight 48 --rebalance-period 0 --hops p2p "
        "--hop-slots {} 2>&1",
        kClassifier, (root / name).string(), slots));
  };
  const Run free_slots = train("free", 64);
  INFO(free_slots.output);
  REQUIRE(free_slots.exit_code == 0);
  // The outcomes come back to the stage-0 peers' servers, whose workers hold the
  // trainers' pipelines that wait for them. With 64 such workers and 8 to spare,
  // 48 in flight are neither refused nor timed out. (With 16 and no spare ones,
  // every pipeline waited out its deadline; with 16 and a busy answer beyond
  // them, 168 attempts were answered busy and retried.)
  CHECK(free_slots.output.find(" 0 abandoned, 0 retries") != std::string::npos);
  const fs::path dir = root / "one-slot";
  const Run run = train("one-slot", 1);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  // The rate of the last step line: the run's, not its first step's.
  const auto last_rate = [](const std::string& output) {
    const std::regex rate(R"(\| ([0-9.]+) samples/s)");
    double last = -1;
    for (auto it = std::sregex_iterator(output.begin(), output.end(), rate); it != std::sregex_iterator(); ++it) {
      last = std::stod((*it)[1]);
    }
    return last;
  };
  const double free_rate = last_rate(free_slots.output), busy_rate = last_rate(run.output);
  MESSAGE(fmt::format("samples/s: {:.0f} with 64 hop slots a peer, {:.0f} with 1", free_rate, busy_rate));
  CHECK(busy_rate > 0.2 * free_rate);
  const Losses losses = summary_of(run.output);
  CHECK(losses.abandoned == 0);
  CHECK(losses.last_train < 0.5 * losses.first_train);
  check_each_stage_counted_once(run.output);
  int64_t busy[2] = {0, 0};
  int peers[2] = {0, 0};
  std::istringstream records(read_all(dir / "metrics.jsonl"));
  for (std::string line; std::getline(records, line);) {
    if (line.empty()) continue;
    const nlohmann::json record = nlohmann::json::parse(line);
    if (record.value("kind", "") != "peer_samples" || !record.contains("refusals")) continue;
    const int stage = record["stage"].get<int>();
    REQUIRE((stage == 0 || stage == 1));
    busy[stage] += record["refusals"].value("pipelines_busy", int64_t{0});
    ++peers[stage];
  }
  MESSAGE(fmt::format("pipelines answered busy: {} at stage 1's peers, {} at stage 0's", busy[1], busy[0]));
  CHECK(peers[1] == 2);
  CHECK(busy[1] > 0);
  CHECK(busy[0] == 0);  // stage 0 takes pipelines from trainers, which wait for their reply
}
