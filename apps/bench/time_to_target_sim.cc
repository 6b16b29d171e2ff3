#include "apps/bench/time_to_target_sim.h"

#include <cmath>
#include <limits>
#include <sstream>

#include <fmt/format.h>

#include "models/gpt/config.h"
#include "swarm/api/codec.h"
#include "swarm/compression/codecs.h"
#include "swarm/sim/simulator.h"
#include "transports/netem/link_model.h"

namespace swarm::apps {
namespace {

constexpr double kUnlimitedMbps = 1e9;  // a terabit: a 1 GB tensor crosses in 8 ms

// A field of the run's own config.json, of the type asked; its absence is an error.
template <typename T>
Result<T> field(const nlohmann::json& json, const char* key) {
  if (!json.is_object() || !json.contains(key)) return invalid_argument("the run's config.json has no '{}'", key);
  try {
    return json.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    return invalid_argument("the run's config.json has a '{}' of the wrong type", key);
  }
}

Result<int64_t> encoded_bytes(const std::string& codec_name, int64_t values) {
  const std::optional<CodecId> codec = codec_from_name(codec_name);
  if (!codec) return invalid_argument("the run's codec '{}' is none of {}", codec_name, all_codec_names_text());
  SWARM_ASSIGN_OR_RETURN(uint64_t bytes, compression::StandardCodecs::encoded_bytes(*codec, static_cast<uint64_t>(values)));
  return static_cast<int64_t>(bytes);
}

Status apply_link(const nlohmann::json& config, sim::Scenario* s) {
  SWARM_ASSIGN_OR_RETURN(std::string text, field<std::string>(config, "link"));
  EmulatedLink link;  // none: unlimited, no latency
  if (!text.empty()) {
    SWARM_ASSIGN_OR_RETURN(link, netem::parse_link(text));
  }
  const double mbps = link.bandwidth_bytes_per_s * 8 / 1e6;
  const double ms = static_cast<double>(link.latency.count()) / 1000.0;
  // A peer's link has a rate in the simulator: an unlimited one is one no message waits on.
  s->bandwidth_mbps = sim::Distribution::constant(mbps > 0 ? mbps : kUnlimitedMbps);
  s->latency_ms = sim::Distribution::constant(ms);
  s->trainer_bandwidth_mbps = mbps;
  s->trainer_latency_ms = ms;
  return Status::ok();
}

// Bytes per hidden tensor and per gradient at the first cut, and per all-reduce.
Status apply_model(const nlohmann::json& config, sim::Scenario* s) {
  SWARM_ASSIGN_OR_RETURN(std::string model_name, field<std::string>(config, "model_name"));
  if (model_name != "gpt") return invalid_argument("the simulator's step needs the GPT model, not '{}'", model_name);
  SWARM_ASSIGN_OR_RETURN(nlohmann::json model, field<nlohmann::json>(config, "model"));
  SWARM_ASSIGN_OR_RETURN(gpt::GptConfig gpt_config, gpt::GptConfig::from_json(model.dump()));
  SWARM_ASSIGN_OR_RETURN(std::vector<gpt::StageLayout> layouts, gpt::partition_layers(gpt_config, s->stages));
  SWARM_ASSIGN_OR_RETURN(double flops, field<double>(config, "emulated_device_flops"));
  if (!(flops > 0) || !std::isfinite(flops)) {
    return invalid_argument("the run had no --emulated-device: compute on shared cores has no rate to simulate");
  }
  SWARM_ASSIGN_OR_RETURN(std::string codec, field<std::string>(config, "codec"));
  SWARM_ASSIGN_OR_RETURN(std::string gradient_codec, field<std::string>(config, "gradient_codec"));
  s->seq_len = gpt_config.max_seq_len;
  s->d_model = gpt_config.d_model;
  const int64_t hidden = s->microbatch * s->seq_len * gpt_config.boundary_after(0).wire_width(gpt_config.d_model);
  SWARM_ASSIGN_OR_RETURN(s->activation_bytes, encoded_bytes(codec, hidden));
  SWARM_ASSIGN_OR_RETURN(s->activation_gradient_bytes, encoded_bytes(gradient_codec, hidden));
  s->stage_params = std::max<int64_t>(1, gpt_config.parameter_count(s->stages) / s->stages);
  SWARM_ASSIGN_OR_RETURN(s->gradient_bytes, encoded_bytes(codec, s->stage_params));  // all-reduce parts
  // Stage 0's forward is the unit; a backward costs twice a forward (EmulatedDeviceStage).
  const double first = gpt::stage_forward_flops_per_token(gpt_config, layouts.front());
  const double last = gpt::stage_forward_flops_per_token(gpt_config, layouts.back());
  s->throughput = sim::Distribution::constant(flops / (first * static_cast<double>(s->seq_len)));
  s->backward_cost = 2;
  s->last_stage_cost = s->stages == 1 ? 3 : 3 * last / first;
  s->compute_jitter = 0;
  return Status::ok();
}

}  // namespace

Result<sim::Scenario> scenario_of_run(const nlohmann::json& config) {
  sim::Scenario s;
  SWARM_ASSIGN_OR_RETURN(s.stages, field<int>(config, "stages"));
  SWARM_ASSIGN_OR_RETURN(int peers_per_stage, field<int>(config, "peers_per_stage"));
  if (s.stages < 1 || peers_per_stage < 1 || peers_per_stage > 1000 || s.stages > 1000) {
    return invalid_argument("the run's stages ({}) and peers per stage ({}) are out of range", s.stages, peers_per_stage);
  }
  s.peers = s.stages * peers_per_stage;
  SWARM_ASSIGN_OR_RETURN(s.trainers, field<int>(config, "trainers"));
  SWARM_ASSIGN_OR_RETURN(s.in_flight, field<int>(config, "in_flight"));
  SWARM_ASSIGN_OR_RETURN(s.microbatch, field<int64_t>(config, "microbatch"));
  SWARM_ASSIGN_OR_RETURN(s.global_batch.target_samples, field<int64_t>(config, "global_batch_samples"));
  SWARM_ASSIGN_OR_RETURN(std::string hops, field<std::string>(config, "hops"));
  SWARM_ASSIGN_OR_RETURN(s.hops, sim::parse_hop_mode(hops));
  SWARM_ASSIGN_OR_RETURN(s.forward_hold, field<double>(config, "forward_hold_seconds"));
  SWARM_ASSIGN_OR_RETURN(s.round_wait, field<double>(config, "round_wait_seconds"));
  s.rounds = sim::RoundTrigger::joins;
  s.rebalance = false;  // the timed runs pass --rebalance-period 0
  SWARM_RETURN_IF_ERROR(apply_link(config, &s));
  SWARM_RETURN_IF_ERROR(apply_model(config, &s));
  return s.resolved();
}

std::string sim_command_line(const sim::Scenario& s) {
  std::string line = fmt::format(
      "swarm sim --peers {} --stages {} --trainers {} --in-flight {} --microbatch {} --seq-len {} --d-model {} "
      "--throughput {} --backward-cost {} --last-stage-cost {} --compute-jitter {} --latency-ms {} "
      "--bandwidth-mbps {} --trainer-bandwidth-mbps {} --trainer-latency-ms {} --activation-bytes {} "
      "--activation-gradient-bytes {} --token-bytes {} --stage-params {} --gradient-bytes {} --hops {} --rounds {} "
      "--forward-hold {} --round-wait {} --global-batch {} --seconds 120 --sample-every 6 --seed 1 --out sim.jsonl",
      s.peers, s.stages, s.trainers, s.in_flight, s.microbatch, s.seq_len, s.d_model, s.throughput.to_string(),
      s.backward_cost, s.last_stage_cost, s.compute_jitter, s.latency_ms.to_string(), s.bandwidth_mbps.to_string(),
      s.trainer_bandwidth_mbps, s.trainer_latency_ms, s.activation_bytes, s.activation_gradient_bytes, s.token_bytes,
      s.stage_params, s.gradient_bytes, sim::hop_mode_name(s.hops), sim::round_trigger_name(s.rounds), s.forward_hold,
      s.round_wait, s.global_batch.target_samples);
  if (!s.rebalance) line += " --no-rebalance";
  return line;
}

Result<SimulatedStep> simulated_step(const nlohmann::json& config, double seconds, int seeds) {
  SWARM_ASSIGN_OR_RETURN(sim::Scenario s, scenario_of_run(config));
  SWARM_ASSIGN_OR_RETURN(int64_t per_step, field<int64_t>(config, "microbatches_per_step"));
  if (seeds < 1) return invalid_argument("the simulator needs at least one seed, got {}", seeds);
  s.seconds = seconds;
  s.sample_every = seconds / 20;
  SimulatedStep step;
  step.command = sim_command_line(s);
  step.step_min = std::numeric_limits<double>::infinity();
  for (int seed = 1; seed <= seeds; ++seed) {
    s.seed = static_cast<uint64_t>(seed);  // the routers' draws
    std::ostringstream lines;  // the time series is not kept
    SWARM_ASSIGN_OR_RETURN(sim::Summary summary, sim::simulate(s, lines));
    if (!(summary.throughput_end > 0)) return failed_precondition("the simulated run completed no microbatch at its end");
    const double seconds_per_step = static_cast<double>(per_step * s.microbatch) / summary.throughput_end;
    step.step_seconds += seconds_per_step / seeds;
    step.step_min = std::min(step.step_min, seconds_per_step);
    step.step_max = std::max(step.step_max, seconds_per_step);
    step.completed += summary.microbatches_completed;
    step.trainer_up_bytes += summary.trainer_up_bytes / static_cast<double>(std::max<int64_t>(1, summary.microbatches_started)) / seeds;
    step.trainer_down_bytes +=
        summary.trainer_down_bytes / static_cast<double>(std::max<int64_t>(1, summary.microbatches_completed)) / seeds;
  }
  return step;
}

}  // namespace swarm::apps
