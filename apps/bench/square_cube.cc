#include "apps/bench/square_cube.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include <fmt/core.h>

#include "apps/bench/busy_timed_stage.h"
#include "apps/bench/square_cube_report.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/emulated/emulated_compute_stage.h"
#include "models/gpt/gpt_stage.h"
#include "swarm/compression/codecs.h"
#include "swarm/peer/replica.h"
#include "swarm/peer/stage_service.h"
#include "swarm/protocol/stage_protocol.h"
#include "swarm/protocol/tensor_codec.h"
#include "swarm/protocol/validating_handler.h"
#include "transports/netem/netem_transport.h"
#include "transports/zmq/zmq_transport.h"

namespace swarm::apps {
namespace {

using Codecs = compression::StandardCodecs;
using SteadyClock = std::chrono::steady_clock;
using Link = NetemTransport<ZmqTransport>;

constexpr double kCallSeconds = 300;  // no call of a working point comes near it

double seconds_since(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

int64_t boundary_width(const PointSpec& spec) {
  return spec.variant.bottleneck_k > 0 ? spec.d_model / spec.variant.bottleneck_k : spec.d_model;
}

Tensor random_tensor(int64_t rows, int64_t seq, int64_t width, uint32_t seed) {
  Tensor t = *Tensor::empty(Shape{rows, seq, width}, DType::f32);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : t.span<float>()) v = normal(rng);
  return t;
}

// The stage of one point and how its compute time is known.
template <Stage S>
struct PointStage {
  S stage;
  double forward_s = 0, backward_s = 0;  // per microbatch
};

Result<PointStage<emulated::EmulatedComputeStage>> emulated_stage(const SquareCubeOptions& o, const PointSpec& spec) {
  const int64_t width = boundary_width(spec);
  double forward = gpt_block_forward_flops_per_token(spec.d_model, o.seq, o.layers);
  // A bottleneck adds the up-projection in front of the stage and the down-projection after it.
  if (spec.variant.bottleneck_k > 0) forward += 2 * projection_forward_flops_per_token(spec.d_model, spec.variant.bottleneck_k);
  SWARM_ASSIGN_OR_RETURN(auto stage, emulated::EmulatedComputeStage::create(
                                         {width, width, forward, 2 * forward, o.flops_per_second}));
  const double tokens = static_cast<double>(o.microbatch) * o.seq;
  return PointStage<emulated::EmulatedComputeStage>{std::move(stage), forward * tokens / o.flops_per_second,
                                                    2 * forward * tokens / o.flops_per_second};
}

// A middle stage of a GPT (no embedding, no head) on the CPU backend; with a
// bottleneck at both its cuts, so it takes and sends d/k wide tensors.
Result<gpt::GptStage<CpuBackend>> real_gpt_stage(const SquareCubeOptions& o, const PointSpec& spec) {
  gpt::GptConfig config;
  if (spec.variant.bottleneck_k > 0) {
    config.boundaries = {gpt::BoundaryLayer{gpt::BoundaryKind::bottleneck, spec.variant.bottleneck_k}};
  }
  config.d_model = static_cast<int>(spec.d_model);
  config.n_heads = std::max(1, config.d_model / 64);
  config.n_layers = 3 * o.real_layers;
  config.max_seq_len = o.seq;
  return gpt::GptStage<CpuBackend>::create(config, {1, 3, o.real_layers, 2 * o.real_layers}, /*seed=*/1);
}

// The real stage's compute per microbatch without the network, to choose how
// many microbatches to keep in flight: every forward, then every backward, so a
// backward finds its forward parked only when few are in flight.
template <Stage S>
Status calibrate(S& stage, const SquareCubeOptions& o, int64_t width, int in_flight, PointStage<S>* out) {
  std::vector<Tensor> inputs;
  for (int i = 0; i < in_flight; ++i) inputs.push_back(random_tensor(o.microbatch, o.seq, width, 100 + i));
  const Tensor grad = random_tensor(o.microbatch, o.seq, width, 7);
  for (int round = 0; round < 2; ++round) {  // the first warms the caches
    const auto start = SteadyClock::now();
    for (const Tensor& x : inputs) SWARM_RETURN_IF_ERROR(stage.forward(x, nullptr).status());
    const double forward = seconds_since(start);
    const auto back = SteadyClock::now();
    for (const Tensor& x : inputs) SWARM_RETURN_IF_ERROR(stage.backward(x, grad, nullptr).status());
    out->forward_s = forward / in_flight;
    out->backward_s = seconds_since(back) / in_flight;
  }
  return stage.zero_grad();
}

// The trainer's side of one point: requests built once (every microbatch sends
// the same bytes under its own id) and the exact sizes the prediction uses.
struct Traffic {
  wire::EncodedTensor input, grad_output;
  MicrobatchCost bytes;  // the byte fields only
};

Result<Traffic> traffic_for(const SquareCubeOptions& o, int64_t width, CodecId codec) {
  Traffic t;
  const Tensor x = random_tensor(o.microbatch, o.seq, width, 1);
  SWARM_ASSIGN_OR_RETURN(t.input, protocol::encode_floats<Codecs>(x, codec));
  SWARM_ASSIGN_OR_RETURN(t.grad_output, protocol::encode_floats<Codecs>(random_tensor(o.microbatch, o.seq, width, 2), codec));
  protocol::StageRequest forward{wire::MessageKind::forward, 1, t.input, std::nullopt, std::nullopt, 1, 1};
  protocol::StageRequest backward{wire::MessageKind::backward, 1, t.input, t.grad_output, std::nullopt, 1, 1};
  SWARM_ASSIGN_OR_RETURN(wire::Frames f, protocol::encode_request(forward, 0, codec));
  SWARM_ASSIGN_OR_RETURN(wire::Frames b, protocol::encode_request(backward, 0, codec));
  SWARM_ASSIGN_OR_RETURN(wire::Frames reply, protocol::encode_reply(1, 0, protocol::StageReply{t.input, std::nullopt}));
  t.bytes.forward_request_bytes = frame_bytes(f);
  t.bytes.backward_request_bytes = frame_bytes(b);
  t.bytes.forward_reply_bytes = t.bytes.backward_reply_bytes = frame_bytes(reply);
  return t;
}

// K threads, each running microbatches (forward, then backward) back to back,
// until `warmup + measured` have completed; the window between the two counts
// is the measurement.
class Driver {
 public:
  Driver(Link::client_type* client, const Traffic* traffic, CodecId codec, const std::atomic<int64_t>* busy_ns)
      : client_(client), traffic_(traffic), codec_(codec), busy_ns_(busy_ns) {}

  struct Window {
    double wall_s = 0, busy_s = 0;
    // Over the whole run, warm-up and drain included: every microbatch started
    // has completed once run() returns, so these divide exactly.
    uint64_t bytes = 0;
    int64_t completed = 0;
  };

  Result<Window> run(int in_flight, int64_t warmup, int64_t measured) {
    warmup_ = warmup;
    target_ = warmup + measured;
    std::vector<std::thread> threads;
    for (int i = 0; i < in_flight; ++i) threads.emplace_back([this] { loop(); });
    for (std::thread& t : threads) t.join();
    if (!error_.is_ok()) return error_;
    return Window{std::chrono::duration<double>(end_.time - start_.time).count(),
                  static_cast<double>(end_.busy_ns - start_.busy_ns) * 1e-9, mark().bytes, completed_};
  }

 private:
  struct Mark {
    SteadyClock::time_point time;
    int64_t busy_ns = 0;
    uint64_t bytes = 0;
  };

  void loop() {
    while (!stop_.load()) {
      Status status = one_microbatch(next_id_.fetch_add(1));
      std::lock_guard lock(mu_);
      if (!status.is_ok()) {
        if (error_.is_ok()) error_ = status;
        stop_ = true;
        return;
      }
      ++completed_;
      if (completed_ == warmup_) start_ = mark();
      if (completed_ == target_) {
        end_ = mark();
        stop_ = true;
      }
    }
  }

  Mark mark() const {
    const TransportCounters& c = client_->counters();
    return {SteadyClock::now(), busy_ns_->load(), c.bytes_sent.load() + c.bytes_received.load()};
  }

  Status one_microbatch(uint64_t id) {
    SWARM_RETURN_IF_ERROR(call(wire::MessageKind::forward, id, std::nullopt));
    return call(wire::MessageKind::backward, id, traffic_->grad_output);
  }

  Status call(wire::MessageKind kind, uint64_t id, std::optional<wire::EncodedTensor> grad) {
    const int64_t deadline_ms = protocol::unix_millis_after(protocol::unix_millis_now(), kCallSeconds);
    protocol::StageRequest request{kind, id, traffic_->input, std::move(grad), std::nullopt, id, deadline_ms};
    SWARM_ASSIGN_OR_RETURN(wire::Frames frames, protocol::encode_request(request, 0, codec_));
    const auto deadline = Clock::now() + std::chrono::seconds(static_cast<int>(kCallSeconds));
    SWARM_ASSIGN_OR_RETURN(wire::Frames reply, client_->call(std::move(frames), deadline).get());
    return protocol::parse_reply(reply, wire::Limits{}, /*has_loss=*/false).status();
  }

  Link::client_type* client_;
  const Traffic* traffic_;
  CodecId codec_;
  const std::atomic<int64_t>* busy_ns_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  int64_t completed_ = 0, warmup_ = 0, target_ = 0;
  Mark start_, end_;
  Status error_ = Status::ok();
};

LinkParams link_of(const SquareCubeOptions& o, const PointSpec& spec) {
  return LinkParams{o.bandwidth_mbps * 1e6 / 8, spec.latency_ms * 1e-3};
}

netem::LinkSpec netem_link(const LinkParams& link) {
  return {.bandwidth_bytes_per_s = link.bytes_per_second,
          .latency = std::chrono::duration_cast<netem::Duration>(std::chrono::duration<double>(link.one_way_latency_s))};
}

// The traffic's bytes with the stage's compute time.
template <Stage S>
MicrobatchCost cost_of(const Traffic& traffic, const PointStage<S>& point) {
  MicrobatchCost cost = traffic.bytes;
  cost.forward_compute_s = point.forward_s;
  cost.backward_compute_s = point.backward_s;
  return cost;
}

int in_flight_for(const SquareCubeOptions& o, const PointSpec& spec, const MicrobatchCost& cost) {
  return std::min(o.max_in_flight, in_flight_to_cover(cost, link_of(o, spec)));
}

// Serves `stage` as a peer does and drives it over the emulated link.
template <Stage S>
Result<PointResult> measure(const SquareCubeOptions& o, const PointSpec& spec, PointStage<S> point,
                            const Traffic& traffic, int in_flight) {
  auto busy_ns = std::make_shared<std::atomic<int64_t>>(0);
  PointResult r;
  r.spec = spec;
  r.layers = spec.real_compute ? o.real_layers : o.layers;
  r.cost = cost_of(traffic, point);
  const LinkParams link = link_of(o, spec);
  r.in_flight = in_flight;
  r.prediction = predict(r.cost, link, in_flight);
  const double tokens = static_cast<double>(o.microbatch) * o.seq;
  r.predicted_tokens_per_s = r.prediction.microbatches_per_s * tokens;

  using Timed = BusyTimedStage<S>;
  auto replica = std::make_shared<Replica<Timed>>(0, Timed(std::move(point.stage), busy_ns), optim::OptimizerConfig{});
  StatsBoard stats([](PeerStats&) {});
  StageService<Timed, Codecs> service(StageServiceOptions{.codec = spec.variant.codec}, replica, &stats,
                                      {[] { return Status::ok(); }, [](int64_t) {}});
  SWARM_ASSIGN_OR_RETURN(auto server, ZmqTransport::bind("tcp://127.0.0.1:*", ServerOptions{}));
  SWARM_RETURN_IF_ERROR(server.serve(validating_handler(
      wire::Limits{}, std::make_shared<wire::ValidationCounters>(),
      [&](const PeerIdentity& from, const wire::DecodedMessage& m) { return service.handle(from, m); })));
  NetemOptions netem{.up = netem_link(link), .down = netem_link(link)};
  SWARM_ASSIGN_OR_RETURN(auto client, Link::connect(server.address(), NetemClientOptions(netem)));

  const double rate = std::max(r.prediction.microbatches_per_s, 1e-3);
  r.microbatches = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(o.seconds_per_point * rate)), 20, 4000);
  Driver driver(&client, &traffic, spec.variant.codec, busy_ns.get());
  SWARM_ASSIGN_OR_RETURN(Driver::Window w, driver.run(in_flight, in_flight, r.microbatches));
  r.wall_s = w.wall_s;
  r.busy_s = w.busy_s;
  r.utilization = w.wall_s > 0 ? w.busy_s / w.wall_s : 0;
  r.tokens_per_s = w.wall_s > 0 ? static_cast<double>(r.microbatches) * tokens / w.wall_s : 0;
  r.wire_bytes_per_token = static_cast<double>(w.bytes) / (static_cast<double>(w.completed) * tokens);
  if (spec.real_compute && r.cost.compute_s() > 0) {
    const double scale = (w.busy_s / static_cast<double>(r.microbatches)) / r.cost.compute_s();
    r.cost.forward_compute_s *= scale;
    r.cost.backward_compute_s *= scale;
    r.prediction = predict(r.cost, link, in_flight);
    r.predicted_tokens_per_s = r.prediction.microbatches_per_s * tokens;
  }
  return r;
}

}  // namespace

double PointResult::relative_error() const {
  return prediction.utilization > 0 ? utilization / prediction.utilization - 1 : 0;
}

std::vector<BoundaryVariant> default_variants(int bottleneck_k) {
  return {{"none", CodecId::none, 0},
          {"fp16", CodecId::fp16, 0},
          {"8bit", CodecId::blockwise8, 0},
          {fmt::format("8bit+bottleneck{}", bottleneck_k), CodecId::blockwise8, bottleneck_k}};
}

std::vector<PointSpec> plan_points(const SquareCubeOptions& o) {
  const std::vector<BoundaryVariant> variants = o.variants.empty() ? default_variants(o.bottleneck_k) : o.variants;
  std::vector<PointSpec> points;
  for (int64_t d : o.widths) {
    for (const BoundaryVariant& v : variants) points.push_back({"width", d, o.latency_ms, v, false});
  }
  const int64_t largest = o.widths.empty() ? 0 : *std::max_element(o.widths.begin(), o.widths.end());
  for (double latency : o.latencies_ms) {
    for (const BoundaryVariant& v : variants) points.push_back({"latency", largest, latency, v, false});
  }
  for (int64_t d : o.real_widths) {
    for (const BoundaryVariant& v : variants) points.push_back({"real", d, o.latency_ms, v, true});
  }
  return points;
}

Status validate(const SquareCubeOptions& o) {
  if (o.out.empty()) return invalid_argument("--out is required");
  if (o.widths.empty()) return invalid_argument("--widths is empty");
  for (int64_t d : o.widths) {
    if (d <= 0 || d % 64 != 0 || d > 65536) return invalid_argument("--widths: {} is not a multiple of 64 in (0, 65536]", d);
    if (o.bottleneck_k > 0 && d % o.bottleneck_k != 0) {
      return invalid_argument("--widths: {} is not divisible by --bottleneck-k {}", d, o.bottleneck_k);
    }
  }
  for (int64_t d : o.real_widths) {
    if (d <= 0 || d % 64 != 0 || d > 4096) return invalid_argument("--real-widths: {} is not a multiple of 64 in (0, 4096]", d);
    if (d % o.bottleneck_k != 0) return invalid_argument("--real-widths: {} is not divisible by --bottleneck-k", d);
  }
  for (double l : o.latencies_ms) {
    if (!(l >= 0 && l <= 10000)) return invalid_argument("--latencies-ms: {} is outside [0, 10000]", l);
  }
  if (!(o.bandwidth_mbps > 0)) return invalid_argument("--bandwidth-mbps must be > 0");
  if (!(o.latency_ms >= 0 && o.latency_ms <= 10000)) return invalid_argument("--latency-ms must be in [0, 10000]");
  if (!(o.flops_per_second > 0)) return invalid_argument("--flops must be > 0");
  if (o.layers <= 0 || o.real_layers <= 0) return invalid_argument("--layers and --real-layers must be positive");
  if (o.seq <= 0 || o.seq > 8192 || o.microbatch <= 0 || o.microbatch > 256) {
    return invalid_argument("--seq must be in [1, 8192] and --microbatch in [1, 256]");
  }
  if (o.bottleneck_k != 2 && o.bottleneck_k != 4) return invalid_argument("--bottleneck-k must be 2 or 4");
  if (!(o.seconds_per_point > 0)) return invalid_argument("--seconds-per-point must be > 0");
  if (o.max_in_flight <= 0 || o.max_in_flight > 512) return invalid_argument("--max-in-flight must be in [1, 512]");
  return Status::ok();
}

Result<PointResult> run_point(const SquareCubeOptions& o, const PointSpec& spec) {
  const int64_t width = boundary_width(spec);
  SWARM_ASSIGN_OR_RETURN(Traffic traffic, traffic_for(o, width, spec.variant.codec));
  if (!spec.real_compute) {
    SWARM_ASSIGN_OR_RETURN(auto point, emulated_stage(o, spec));
    const int in_flight = in_flight_for(o, spec, cost_of(traffic, point));
    return measure(o, spec, std::move(point), traffic, in_flight);
  }
  SWARM_ASSIGN_OR_RETURN(auto gpt, real_gpt_stage(o, spec));
  PointStage<gpt::GptStage<CpuBackend>> point{std::move(gpt)};
  // The compute time sets the in-flight count and the count sets whether a backward
  // finds its forward parked: calibrate with a guess, then again with the count it gives.
  SWARM_RETURN_IF_ERROR(calibrate(point.stage, o, width, 2, &point));
  const int in_flight = in_flight_for(o, spec, cost_of(traffic, point));
  SWARM_RETURN_IF_ERROR(calibrate(point.stage, o, width, in_flight, &point));
  return measure(o, spec, std::move(point), traffic, in_flight);
}

Status run_square_cube(const SquareCubeOptions& o, const std::function<void(const std::string&)>& progress) {
  SWARM_RETURN_IF_ERROR(validate(o));
  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  if (ec) return unavailable("cannot create {}: {}", o.out, ec.message());
  const std::vector<PointSpec> points = plan_points(o);
  std::vector<PointResult> results;
  for (size_t i = 0; i < points.size(); ++i) {
    const PointSpec& p = points[i];
    auto r = run_point(o, p);
    if (!r.is_ok()) return r.status().with_context(fmt::format("point d={} {} {} ms", p.d_model, p.variant.label, p.latency_ms));
    results.push_back(*r);
    progress(fmt::format("[{}/{}] {:7} d={:<5} {:>5.0f} ms {:<17} {:8} K={:<2} util {:5.1f}% (predicted {:5.1f}%, {:+.1f}%) "
                         "{:9.0f} tok/s  bound {}",
                         i + 1, points.size(), p.sweep, p.d_model, p.latency_ms, p.variant.label,
                         p.real_compute ? "real" : "emulated", r->in_flight, 100 * r->utilization,
                         100 * r->prediction.utilization, 100 * r->relative_error(), r->tokens_per_s, r->prediction.bound));
    SWARM_RETURN_IF_ERROR(write_square_cube_outputs(o, results));  // a crash later keeps what was measured
  }
  return Status::ok();
}

}  // namespace swarm::apps
