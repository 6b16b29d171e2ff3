#include "apps/bench/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/core.h>

namespace swarm::apps {
namespace {

constexpr double kWidth = 820, kHeight = 440;
constexpr double kLeft = 70, kRight = 250, kTop = 40, kBottom = 60;  // the legend sits on the right
constexpr const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

struct Range {
  double lo = std::numeric_limits<double>::infinity(), hi = -std::numeric_limits<double>::infinity();
  void add(double v) { lo = std::min(lo, v), hi = std::max(hi, v); }
  bool empty() const { return !(lo <= hi); }
};

// Maps data to pixels; x through log2 when asked.
struct Axes {
  const ChartSpec& chart;
  Range x, y;
  bool usable(double px, double py) const { return std::isfinite(px) && std::isfinite(py) && (!chart.log2_x || px > 0); }
  double xv(double v) const { return chart.log2_x ? std::log2(v) : v; }
  double to_px(double v) const {
    const double span = x.hi - x.lo;
    return kLeft + (span > 0 ? (xv(v) - x.lo) / span : 0.5) * (kWidth - kLeft - kRight);
  }
  double to_py(double v) const {
    const double span = y.hi - y.lo;
    return kHeight - kBottom - (span > 0 ? (v - y.lo) / span : 0.5) * (kHeight - kTop - kBottom);
  }
};

Axes fit(const ChartSpec& chart) {
  Axes a{chart, {}, {}};
  a.y.add(0);
  for (const ChartSeries& s : chart.series) {
    for (auto [px, py] : s.points) {
      if (!a.usable(px, py)) continue;
      a.x.add(a.xv(px));
      a.y.add(py);
    }
  }
  if (a.x.empty()) a.x = {0, 1};
  if (chart.y_min) a.y.lo = *chart.y_min;
  if (chart.y_max) a.y.hi = *chart.y_max;
  if (!chart.y_max && a.y.hi > a.y.lo) a.y.hi += 0.05 * (a.y.hi - a.y.lo);
  return a;
}

std::string axes_svg(const Axes& a) {
  std::string out = fmt::format(
      R"(<line x1="{0}" y1="{1}" x2="{2}" y2="{1}" stroke="black"/><line x1="{0}" y1="{1}" x2="{0}" y2="{3}" stroke="black"/>)",
      kLeft, kHeight - kBottom, kWidth - kRight, kTop);
  for (int i = 0; i <= 5; ++i) {  // y ticks
    const double v = a.y.lo + (a.y.hi - a.y.lo) * i / 5;
    out += fmt::format(R"(<text x="{}" y="{:.1f}" font-size="11" text-anchor="end">{:.4g}</text>)", kLeft - 6,
                       a.to_py(v) + 4, v);
    out += fmt::format(R"(<line x1="{}" y1="{:.1f}" x2="{}" y2="{:.1f}" stroke="#ddd"/>)", kLeft, a.to_py(v),
                       kWidth - kRight, a.to_py(v));
  }
  std::vector<double> xs;  // x ticks at the data's x values (a sweep's own points)
  for (const ChartSeries& s : a.chart.series) {
    for (auto [px, py] : s.points) {
      if (a.usable(px, py) && std::find(xs.begin(), xs.end(), px) == xs.end()) xs.push_back(px);
    }
  }
  for (double v : xs) {
    out += fmt::format(R"(<text x="{:.1f}" y="{}" font-size="11" text-anchor="middle">{:.4g}</text>)", a.to_px(v),
                       kHeight - kBottom + 16, v);
  }
  return out;
}

std::string series_svg(const Axes& a, const ChartSeries& s, int index) {
  const char* color = kPalette[(s.color >= 0 ? s.color : index) % std::size(kPalette)];
  std::string path, marks;
  for (auto [px, py] : s.points) {
    if (!a.usable(px, py)) continue;
    path += fmt::format("{}{:.1f},{:.1f}", path.empty() ? "" : " ", a.to_px(px), a.to_py(py));
    if (s.markers) marks += fmt::format(R"(<circle cx="{:.1f}" cy="{:.1f}" r="3.5" fill="{}"/>)", a.to_px(px), a.to_py(py), color);
  }
  const double ly = kTop + 18 * index;
  return fmt::format(R"(<g class="series"><polyline fill="none" stroke="{0}" stroke-width="2"{1} points="{2}"/>{3})"
                     R"(<line x1="{4}" y1="{5}" x2="{6}" y2="{5}" stroke="{0}" stroke-width="2"{1}/>)"
                     R"(<text x="{7}" y="{8}" font-size="12">{9}</text></g>)",
                     color, s.dashed ? R"( stroke-dasharray="6,4")" : "", path, marks, kWidth - kRight + 10, ly,
                     kWidth - kRight + 34, kWidth - kRight + 40, ly + 4, escape(s.label));
}

}  // namespace

std::string render_svg(const ChartSpec& chart) {
  const Axes a = fit(chart);
  std::string out = fmt::format(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="{0}" height="{1}" viewBox="0 0 {0} {1}" font-family="sans-serif">)"
      R"(<rect width="100%" height="100%" fill="white"/>)"
      R"(<text x="{2}" y="22" font-size="15" text-anchor="middle">{3}</text>)",
      kWidth, kHeight, (kLeft + kWidth - kRight) / 2, escape(chart.title));
  out += axes_svg(a);
  out += fmt::format(R"(<text x="{}" y="{}" font-size="12" text-anchor="middle">{}</text>)", (kLeft + kWidth - kRight) / 2,
                     kHeight - 18, escape(chart.x_label + (chart.log2_x ? " (log scale)" : "")));
  out += fmt::format(R"svg(<text x="16" y="{0}" font-size="12" text-anchor="middle" transform="rotate(-90 16 {0})">{1}</text>)svg",
                     (kTop + kHeight - kBottom) / 2, escape(chart.y_label));
  for (size_t i = 0; i < chart.series.size(); ++i) out += series_svg(a, chart.series[i], static_cast<int>(i));
  return out + "</svg>\n";
}

}  // namespace swarm::apps
