// Bad input gets a clear error naming the flag: through the Scenario, the distribution
// and schedule parsers, and `swarm sim`'s own flag handling.
#include "swarm/sim/scenario.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <doctest/doctest.h>

#include "apps/sim/sim_command.h"
#include "swarm/core/random.h"

namespace swarm {
namespace {

// The error `swarm sim ARGS --out x` gives, or "" when the flags are fine.
std::string error_for(std::vector<std::string> args) {
  CLI::App app{"test"};
  apps::SimFlags flags;
  apps::add_sim_flags(&app, &flags);
  args.insert(args.end(), {"--out", "unused.jsonl"});
  std::reverse(args.begin(), args.end());  // CLI11 takes them last-first
  app.parse(args);
  auto scenario = apps::scenario_from(flags);
  return scenario.is_ok() ? "" : scenario.status().message();
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST_CASE("hop, trainer-link and round flags reach the scenario; bad ones are refused by name") {
  CHECK(error_for({"--hops", "p2p", "--trainer-bandwidth-mbps", "200", "--trainer-latency-ms", "50", "--rounds",
                   "joins", "--forward-hold", "0.02", "--round-wait", "0.25"}) == "");
  CHECK(contains(error_for({"--hops", "mesh"}), "--hops"));
  CHECK(contains(error_for({"--rounds", "sometimes"}), "--rounds"));
  CHECK(contains(error_for({"--trainer-bandwidth-mbps", "-5"}), "--trainer-bandwidth-mbps"));
  CHECK(contains(error_for({"--trainer-latency-ms", "-1"}), "--trainer-latency-ms"));
  CHECK(contains(error_for({"--forward-hold", "-0.1"}), "--forward-hold"));
  CHECK(contains(error_for({"--round-wait", "-1"}), "--round-wait"));
  CHECK(contains(error_for({"--token-bytes", "-1"}), "--token-bytes"));
  CHECK(contains(error_for({"--activation-gradient-bytes", "-1"}), "--activation-gradient-bytes"));
}

TEST_CASE("good flags resolve, with the autos filled in") {
  CHECK(error_for({"--peers", "1000", "--stages", "4", "--hours", "1", "--churn", "0.4"}) == "");
  sim::Scenario s;
  s.peers = 1000;
  auto r = s.resolved();
  REQUIRE(r.is_ok());
  CHECK(r->trainers == 10);
  CHECK(r->in_flight == 400);
  CHECK(r->sample_every == 60);
  CHECK(r->activation_bytes == 8 * 128 * 1024 + 4 * 256);
  CHECK(r->state_bytes == 12 * s.stage_params);
}

TEST_CASE("each bad flag is named in its error") {
  CHECK(contains(error_for({"--stages", "0"}), "--stages"));
  CHECK(contains(error_for({"--peers", "0"}), "--peers"));
  CHECK(contains(error_for({"--churn", "-0.1"}), "--churn"));
  CHECK(contains(error_for({"--churn", "1.5"}), "--churn"));
  CHECK(contains(error_for({"--router", "fastest"}), "unknown --router 'fastest'"));
  CHECK(contains(error_for({"--throughput", "uniform:5"}), "--throughput"));
  CHECK(contains(error_for({"--throughput", "const:0"}), "--throughput"));
  CHECK(contains(error_for({"--throughput", "gauss:1:2"}), "unknown kind 'gauss'"));
  CHECK(contains(error_for({"--bandwidth-mbps", "choice:10,x"}), "--bandwidth-mbps"));
  CHECK(contains(error_for({"--latency-ms", "-5"}), "--latency-ms"));
  CHECK(contains(error_for({"--hours", "1", "--seconds", "10"}), "not both"));
  CHECK(contains(error_for({"--seconds", "-3"}), "> 0"));
  CHECK(contains(error_for({"--schedule", "kill:9:10"}), "stage 9"));
  CHECK(contains(error_for({"--schedule", "kill:1"}), "kill:STAGE:AT_SECONDS"));
  CHECK(contains(error_for({"--schedule", "join:99999", "--seconds", "60"}), "outside"));
  CHECK(contains(error_for({"--peers", "10", "--peers-per-stage", "5,5"}), "--peers-per-stage lists 2 stages"));
  CHECK(contains(error_for({"--peers", "10", "--stages", "2", "--peers-per-stage", "5,4"}), "adds up to 9"));
  CHECK(contains(error_for({"--microbatch", "0"}), "--microbatch"));
  CHECK(contains(error_for({"--timeout", "0"}), "--timeout"));
  CHECK(contains(error_for({"--announce-ttl", "0.5"}), "--announce-ttl"));
  CHECK(contains(error_for({"--join-rate", "-1"}), "--join-rate"));
  CHECK(contains(error_for({"--rebalance-confirmations", "0"}), "confirmations"));
  CHECK(contains(error_for({"--global-batch", "0"}), "--global-batch"));
  CHECK(contains(error_for({"--compute-jitter", "1"}), "--compute-jitter"));
  CHECK(contains(error_for({"--announce-throughput", "exact"}), "--announce-throughput"));
}

TEST_CASE("run_sim refuses bad flags with exit code 2 and writes nothing") {
  apps::SimFlags flags;
  flags.scenario.stages = 0;
  flags.out = "/nonexistent-dir/never-written.jsonl";
  CHECK(apps::run_sim(flags) == 2);
}

TEST_CASE("distributions draw within their range and repeat for a seed") {
  auto uniform = sim::parse_distribution("uniform:5:20");
  REQUIRE(uniform.is_ok());
  SplitMix64 a(3), b(3);
  for (int i = 0; i < 1000; ++i) {
    const double x = uniform->sample(a);
    CHECK(x >= 5);
    CHECK(x < 20);
    CHECK(uniform->sample(b) == x);
  }
  auto choice = sim::parse_distribution("choice:4,10,25");
  REQUIRE(choice.is_ok());
  int counts[3] = {0, 0, 0};
  for (int i = 0; i < 3000; ++i) {
    const double x = choice->sample(a);
    counts[x == 4 ? 0 : x == 10 ? 1 : 2] += (x == 4 || x == 10 || x == 25) ? 1 : 0;
  }
  for (int c : counts) CHECK(c == doctest::Approx(1000).epsilon(0.1));
  auto lognormal = sim::parse_distribution("lognormal:2.3:0.5");
  REQUIRE(lognormal.is_ok());
  double sum = 0;
  for (int i = 0; i < 20000; ++i) sum += std::log(lognormal->sample(a));
  CHECK(sum / 20000 == doctest::Approx(2.3).epsilon(0.02));
  CHECK(sim::parse_distribution("7.5")->sample(a) == 7.5);
}

TEST_CASE("schedules sort by time and keep their stage") {
  auto schedule = sim::parse_schedule("join:40,kill:1:25,kill:0:30");
  REQUIRE(schedule.is_ok());
  REQUIRE(schedule->size() == 3);
  CHECK((*schedule)[0].at == 25);
  CHECK((*schedule)[0].stage == 1);
  CHECK((*schedule)[1].stage == 0);
  CHECK((*schedule)[2].kind == sim::ScheduledEvent::Kind::join);
}

}  // namespace
}  // namespace swarm
