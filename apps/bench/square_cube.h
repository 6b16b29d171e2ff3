// square_cube: the square-cube experiment. One pipeline stage, served as a peer
// serves it (StageService over ZeroMQ, every request validated and decoded),
// called by a trainer-like driver through the netem transport at a WAN's
// bandwidth and latency, with enough microbatches in flight to cover the link.
// Each point measures the stage's compute utilization (its busy time over wall
// time) and tokens/s, next to square_cube_model's prediction.
//
// Widths this CPU cannot compute in time run on EmulatedComputeStage (a wait
// for FLOPs / rate, real tensors of the true size on the wire); widths listed
// in real_widths also run a real GptStage on the CPU backend. FLOPs do not
// predict a CPU's compute time (it shares two cores with the transport), so for
// those points the prediction takes the stage's busy time per microbatch
// measured in the same run, and tests only the network half of the model.
// Every point says which kind it is.
//
//   SquareCubeOptions options;           // 256..4096, 200 Mb/s, 50 ms, 25 TFLOP/s
//   options.out = "/tmp/sc";
//   SWARM_RETURN_IF_ERROR(run_square_cube(options, progress));  // square_cube.json, .md, .svg
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "apps/bench/square_cube_model.h"
#include "swarm/api/codec.h"
#include "swarm/core/status.h"

namespace swarm::apps {

// What crosses the boundary: a codec, optionally after a bottleneck of width d/k.
struct BoundaryVariant {
  std::string label;  // "none", "fp16", "8bit", "8bit+bottleneck4"
  CodecId codec = CodecId::none;
  int bottleneck_k = 0;  // 0: the full width crosses
};

struct SquareCubeOptions {
  std::vector<int64_t> widths{256, 512, 1024, 2048, 4096};
  std::vector<double> latencies_ms{0, 50, 100, 150, 200};  // the sweep at the largest width
  std::vector<BoundaryVariant> variants;                    // empty: none, fp16, 8bit, 8bit+bottleneck
  double bandwidth_mbps = 200;
  double latency_ms = 50;
  double flops_per_second = 25e12;  // emulated compute: a T4-class GPU
  int layers = 12;                  // per stage
  int seq = 512;
  int microbatch = 1;               // sequences
  int bottleneck_k = 4;
  std::vector<int64_t> real_widths{256, 512};
  int real_layers = 1;
  double seconds_per_point = 8;     // measured (at least 20 microbatches), after a warm-up of one round
  int max_in_flight = 128;
  std::string out;
};

struct PointSpec {
  std::string sweep;  // "width" or "latency"
  int64_t d_model = 0;
  double latency_ms = 0;
  BoundaryVariant variant;
  bool real_compute = false;
};

struct PointResult {
  PointSpec spec;
  int layers = 0;
  int in_flight = 0;
  int64_t microbatches = 0;  // measured, after the warm-up
  double wall_s = 0;
  double busy_s = 0;
  double utilization = 0;
  double tokens_per_s = 0;
  double wire_bytes_per_token = 0;  // both directions, as the client counted them, over the whole run
  MicrobatchCost cost;
  Prediction prediction;
  double predicted_tokens_per_s = 0;
  double relative_error() const;  // measured utilization / predicted - 1
};

// The default variants for options (none, fp16, 8bit, 8bit+bottleneck k).
std::vector<BoundaryVariant> default_variants(int bottleneck_k);
// Every point the options ask for, in run order.
std::vector<PointSpec> plan_points(const SquareCubeOptions& options);
Status validate(const SquareCubeOptions& options);

Result<PointResult> run_point(const SquareCubeOptions& options, const PointSpec& spec);

// Runs every point, writing square_cube.json, square_cube.md and the plots to
// options.out; `progress` gets a line per point.
Status run_square_cube(const SquareCubeOptions& options, const std::function<void(const std::string&)>& progress);

}  // namespace swarm::apps
