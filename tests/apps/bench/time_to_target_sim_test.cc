// The simulator's model of a timed run, built from the run's own config.json: the bytes
// its codecs and boundary put on the wire, its device's pace, its links and waits; and
// the refusals of a config it cannot stand for.
#include "apps/bench/time_to_target_sim.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <string>

#include <doctest/doctest.h>

#include "apps/bench/time_to_target.h"
#include "models/gpt/config.h"
#include "swarm/compression/codecs.h"

namespace swarm::apps {
namespace {

// What `swarm local` writes for a timed run of the time-to-target benchmark.
nlohmann::json timed_run_config(const std::string& hops) {
  nlohmann::json config = nlohmann::json::parse(R"({
    "stages": 2, "peers_per_stage": 2, "trainers": 1, "in_flight": 32, "microbatch": 8,
    "microbatches_per_step": 32, "global_batch_samples": 256, "forward_hold_seconds": 0.02,
    "round_wait_seconds": 0.25, "link": "200mbit,50ms", "model_name": "gpt", "codec": "4bit",
    "gradient_codec": "8bit", "emulated_device_flops": 25e12,
    "model": {"boundaries": [{"k": 4, "kind": "maxout"}], "d_model": 128, "layer_repeat": 1,
              "max_seq_len": 128, "n_heads": 4, "n_layers": 4, "vocab_size": 256}})");
  config["hops"] = hops;
  return config;
}

int64_t encoded(CodecId codec, uint64_t values) {
  return static_cast<int64_t>(*compression::StandardCodecs::encoded_bytes(codec, values));
}

TEST_CASE("a timed run's config becomes the scenario of the same swarm, bytes, pace, links and waits") {
  auto s = scenario_of_run(timed_run_config("p2p"));
  REQUIRE_MESSAGE(s.is_ok(), s.status().to_string());
  CHECK(s->peers == 4);
  CHECK(s->stages == 2);
  CHECK(s->in_flight == 32);
  CHECK(s->hops == sim::HopMode::peer_to_peer);
  CHECK(s->rounds == sim::RoundTrigger::joins);
  CHECK(s->global_batch.target_samples == 256);
  CHECK(s->forward_hold == doctest::Approx(0.02));
  CHECK(s->round_wait == doctest::Approx(0.25));
  // maxout:4 sends d_model / 4 wide: activations in 4 bits, their gradients in 8.
  CHECK(s->activation_bytes == encoded(CodecId::blockwise4, 8 * 128 * 32));
  CHECK(s->activation_gradient_bytes == encoded(CodecId::blockwise8, 8 * 128 * 32));
  CHECK(s->token_bytes == 4 * 8 * 128);
  CHECK(s->trainer_bandwidth_mbps == doctest::Approx(200));
  CHECK(s->trainer_latency_ms == doctest::Approx(50));
  CHECK(s->bandwidth_mbps.to_string() == sim::Distribution::constant(200).to_string());
  // Stage 0's forward of one sample (128 tokens) at 25 TFLOP/s is the unit of pace.
  gpt::GptConfig model;
  model.boundaries = {{gpt::BoundaryKind::maxout, 4}};
  const auto layouts = *gpt::partition_layers(model, 2);
  const double first = gpt::stage_forward_flops_per_token(model, layouts[0]);
  const double last = gpt::stage_forward_flops_per_token(model, layouts[1]);
  CHECK(s->throughput.to_string() == sim::Distribution::constant(25e12 / (first * 128)).to_string());
  CHECK(s->last_stage_cost == doctest::Approx(3 * last / first));
}

TEST_CASE("the simulated step: links off the trainer make peer to peer faster when the activations are large") {
  nlohmann::json hub = timed_run_config("hub"), p2p = timed_run_config("p2p");
  for (auto* config : {&hub, &p2p}) {
    (*config)["codec"] = (*config)["gradient_codec"] = "none";
    (*config)["model"]["boundaries"] = nlohmann::json::array();
  }
  auto hub_step = simulated_step(hub, 30, 2), p2p_step = simulated_step(p2p, 30, 2);
  REQUIRE_MESSAGE(hub_step.is_ok(), hub_step.status().to_string());
  REQUIRE_MESSAGE(p2p_step.is_ok(), p2p_step.status().to_string());
  INFO("hub ", hub_step->step_seconds, " s, p2p ", p2p_step->step_seconds, " s");
  // Uncompressed hub: about 1.06 MB up per microbatch through a 25 MB/s link, 32 a step.
  CHECK(hub_step->step_seconds >= 32 * hub_step->trainer_up_bytes / 25e6);
  CHECK(hub_step->step_seconds / p2p_step->step_seconds >= 1.3);
  CHECK(p2p_step->trainer_up_bytes == doctest::Approx(2 * 4 * 8 * 128));
  CHECK(hub_step->step_min <= hub_step->step_seconds);
  CHECK(hub_step->step_max >= hub_step->step_seconds);
}

TEST_CASE("a config the simulator cannot stand for is refused, naming why") {
  auto error_of = [](const nlohmann::json& config) {
    auto s = scenario_of_run(config);
    return s.is_ok() ? std::string() : s.status().message();
  };
  nlohmann::json c = timed_run_config("hub");
  c["emulated_device_flops"] = 0.0;
  CHECK(error_of(c).find("--emulated-device") != std::string::npos);
  c = timed_run_config("hub");
  c.erase("link");
  CHECK(error_of(c).find("'link'") != std::string::npos);
  c = timed_run_config("hub");
  c["in_flight"] = "many";
  CHECK(error_of(c).find("'in_flight' of the wrong type") != std::string::npos);
  c = timed_run_config("hub");
  c["hops"] = "ring";
  CHECK(error_of(c).find("--hops") != std::string::npos);
  c = timed_run_config("hub");
  c["codec"] = "2bit";
  CHECK(error_of(c).find("2bit") != std::string::npos);
  c = timed_run_config("hub");
  c["model_name"] = "classifier";
  CHECK(error_of(c).find("GPT") != std::string::npos);
  c = timed_run_config("hub");
  c["peers_per_stage"] = 1 << 30;
  CHECK(error_of(c).find("out of range") != std::string::npos);
  CHECK(error_of(nlohmann::json::array()).find("no 'stages'") != std::string::npos);
  CHECK(!simulated_step(timed_run_config("hub"), 10, 0).is_ok());
}

TEST_CASE("a finished run whose config has a field of the wrong type is measured without the simulator, not a crash") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::filesystem::path dir = std::filesystem::path(tmp ? tmp : "/tmp") / "wrong_type_run";
  std::filesystem::create_directories(dir);
  nlohmann::json config = timed_run_config("p2p");
  config["hops"] = 5;
  std::ofstream(dir / "config.json") << config.dump();
  std::ofstream(dir / "metrics.jsonl") << R"({"kind":"step","step":1,"time":1.0})" << "\n";
  auto timed = measure_timed_run(dir.string(), 0);
  REQUIRE_MESSAGE(timed.is_ok(), timed.status().to_string());
  CHECK(timed->mode == "hub");
  CHECK(!timed->sim_step_seconds);
  CHECK(timed->sim_error.find("hops") != std::string::npos);
}

}  // namespace
}  // namespace swarm::apps
