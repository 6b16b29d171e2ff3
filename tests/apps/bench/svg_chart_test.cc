// The SVG charts of experiment outputs: every series drawn as a polyline with
// its markers, text escaped, unplottable points left out.
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

}  // namespace
}  // namespace swarm::apps
