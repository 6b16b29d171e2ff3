// square_cube_report: the square-cube experiment's outputs, rewritten after
// every point so an interrupted run keeps what it measured:
//   square_cube.json             every point, measured and predicted, labelled real or emulated
//   square_cube.md               the same as tables
//   utilization_vs_width.svg     the law: measured (solid) against predicted (dashed), per boundary variant
//   tokens_per_s_vs_width.svg
//   utilization_vs_latency.svg   the latency sweep at the largest width
//   real_compute.svg             the points computed by a real GPT stage on this CPU
#pragma once

#include <string>
#include <vector>

#include "apps/bench/square_cube.h"
#include "swarm/core/status.h"

namespace swarm::apps {

std::string square_cube_json(const SquareCubeOptions& options, const std::vector<PointResult>& results);
std::string square_cube_markdown(const SquareCubeOptions& options, const std::vector<PointResult>& results);
Status write_square_cube_outputs(const SquareCubeOptions& options, const std::vector<PointResult>& results);

}  // namespace swarm::apps
