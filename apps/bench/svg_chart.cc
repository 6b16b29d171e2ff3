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
constexpr const char* kMarkerPalette[] = {"#e31a1c", "#ff7f00", "#33a02c", "#6a3d9a", "#7f7f7f", "#b15928"};


struct Range {
  double lo = std::numeric_limits<double>::infinity(), hi = -std::numeric_limits<double>::infinity();
  void add(double v) { lo = std::min(lo, v), hi = std::max(hi, v); }
  bool empty() const { return !(lo <= hi); }
};

// Maps data to pixels; x through log2 when asked.
struct Axes {
  const ChartSpec& chart;
  const ChartExtras& extras;
  Range x, y;
  bool usable(double px, double py) const { return std::isfinite(px) && std::isfinite(py) && (!chart.log2_x || px > 0); }
  double xv(double v) const { return chart.log2_x ? std::log2(v) : v; }
  double to_px(double v) const {
    const double span = x.hi - x.lo;
    return kLeft + (span > 0 ? (xv(v) - x.lo) / span : 0.5) * (kWidth - kLeft - kRight);
  }
  // Within the x axis (a given x_min or x_max can leave data outside it).
  bool inside(double v) const { return to_px(v) >= kLeft - 0.5 && to_px(v) <= kWidth - kRight + 0.5; }
  double to_py(double v) const {
    const double span = y.hi - y.lo;
    return kHeight - kBottom - (span > 0 ? (v - y.lo) / span : 0.5) * (kHeight - kTop - kBottom);
  }
};

// A round step (1, 2 or 5 times a power of ten) that cuts span into about n parts.
double round_step(double span, int n) {
  const double raw = span / n;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double r = raw / magnitude;
  return (r < 1.5 ? 1 : r < 3 ? 2 : r < 7 ? 5 : 10) * magnitude;
}

// The multiples of a round step in [lo, hi].
std::vector<double> round_ticks(double lo, double hi, int n) {
  if (!(hi > lo)) return {lo};
  const double step = round_step(hi - lo, n);
  std::vector<double> out;
  for (double k = std::ceil(lo / step - 1e-9); k <= std::floor(hi / step + 1e-9); ++k) {
    out.push_back(k * step + 0.0);  // + 0.0: never "-0"
  }
  return out;
}

// A round tick's label: 250, 0.5, 1.5k, 2M.
std::string round_label(double v) {
  const double a = std::abs(v);
  if (a >= 1e6) return fmt::format("{:.4g}M", v / 1e6);
  if (a >= 1e4) return fmt::format("{:.4g}k", v / 1e3);
  return fmt::format("{:.4g}", v);
}

Axes fit(const ChartSpec& chart, const ChartExtras& extras) {
  Axes a{chart, extras, {}, {}};
  a.y.add(0);
  for (const ChartSeries& s : chart.series) {
    for (auto [px, py] : s.points) {
      if (!a.usable(px, py)) continue;
      a.x.add(a.xv(px));
      a.y.add(py);
    }
  }
  for (const ChartMarker& m : extras.markers) {
    if (a.usable(m.x, 0)) a.x.add(a.xv(m.x));
  }
  if (extras.x_min && a.usable(*extras.x_min, 0)) a.x.lo = a.xv(*extras.x_min);
  if (extras.x_max && a.usable(*extras.x_max, 0)) a.x.hi = a.xv(*extras.x_max);
  if (a.x.empty()) a.x = {0, 1};
  if (chart.y_min) a.y.lo = *chart.y_min;
  if (chart.y_max) a.y.hi = *chart.y_max;
  if (!chart.y_max && a.y.hi > a.y.lo) {
    if (extras.y_ticks > 0) {  // a little headroom, up to the next round value
      const double step = round_step(a.y.hi - a.y.lo, extras.y_ticks);
      a.y.hi = std::ceil((a.y.hi + 0.02 * (a.y.hi - a.y.lo)) / step - 1e-9) * step;
    } else {
      a.y.hi += 0.05 * (a.y.hi - a.y.lo);
    }
  }
  return a;
}

std::string axes_svg(const Axes& a) {
  std::string out = fmt::format(
      R"(<line x1="{0}" y1="{1}" x2="{2}" y2="{1}" stroke="black"/><line x1="{0}" y1="{1}" x2="{0}" y2="{3}" stroke="black"/>)",
      kLeft, kHeight - kBottom, kWidth - kRight, kTop);
  std::vector<double> ys;
  if (a.extras.y_ticks > 0) {
    ys = round_ticks(a.y.lo, a.y.hi, a.extras.y_ticks);
  } else {
    for (int i = 0; i <= 5; ++i) ys.push_back(a.y.lo + (a.y.hi - a.y.lo) * i / 5);
  }
  for (double v : ys) {
    out += fmt::format(R"(<text x="{}" y="{:.1f}" font-size="11" text-anchor="end">{}</text>)", kLeft - 6,
                       a.to_py(v) + 4, a.extras.y_ticks > 0 ? round_label(v) : fmt::format("{:.4g}", v));
    out += fmt::format(R"(<line x1="{}" y1="{:.1f}" x2="{}" y2="{:.1f}" stroke="#ddd"/>)", kLeft, a.to_py(v),
                       kWidth - kRight, a.to_py(v));
  }
  std::vector<double> xs;  // x ticks at the data's x values (a sweep's own points), or round ones
  if (a.extras.x_ticks > 0 && a.chart.log2_x) {
    for (int i = 0; i <= a.extras.x_ticks; ++i) xs.push_back(std::exp2(a.x.lo + (a.x.hi - a.x.lo) * i / a.extras.x_ticks));
  } else if (a.extras.x_ticks > 0) {
    xs = round_ticks(a.x.lo, a.x.hi, a.extras.x_ticks);
  }
  for (const ChartSeries& s : a.chart.series) {
    if (a.extras.x_ticks > 0) break;
    for (auto [px, py] : s.points) {
      if (a.usable(px, py) && std::find(xs.begin(), xs.end(), px) == xs.end()) xs.push_back(px);
    }
  }
  for (double v : xs) {
    out += fmt::format(R"(<text x="{:.1f}" y="{}" font-size="11" text-anchor="middle">{}</text>)", a.to_px(v),
                       kHeight - kBottom + 16, a.extras.x_ticks > 0 ? round_label(v) : fmt::format("{:.4g}", v));
  }
  return out;
}

std::string series_svg(const Axes& a, const ChartSeries& s, int index) {
  const char* color = kPalette[(s.color >= 0 ? s.color : index) % std::size(kPalette)];
  std::string path, marks;
  for (auto [px, py] : s.points) {
    if (!a.usable(px, py) || !a.inside(px)) continue;
    path += fmt::format("{}{:.1f},{:.1f}", path.empty() ? "" : " ", a.to_px(px), a.to_py(py));
    if (s.markers) marks += fmt::format(R"(<circle cx="{:.1f}" cy="{:.1f}" r="3.5" fill="{}"/>)", a.to_px(px), a.to_py(py), color);
  }
  const double ly = kTop + 18 * index;
  return fmt::format(R"(<g class="series"><polyline fill="none" stroke="{0}" stroke-width="2"{1} points="{2}"/>{3})"
                     R"(<line x1="{4}" y1="{5}" x2="{6}" y2="{5}" stroke="{0}" stroke-width="2"{1}/>)"
                     R"(<text x="{7}" y="{8}" font-size="12">{9}</text></g>)",
                     color, s.dashed ? R"( stroke-dasharray="6,4")" : "", path, marks, kWidth - kRight + 10, ly,
                     kWidth - kRight + 34, kWidth - kRight + 40, ly + 4, xml_escape(s.label));
}

// Event markers under the series, and one legend entry per group below the series' entries.
std::string markers_svg(const Axes& a) {
  std::vector<std::string> groups;  // in order of appearance: a group's color is its place here
  std::vector<bool> drawn;
  std::string lines;
  for (const ChartMarker& m : a.extras.markers) {
    auto group = std::find(groups.begin(), groups.end(), m.group);
    if (group == groups.end()) {
      group = groups.insert(groups.end(), m.group);
      drawn.push_back(false);
    }
    const size_t g = static_cast<size_t>(group - groups.begin());
    if (!a.usable(m.x, 0) || !a.inside(m.x)) continue;
    const double px = a.to_px(m.x);
    drawn[g] = true;
    lines += fmt::format(R"(<g class="marker"><line x1="{0:.1f}" y1="{1}" x2="{0:.1f}" y2="{2}" stroke="{3}" )"
                         R"(stroke-width="1.5" stroke-dasharray="3,3" opacity="0.8"/><title>{4}</title></g>)",
                         px, kTop, kHeight - kBottom, kMarkerPalette[g % std::size(kMarkerPalette)], xml_escape(m.label));
  }
  std::string legend;
  size_t row = a.chart.series.size();
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!drawn[g]) continue;
    const double ly = kTop + 18 * static_cast<double>(row++);
    legend += fmt::format(R"(<g class="marker-legend"><line x1="{0}" y1="{1}" x2="{2}" y2="{1}" stroke="{3}" )"
                          R"(stroke-width="1.5" stroke-dasharray="3,3"/><text x="{4}" y="{5}" font-size="12">{6}</text></g>)",
                          kWidth - kRight + 10, ly, kWidth - kRight + 34, kMarkerPalette[g % std::size(kMarkerPalette)],
                          kWidth - kRight + 40, ly + 4, xml_escape(groups[g]));
  }
  return lines + legend;
}

}  // namespace

std::string render_svg(const ChartSpec& chart, const ChartExtras& extras) {
  const Axes a = fit(chart, extras);
  std::string out = fmt::format(
      R"(<svg xmlns="http://www.w3.org/2000/svg"{4} width="{0}" height="{1}" viewBox="0 0 {0} {1}" font-family="sans-serif">)"
      R"(<rect width="100%" height="100%" fill="white"/>)"
      R"(<text x="{2}" y="22" font-size="15" text-anchor="middle">{3}</text>)",
      kWidth, kHeight, (kLeft + kWidth - kRight) / 2, xml_escape(chart.title),
      extras.id.empty() ? std::string() : fmt::format(R"( id="{}")", xml_escape(extras.id)));
  out += axes_svg(a);
  out += fmt::format(R"(<text x="{}" y="{}" font-size="12" text-anchor="middle">{}</text>)", (kLeft + kWidth - kRight) / 2,
                     kHeight - 18, xml_escape(chart.x_label + (chart.log2_x ? " (log scale)" : "")));
  out += fmt::format(R"svg(<text x="16" y="{0}" font-size="12" text-anchor="middle" transform="rotate(-90 16 {0})">{1}</text>)svg",
                     (kTop + kHeight - kBottom) / 2, xml_escape(chart.y_label));
  out += markers_svg(a);
  for (size_t i = 0; i < chart.series.size(); ++i) out += series_svg(a, chart.series[i], static_cast<int>(i));
  return out + "</svg>\n";
}

std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace swarm::apps
