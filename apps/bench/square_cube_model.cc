#include "apps/bench/square_cube_model.h"

#include "models/gpt/config.h"

#include <algorithm>
#include <cmath>

namespace swarm::apps {

double uplink_seconds(const MicrobatchCost& cost, const LinkParams& link) {
  if (link.bytes_per_second <= 0) return 0;
  return static_cast<double>(cost.forward_request_bytes + cost.backward_request_bytes) / link.bytes_per_second;
}

double downlink_seconds(const MicrobatchCost& cost, const LinkParams& link) {
  if (link.bytes_per_second <= 0) return 0;
  return static_cast<double>(cost.forward_reply_bytes + cost.backward_reply_bytes) / link.bytes_per_second;
}

double round_seconds(const MicrobatchCost& cost, const LinkParams& link) {
  return uplink_seconds(cost, link) + downlink_seconds(cost, link) + 4 * link.one_way_latency_s +
         cost.compute_s();
}

Prediction predict(const MicrobatchCost& cost, const LinkParams& link, int in_flight) {
  struct Server {
    double seconds;
    std::string_view name;
  };
  const Server servers[] = {{cost.compute_s(), "compute"},
                            {uplink_seconds(cost, link), "uplink"},
                            {downlink_seconds(cost, link), "downlink"}};
  const Server slowest = *std::max_element(std::begin(servers), std::end(servers),
                                           [](const Server& a, const Server& b) { return a.seconds < b.seconds; });
  Prediction p;
  p.round_s = round_seconds(cost, link);
  if (p.round_s <= 0) return p;
  const double by_round = std::max(in_flight, 1) / p.round_s;
  const double by_server = slowest.seconds > 0 ? 1.0 / slowest.seconds : by_round;
  p.microbatches_per_s = std::min(by_round, by_server);
  p.bound = by_round < by_server ? std::string_view("in-flight") : slowest.name;
  p.utilization = std::min(1.0, p.microbatches_per_s * cost.compute_s());
  return p;
}

int in_flight_to_cover(const MicrobatchCost& cost, const LinkParams& link, int margin) {
  const double slowest = std::max({cost.compute_s(), uplink_seconds(cost, link), downlink_seconds(cost, link)});
  if (slowest <= 0) return std::max(1, margin);
  return std::max(1, static_cast<int>(std::ceil(1.25 * round_seconds(cost, link) / slowest)) + std::max(0, margin));
}

double gpt_block_forward_flops_per_token(int64_t d_model, int64_t seq, int64_t layers) {
  return gpt::block_forward_flops_per_token(d_model, seq, layers);
}

double projection_forward_flops_per_token(int64_t d_model, int64_t k) {
  const double d = static_cast<double>(d_model);
  return 2.0 * d * (d / static_cast<double>(k));
}

}  // namespace swarm::apps
