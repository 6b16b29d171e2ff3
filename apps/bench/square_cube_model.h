// square_cube_model: the prediction the square-cube experiment is measured
// against. Pure: sizes and rates in, rates out; no clock, no I/O.
//
// The law (SWARM §3.1): a stage of L Transformer layers of width d costs
// O(L·d²) FLOPs per token but sends O(d) values per token, so the wider the
// stage, the more compute hides each byte. With the link's bandwidth and
// latency, one stage served over one link is a closed pipeline of K
// microbatches in flight through three servers that each hold one at a time:
// the uplink (requests), the device (compute) and the downlink (replies). Its
// throughput is the slowest of them, unless K is too small to cover one
// microbatch's whole round (every transfer, every latency and the compute),
// when it is K per round. Utilization is throughput × compute per microbatch.
//
//   MicrobatchCost cost{.forward_compute_s = 0.1, .backward_compute_s = 0.2,
//                       .forward_request_bytes = 4 << 20, ...};
//   Prediction p = predict(cost, LinkParams{25e6, 0.05}, in_flight_to_cover(cost, link));
//   p.utilization;  // in [0, 1]
#pragma once

#include <cstdint>
#include <string_view>

namespace swarm::apps {

struct LinkParams {
  double bytes_per_second = 25e6;  // each direction; 200 Mb/s
  double one_way_latency_s = 0.05;
};

// One microbatch's forward and backward through one stage, as the trainer
// sends it: the forward request carries the input, the backward request the
// input again (any peer may serve a backward, so it recomputes from it) and the
// output gradient; the replies carry the output and the input gradient.
struct MicrobatchCost {
  double forward_compute_s = 0;
  double backward_compute_s = 0;
  uint64_t forward_request_bytes = 0;
  uint64_t forward_reply_bytes = 0;
  uint64_t backward_request_bytes = 0;
  uint64_t backward_reply_bytes = 0;
  double compute_s() const { return forward_compute_s + backward_compute_s; }
};

struct Prediction {
  double microbatches_per_s = 0;
  double utilization = 0;        // compute time over wall time
  double round_s = 0;            // one microbatch alone, start to end
  std::string_view bound;        // "compute", "uplink", "downlink" or "in-flight"
};

// What a microbatch costs to send and compute, each server alone.
double uplink_seconds(const MicrobatchCost& cost, const LinkParams& link);
double downlink_seconds(const MicrobatchCost& cost, const LinkParams& link);
// Forward request, latency, compute, reply, latency; then the same for the backward.
double round_seconds(const MicrobatchCost& cost, const LinkParams& link);

Prediction predict(const MicrobatchCost& cost, const LinkParams& link, int in_flight);

// The fewest microbatches in flight that keep the slowest server busy, with a
// quarter more plus `margin` for what the model leaves out (threads waking,
// the transport's polling); at least 1.
int in_flight_to_cover(const MicrobatchCost& cost, const LinkParams& link, int margin = 2);

// FLOPs per token of one forward through `layers` GPT blocks of width d with
// causal attention over `seq` tokens: 24·d² for the four dense GEMMs (QKV, the
// projection and the 4d MLP, 2 FLOPs per multiply-add) and 4·seq·d for the
// scores and the weighted sum. The backward costs twice the forward.
double gpt_block_forward_flops_per_token(int64_t d_model, int64_t seq, int64_t layers);
// A boundary layer's projection between d and d/k, per token, forward.
double projection_forward_flops_per_token(int64_t d_model, int64_t k);

}  // namespace swarm::apps
