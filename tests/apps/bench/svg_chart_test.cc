// The SVG charts of experiment outputs: every series drawn as a polyline with
// its markers, text escaped, unplottable points left out; event markers, a given
// x range and evenly spaced ticks for time axes.
#include <cmath>
#include <string>

#include <doctest/doctest.h>

#include "apps/bench/svg_chart.h"

namespace swarm::apps {
namespace {

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST_CASE("each series is one polyline with a marker per point, dashed when asked") {
  ChartSpec chart{"t", "x", "y", false, {}, {}, {}};
  chart.series.push_back({"measured", {{1, 2}, {2, 4}, {3, 5}}, false, true, -1});
  chart.series.push_back({"predicted", {{1, 2}, {2, 3}}, true, false, -1});
  const std::string svg = render_svg(chart);
  CHECK(svg.rfind("<svg", 0) == 0);
  CHECK(count(svg, "<polyline") == 2);
  CHECK(count(svg, "<circle") == 3);
  CHECK(count(svg, "stroke-dasharray") == 2);  // the dashed line and its legend swatch
  CHECK(count(svg, ">measured<") == 1);
  CHECK(count(svg, ">predicted<") == 1);
}

TEST_CASE("labels are escaped and points a log axis cannot place are left out") {
  ChartSpec chart{"a < b & \"c\"", "d_model", "%", true, 0.0, 100.0, {}};
  chart.series.push_back({"<8bit>", {{0, 1}, {-4, 2}, {256, 3}, {512, std::nan("")}, {1024, 4}}, false, true, -1});
  const std::string svg = render_svg(chart);
  CHECK(svg.find("a &lt; b &amp; &quot;c&quot;") != std::string::npos);
  CHECK(svg.find("&lt;8bit&gt;") != std::string::npos);
  CHECK(svg.find("<8bit>") == std::string::npos);
  CHECK(count(svg, "<circle") == 2);  // 256 and 1024 only
  CHECK(svg.find("nan") == std::string::npos);
  CHECK(svg.find("inf") == std::string::npos);
}

TEST_CASE("an empty chart still renders a document") {
  const std::string svg = render_svg(ChartSpec{"empty", "x", "y", false, {}, {}, {}});
  CHECK(svg.find("</svg>") != std::string::npos);
  CHECK(count(svg, "<polyline") == 0);
}

TEST_CASE("event markers: a dashed line each, one legend entry per group, none outside the x range") {
  ChartSpec chart{"loss", "s", "nats", false, {}, {}, {}};
  chart.series.push_back({"train", {{0, 5}, {10, 3}, {20, 2}}, false, false, -1});
  ChartExtras extras;
  extras.markers = {{4, "chaos", "kill-peer s1p2 <stage 1>"}, {9, "peer lost", "s1p2"}, {12, "chaos", "restart"},
                    {35, "chaos", "after the end"}, {std::nan(""), "peer lost", "nowhere"}};
  extras.x_min = 0;
  extras.x_max = 20;
  extras.x_ticks = 4;
  extras.id = "plot-loss";
  const std::string svg = render_svg(chart, extras);
  CHECK(svg.find(R"(<svg xmlns="http://www.w3.org/2000/svg" id="plot-loss")") == 0);
  CHECK(count(svg, "<g class=\"marker\">") == 3);  // 35 lies past x_max, NaN nowhere
  CHECK(count(svg, "<g class=\"marker-legend\">") == 2);
  CHECK(count(svg, ">chaos<") == 1);
  CHECK(count(svg, ">peer lost<") == 1);
  CHECK(svg.find("<title>kill-peer s1p2 &lt;stage 1&gt;</title>") != std::string::npos);
  // Markers lie under the series; the series' colors are not theirs.
  CHECK(svg.find("class=\"marker\"") < svg.find("class=\"series\""));
  // Round x ticks: 0, 5, 10, 15, 20, not one per point.
  for (const char* tick : {">0<", ">5<", ">10<", ">15<", ">20<"}) CHECK(count(svg, tick) >= 1);
  // The x range is the given one: the marker at 4 of 0..20 lies a fifth of the way along the axis.
  CHECK(svg.find(R"(x1="170.0")") != std::string::npos);  // 70 + 0.2 * (820 - 70 - 250)
  CHECK(svg.find("nan") == std::string::npos);
}

TEST_CASE("round ticks: y's top raised to the next round value, large values shortened") {
  ChartSpec chart{"t", "tokens", "loss", false, {}, {}, {}};
  chart.series.push_back({"s", {{0, 0.3}, {1.234e6, 5.83}}, false, true, -1});
  ChartExtras extras;
  extras.x_ticks = 6;
  extras.y_ticks = 5;
  const std::string svg = render_svg(chart, extras);
  // y: 0..5.83 in steps of 1, up to 6; no tick at an odd value.
  for (const char* tick : {">1<", ">3<", ">6<"}) CHECK(count(svg, tick) == 1);
  CHECK(count(svg, ">0<") == 2);  // both axes start at 0
  CHECK(count(svg, ">7<") == 0);
  CHECK(count(svg, "5.83") == 0);
  // x: 0..1.234M in steps of 200k.
  for (const char* tick : {">200k<", ">400k<", ">1M<", ">1.2M<"}) CHECK(count(svg, tick) == 1);
}

TEST_CASE("points outside a given x range are left out of the line") {
  ChartSpec chart{"t", "x", "y", false, {}, {}, {}};
  chart.series.push_back({"s", {{-5, 1}, {0, 1}, {5, 2}, {10, 3}, {50, 4}}, false, true, -1});
  ChartExtras extras;
  extras.x_min = 0;
  extras.x_max = 10;
  CHECK(count(render_svg(chart, extras), "<circle") == 3);
}

}  // namespace
}  // namespace swarm::apps
