#include "apps/bench/square_cube_report.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "apps/bench/svg_chart.h"

namespace swarm::apps {
namespace {

nlohmann::json options_json(const SquareCubeOptions& o) {
  return {{"bandwidth_mbps", o.bandwidth_mbps}, {"latency_ms", o.latency_ms}, {"flops_per_second", o.flops_per_second},
          {"layers_per_stage", o.layers},     {"real_layers", o.real_layers},  {"seq", o.seq},
          {"microbatch", o.microbatch},       {"bottleneck_k", o.bottleneck_k}, {"seconds_per_point", o.seconds_per_point}};
}

nlohmann::json point_json(const PointResult& r) {
  const MicrobatchCost& c = r.cost;
  return {{"sweep", r.spec.sweep},
          {"d_model", r.spec.d_model},
          {"latency_ms", r.spec.latency_ms},
          {"variant", r.spec.variant.label},
          {"codec", std::string(codec_name(r.spec.variant.codec))},
          {"bottleneck_k", r.spec.variant.bottleneck_k},
          {"compute", r.spec.real_compute ? "real" : "emulated"},
          {"layers", r.layers},
          {"in_flight", r.in_flight},
          {"microbatches", r.microbatches},
          {"wall_s", r.wall_s},
          {"busy_s", r.busy_s},
          {"utilization", r.utilization},
          {"tokens_per_s", r.tokens_per_s},
          {"wire_bytes_per_token", r.wire_bytes_per_token},
          {"predicted_utilization", r.prediction.utilization},
          {"predicted_tokens_per_s", r.predicted_tokens_per_s},
          {"relative_error", r.relative_error()},
          {"bound", std::string(r.prediction.bound)},
          {"compute_s_per_microbatch", c.compute_s()},
          {"request_bytes_per_microbatch", c.forward_request_bytes + c.backward_request_bytes},
          {"reply_bytes_per_microbatch", c.forward_reply_bytes + c.backward_reply_bytes}};
}

// One chart of `y` against `x` over the results `keep` selects: per variant, the
// measurement solid and (when `predicted` is given) the prediction dashed.
template <typename Keep, typename X, typename Y, typename P>
ChartSpec chart_of(const std::vector<PointResult>& results, Keep keep, X x, Y y, P predicted, ChartSpec chart) {
  std::map<std::string, int> color;
  std::vector<std::string> order;
  std::map<std::string, ChartSeries> measured, model;
  for (const PointResult& r : results) {
    if (!keep(r)) continue;
    const std::string& v = r.spec.variant.label;
    if (!color.count(v)) {
      color[v] = static_cast<int>(color.size());
      order.push_back(v);
    }
    measured[v].points.emplace_back(x(r), y(r));
    model[v].points.emplace_back(x(r), predicted(r));
  }
  for (const std::string& v : order) {
    chart.series.push_back({v + " measured", measured[v].points, false, true, color[v]});
    chart.series.push_back({v + " predicted", model[v].points, true, false, color[v]});
  }
  return chart;
}

ChartSpec percent_chart(std::string title, std::string x_label, bool log2_x) {
  return ChartSpec{std::move(title), std::move(x_label), "compute utilization, %", log2_x, 0.0, 100.0, {}};
}

Status write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::trunc);
  f << text;
  f.close();
  if (!f) return unavailable("cannot write {}", path.string());
  return Status::ok();
}

std::string table(const std::vector<PointResult>& results, const std::string& sweep) {
  std::string out =
      "| d_model | latency ms | boundary | compute | in flight | utilization | predicted | error | tokens/s | "
      "predicted tokens/s | wire bytes/token | bound |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const PointResult& r : results) {
    if (r.spec.sweep != sweep) continue;
    out += fmt::format("| {} | {:.0f} | {} | {} | {} | {:.1f}% | {:.1f}% | {:+.1f}% | {:.0f} | {:.0f} | {:.0f} | {} |\n",
                       r.spec.d_model, r.spec.latency_ms, r.spec.variant.label, r.spec.real_compute ? "real" : "emulated",
                       r.in_flight, 100 * r.utilization, 100 * r.prediction.utilization, 100 * r.relative_error(),
                       r.tokens_per_s, r.predicted_tokens_per_s, r.wire_bytes_per_token, r.prediction.bound);
  }
  return out;
}

}  // namespace

std::string square_cube_json(const SquareCubeOptions& o, const std::vector<PointResult>& results) {
  nlohmann::json points = nlohmann::json::array();
  for (const PointResult& r : results) points.push_back(point_json(r));
  return nlohmann::json{{"options", options_json(o)}, {"points", points}}.dump(2) + "\n";
}

std::string square_cube_markdown(const SquareCubeOptions& o, const std::vector<PointResult>& results) {
  std::string out = fmt::format(
      "# Square-cube experiment\n\nOne stage of {} layers (real-compute points: {}), {} × {} tokens per microbatch, "
      "over the netem transport at {} Mb/s each way. Emulated compute runs at {:.3g} FLOP/s. Utilization is the "
      "stage's busy time over wall time, measured after a warm-up; the prediction is square_cube_model's.\n\n",
      o.layers, o.real_layers, o.microbatch, o.seq, o.bandwidth_mbps, o.flops_per_second);
  out += fmt::format("## Width sweep, {} ms one-way\n\n{}\n", o.latency_ms, table(results, "width"));
  out += fmt::format("## Latency sweep at the largest width\n\n{}\n", table(results, "latency"));
  out += fmt::format("## Real compute on this CPU\n\n{}", table(results, "real"));
  return out;
}

Status write_square_cube_outputs(const SquareCubeOptions& o, const std::vector<PointResult>& results) {
  const std::filesystem::path dir(o.out);
  SWARM_RETURN_IF_ERROR(write_file(dir / "square_cube.json", square_cube_json(o, results)));
  SWARM_RETURN_IF_ERROR(write_file(dir / "square_cube.md", square_cube_markdown(o, results)));
  const auto width = [](const PointResult& r) { return static_cast<double>(r.spec.d_model); };
  const auto util = [](const PointResult& r) { return 100 * r.utilization; };
  const auto util_predicted = [](const PointResult& r) { return 100 * r.prediction.utilization; };
  const auto in_sweep = [](const char* sweep) { return [sweep](const PointResult& r) { return r.spec.sweep == sweep; }; };
  const std::string link = fmt::format("{} Mb/s", o.bandwidth_mbps);
  const ChartSpec charts[] = {
      chart_of(results, in_sweep("width"), width, util, util_predicted,
               percent_chart(fmt::format("Stage utilization, {}, {} ms one-way (emulated compute)", link, o.latency_ms),
                             "d_model", true)),
      chart_of(results, in_sweep("width"), width, [](const PointResult& r) { return r.tokens_per_s; },
               [](const PointResult& r) { return r.predicted_tokens_per_s; },
               ChartSpec{fmt::format("Tokens/s through one stage, {}", link), "d_model", "tokens/s", true, {}, {}, {}}),
      chart_of(results, in_sweep("latency"), [](const PointResult& r) { return r.spec.latency_ms; }, util,
               util_predicted, percent_chart("Utilization against one-way latency, largest width", "one-way latency, ms", false)),
      chart_of(results, in_sweep("real"), width, util, util_predicted,
               percent_chart("Real compute on this CPU (GPT stage, CPU backend)", "d_model", true)),
  };

  const char* names[] = {"utilization_vs_width.svg", "tokens_per_s_vs_width.svg", "utilization_vs_latency.svg",
                         "real_compute.svg"};
  for (size_t i = 0; i < std::size(charts); ++i) SWARM_RETURN_IF_ERROR(write_file(dir / names[i], render_svg(charts[i])));
  return Status::ok();
}

}  // namespace swarm::apps
