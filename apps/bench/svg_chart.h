// svg_chart: line charts as standalone SVG text, for experiment outputs that a
// browser or an image viewer opens without any plotting stack installed.
//
// Deliberately small: linear or log-2 x, linear y, solid or dashed lines with
// optional markers, a legend. Anything richer belongs in a plotting library.
//
//   ChartSpec chart{.title = "utilization", .x_label = "d_model", .y_label = "%", .log2_x = true};
//   chart.series.push_back({.label = "8bit", .points = {{256, 7}, {4096, 98}}});
//   std::string svg = render_svg(chart);
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace swarm::apps {

struct ChartSeries {
  std::string label;
  std::vector<std::pair<double, double>> points;  // drawn in the order given
  bool dashed = false;
  bool markers = true;
  int color = -1;  // index into the palette; -1: the series' position
};

struct ChartSpec {
  std::string title;
  std::string x_label;
  std::string y_label;
  bool log2_x = false;             // x values must then be > 0
  std::optional<double> y_min, y_max;  // default: the data's range, with 0 included
  std::vector<ChartSeries> series;
};

// Text in labels is XML-escaped. Points with non-finite coordinates (or x <= 0
// on a log axis) are left out.
std::string render_svg(const ChartSpec& chart);

}  // namespace swarm::apps
