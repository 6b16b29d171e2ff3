// svg_chart: line charts as standalone SVG text, for experiment outputs that a
// browser or an image viewer opens without any plotting stack installed.
//
// Deliberately small: linear or log-2 x, linear y, solid or dashed lines with
// optional markers, vertical event markers, a legend. Anything richer belongs in
// a plotting library.
//
//   ChartSpec chart{.title = "utilization", .x_label = "d_model", .y_label = "%", .log2_x = true};
//   chart.series.push_back({.label = "8bit", .points = {{256, 7}, {4096, 98}}});
//   std::string svg = render_svg(chart);
#pragma once

#include <optional>
#include <string>
#include <string_view>
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

// A vertical dashed line across the plot at x (an event on a time axis). Markers of
// one group share a color and one legend entry; the label is the line's tooltip.
struct ChartMarker {
  double x = 0;
  std::string group;
  std::string label;
};

struct ChartSpec {
  std::string title;
  std::string x_label;
  std::string y_label;
  bool log2_x = false;             // x values must then be > 0
  std::optional<double> y_min, y_max;  // default: the data's range, with 0 included
  std::vector<ChartSeries> series;
};

// What a chart may add to its spec (a time axis, say): event markers, a given x
// range, ticks at round values, an id for the <svg> element.
struct ChartExtras {
  std::vector<ChartMarker> markers;    // drawn under the series, groups colored in order of appearance
  std::optional<double> x_min, x_max;  // default: the data's range, markers included
  // 0: a tick at each of the data's x values; N: about N intervals between ticks at
  // round values (1, 2 or 5 times a power of ten; N + 1 evenly spaced on a log axis).
  int x_ticks = 0;
  // 0: 6 ticks evenly spaced over the y range; N: about N intervals at round values,
  // the top of the range (unless y_max is given) raised to the next one.
  int y_ticks = 0;
  std::string id;  // the <svg> element's id, when not empty
};

// Text in labels is XML-escaped. Points with non-finite coordinates (or x <= 0
// on a log axis) are left out, and so are points and markers outside the x range. Each series
// is a <g class="series"> holding one <polyline>, each marker a <g class="marker">.
std::string render_svg(const ChartSpec& chart, const ChartExtras& extras = {});

// `text` safe inside an XML or HTML element or a quoted attribute.
std::string xml_escape(std::string_view text);

}  // namespace swarm::apps
