#include "apps/report/run_report.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "apps/bench/svg_chart.h"
#include "swarm/api/stage.h"

namespace swarm::apps {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr int kMaxStages = 256;              // a stage index beyond this is a broken record
constexpr size_t kMaxPointsPerSeries = 2000;  // longer series are thinned evenly, the last point kept
constexpr size_t kMaxEventRows = 400;
constexpr size_t kMaxMismatchesListed = 20;

std::optional<double> number(const json& record, const char* key) {
  const auto it = record.find(key);
  if (it == record.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

double number_or(const json& record, const char* key, double fallback) { return number(record, key).value_or(fallback); }

int int_or(const json& record, const char* key, int fallback) {
  const auto it = record.find(key);
  return it != record.end() && it->is_number_integer() ? it->get<int>() : fallback;
}

std::string string_or(const json& record, const char* key, const std::string& fallback = "") {
  const auto it = record.find(key);
  return it != record.end() && it->is_string() ? it->get<std::string>() : fallback;
}


// A JSON value as a table shows it: strings bare, numbers short.
std::string show(const json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number_float()) {
    const double v = value.get<double>();
    return std::isfinite(v) ? fmt::format("{:.6g}", v) : "not finite";
  }
  if (value.is_null()) return "null";
  return value.dump();
}

// "token" of "tokens": the unit of a per-unit label.
std::string singular(const std::string& unit) {
  return unit.size() > 1 && unit.back() == 's' ? unit.substr(0, unit.size() - 1) : unit;
}

std::string seconds_text(double s) {
  if (!std::isfinite(s)) return "?";
  if (s < 120) return fmt::format("{:.1f} s", s);
  return fmt::format("{:.0f} s ({}:{:02d} min)", s, static_cast<int>(s) / 60, static_cast<int>(s) % 60);
}

// ---------------------------------------------------------------------------
// The timeline: one pass over the records.

// Cumulative counters of a segment (one process's records), continued across resumes.
struct Counters {
  double samples = 0, retries = 0, abandoned = 0, wire_bytes = 0, allreduce_bytes = 0;
  Counters& operator+=(const Counters& o) {
    samples += o.samples, retries += o.retries, abandoned += o.abandoned, wire_bytes += o.wire_bytes,
        allreduce_bytes += o.allreduce_bytes;
    return *this;
  }
};

// A unit config.json names: a short word or two, or nothing (the page writes it into
// titles and labels).
std::optional<std::string> unit_of(const json& units, const char* key) {
  const auto it = units.find(key);
  if (it == units.end() || !it->is_string()) return std::nullopt;
  const std::string& unit = it->get_ref<const std::string&>();
  if (unit.empty() || unit.size() > 24) return std::nullopt;
  for (char c : unit) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != ' ' && c != '-' && c != '_') return std::nullopt;
  }
  return unit;
}

// A record's named metrics ({"accuracy": 0.97}): as many and named as a loss stage
// may name them (swarm/api/stage.h), numbers only; anything else in it is left out.
constexpr size_t kMaxMetrics = kMaxStageMetrics;

template <typename Visit>
void for_each_metric(const json& record, const char* key, Visit visit) {
  const auto it = record.find(key);
  if (it == record.end() || !it->is_object()) return;
  size_t taken = 0;
  for (const auto& item : it->items()) {
    const std::string& name = item.key();
    const json& value = item.value();
    if (taken == kMaxMetrics) return;
    if (!valid_metric_name(name) || !value.is_number() || !std::isfinite(value.get<double>())) continue;
    visit(name, value.get<double>());
    ++taken;
  }
}

class TimelineBuilder {
 public:
  explicit TimelineBuilder(const RunRecords& run) : run_(run) {
    const json& config = run.config;
    if (config.is_object()) {
      t_.stages = std::clamp(int_or(config, "stages", 0), 0, kMaxStages);
      if (auto model = config.find("model"); model != config.end() && model->is_object()) {
        t_.tokens_per_sample = std::max(0, int_or(*model, "max_seq_len", 0));
      }
      microbatch_ = std::max(0, int_or(config, "microbatch", 0));
      const auto gpt2 = config.find("gpt2_tokens");
      if (gpt2 != config.end() && gpt2->is_boolean() && gpt2->get<bool>()) t_.loss_unit = "token";
      if (t_.tokens_per_sample == 0) t_.rate_unit = "samples";
      if (auto units = config.find("units"); units != config.end() && units->is_object()) {
        if (auto unit = unit_of(*units, "loss")) t_.loss_unit = *unit;
        if (auto unit = unit_of(*units, "rate")) t_.rate_unit = *unit;
      }
    } else {
      t_.rate_unit = "samples";
    }
    grow(t_.stages);
  }

  RunTimeline build() {
    for (const json& r : run_.records) add(r);
    finish();
    return std::move(t_);
  }

 private:
  void grow(int stages) {
    if (stages > kMaxStages) return;
    t_.stages = std::max(t_.stages, stages);
    while (static_cast<int>(t_.peers_per_stage.size()) < t_.stages) t_.peers_per_stage.push_back(ChartPoints(1, {0.0, 0.0}));
    t_.global_step.resize(t_.stages);
    live_per_stage_.resize(t_.stages, 0);
  }

  bool stage_ok(int stage) {
    if (stage < 0 || stage >= kMaxStages) return false;
    grow(stage + 1);
    return true;
  }

  double tokens(double samples) const {
    return t_.tokens_per_sample > 0 ? samples * t_.tokens_per_sample : samples;
  }

  void add(const json& r) {
    const double raw = number_or(r, "time", kNaN);
    const std::string kind = string_or(r, "kind");
    if (!std::isfinite(raw) || kind.empty()) return;  // parse_metrics keeps none such
    if (t_.segments == 0) {
      t_.segments = 1;
    } else if (raw < last_raw_ - 1e-3) {  // a resumed run appends with its own clock
      new_segment();
    }
    last_raw_ = raw;
    const double time = offset_ + raw;
    t_.end_time = std::max(t_.end_time, time);
    if (kind == "step") {
      add_step(r, time);
    } else if (kind == "event") {
      add_event(r, time);
    } else if (kind == "replica") {
      add_replica(r, time);
    } else if (kind == "global_step") {
      add_global_step(r, time);
    } else if (kind == "peer") {
      t_.peers[string_or(r, "peer", "?")] = r;
    } else if (kind == "peer_samples") {
      t_.peer_samples[{string_or(r, "peer", "?"), int_or(r, "stage", -1)}] = r;
    } else if (kind == "stage_samples") {
      t_.stage_samples[int_or(r, "stage", -1)] = r;
    } else {
      ++t_.unknown_kinds[kind];
    }
  }

  void new_segment() {
    ++t_.segments;
    offset_ = t_.end_time;
    before_ += segment_;
    segment_ = Counters{};
    // The peers of the earlier segment went with its process.
    for (const auto& [peer, stage] : live_) --live_per_stage_[stage];
    live_.clear();
    record_peer_counts(offset_);
  }

  void add_step(const json& r, double time) {
    const double step = number_or(r, "step", kNaN);
    const std::optional<double> validation = number(r, "validation_loss");
    // swarm local ends with a summary step record: the last step again, with the validation
    // loss (null when validation did not finish) and why the run stopped.
    const bool final_record = (r.contains("validation_loss") || r.contains("stopped_because")) &&
                              (!(step > max_step_) || !r.contains("samples_completed"));
    if (auto s = number(r, "samples_completed")) {
      segment_.samples = *s;
    } else if (auto mb = number(r, "microbatches_completed"); mb && microbatch_ > 0 && !final_record) {
      segment_.samples = *mb * microbatch_;
    }
    const double all_tokens = tokens(before_.samples + segment_.samples);
    if (validation) {
      t_.validation_loss = *validation;
      t_.validation_by_time.emplace_back(time, *validation);
      t_.validation_by_tokens.emplace_back(all_tokens, *validation);
    }
    if (final_record && !validation) t_.validation_loss.reset();  // this run's validation did not finish
    if (final_record) {
      t_.validation_metrics.clear();
      for_each_metric(r, "validation_metrics", [&](const std::string& name, double value) {
        t_.validation_metrics[name] = value;
      });
    }
    t_.last_step = r;
    t_.finished = final_record;
    if (final_record) return;  // its rates are the run's averages, not a step's
    if (step > max_step_) max_step_ = step;
    const double loss = number_or(r, "loss", kNaN);
    t_.loss_by_time.emplace_back(time, loss);
    t_.loss_by_tokens.emplace_back(all_tokens, loss);
    if (auto tps = number(r, "tokens_per_s")) t_.tokens_per_second.emplace_back(time, *tps);
    for_each_metric(r, "metrics", [&](const std::string& name, double value) {
      // Names beyond the first kMaxMetrics the run used are left out, as within a record.
      if (t_.metrics_by_time.size() < kMaxMetrics || t_.metrics_by_time.contains(name)) {
        t_.metrics_by_time[name].emplace_back(time, value);
      }
    });
    if (auto v = number(r, "retries")) {
      segment_.retries = *v;
      t_.retries.emplace_back(time, before_.retries + *v);
    }
    if (auto v = number(r, "microbatches_abandoned")) {
      segment_.abandoned = *v;
      t_.abandoned.emplace_back(time, before_.abandoned + *v);
    }
    const std::optional<double> wire = number(r, "wire_bytes"), allreduce = number(r, "allreduce_bytes");
    if (wire) segment_.wire_bytes = *wire;
    if (allreduce) segment_.allreduce_bytes = *allreduce;
    if (all_tokens > 0) {
      if (wire) t_.pipeline_bytes_per_token.emplace_back(time, (before_.wire_bytes + *wire) / all_tokens);
      if (allreduce) t_.allreduce_bytes_per_token.emplace_back(time, (before_.allreduce_bytes + *allreduce) / all_tokens);
    }
  }

  void add_event(const json& r, double time) {
    RunEvent e{time, string_or(r, "event", "?"), string_or(r, "peer"), int_or(r, "stage", -1), -1,
               string_or(r, "detail")};
    if (e.event == "peer_moved") {
      e.from_stage = int_or(r, "from_stage", -1);
      e.stage = int_or(r, "to_stage", -1);
    }
    if (e.event == "banned") count_up(&t_.bans, &bans_, time);
    if (e.event == "timed_out") count_up(&t_.timeouts, &timeouts_, time);
    if ((e.event == "peer_joined" || e.event == "peer_moved") && stage_ok(e.stage)) {
      set_live(e.peer, e.stage, time);
    } else if (e.event == "peer_lost") {
      set_live(e.peer, -1, time);
    }
    t_.events.push_back(std::move(e));
  }

  // A staircase of a count of events.
  static void count_up(ChartPoints* points, int64_t* count, double time) {
    points->emplace_back(time, static_cast<double>(*count));
    points->emplace_back(time, static_cast<double>(++*count));
  }

  // peer serves `stage` from `time` on (-1: no stage).
  void set_live(const std::string& peer, int stage, double time) {
    const auto it = live_.find(peer);
    if (it != live_.end()) {
      if (it->second == stage) return;
      --live_per_stage_[it->second];
      live_.erase(it);
    }
    if (stage >= 0) {
      live_[peer] = stage;
      ++live_per_stage_[stage];
    }
    record_peer_counts(time);
  }

  // A staircase: each stage whose count changed gets its old count and its new one at `time`.
  void record_peer_counts(double time) {
    for (int s = 0; s < t_.stages; ++s) {
      ChartPoints& points = t_.peers_per_stage[s];
      const double now = live_per_stage_[s];
      if (points.back().second == now) continue;
      points.emplace_back(time, points.back().second);
      points.emplace_back(time, now);
    }
  }

  void add_replica(const json& r, double) {
    const int stage = int_or(r, "stage", -1);
    const std::optional<double> step = number(r, "step");
    if (!stage_ok(stage) || !step) return;
    const auto key = std::make_pair(stage, static_cast<int64_t>(*step));
    auto& [hashes, holders] = replicas_[key];
    hashes.insert(string_or(r, "hash"));
    holders.insert(string_or(r, "peer"));
  }

  // The chart draws the steps the stage's committed membership vouched for, which
  // swarm local records as they advance: a replica record is one peer's word.
  void add_global_step(const json& r, double time) {
    const int stage = int_or(r, "stage", -1);
    const std::optional<double> step = number(r, "step");
    if (!stage_ok(stage) || !step) return;
    ChartPoints& points = t_.global_step[stage];
    if (points.empty() || *step > points.back().second) points.emplace_back(time, *step);
  }

  void finish() {
    const double end = t_.end_time;
    for (ChartPoints& points : t_.peers_per_stage) points.emplace_back(end, points.back().second);
    for (ChartPoints& points : t_.global_step) {
      if (!points.empty()) points.emplace_back(end, points.back().second);
    }
    if (!t_.loss_by_time.empty() || !t_.events.empty()) {  // counts of events: 0 from the start to the end
      for (ChartPoints* counts : {&t_.bans, &t_.timeouts}) {
        const double last = counts->empty() ? 0 : counts->back().second;
        counts->insert(counts->begin(), std::make_pair(0.0, 0.0));
        counts->emplace_back(end, last);
      }
    }
    for (const auto& [key, sets] : replicas_) {
      ++t_.hashed_steps;
      if (sets.second.size() >= 2) ++t_.shared_steps;
      if (sets.first.size() >= 2) t_.mismatched_steps.push_back(key);
    }
  }

  const RunRecords& run_;
  RunTimeline t_;
  int microbatch_ = 0;
  double last_raw_ = 0, offset_ = 0;
  double max_step_ = -std::numeric_limits<double>::infinity();
  Counters before_, segment_;
  std::map<std::string, int> live_;  // peer -> the stage it serves
  std::vector<int> live_per_stage_;
  int64_t bans_ = 0, timeouts_ = 0;
  std::map<std::pair<int, int64_t>, std::pair<std::set<std::string>, std::set<std::string>>> replicas_;  // hashes, holders
};

// ---------------------------------------------------------------------------
// The page.

ChartPoints thinned(const ChartPoints& points) {
  if (points.size() <= kMaxPointsPerSeries) return points;
  ChartPoints out;
  out.reserve(kMaxPointsPerSeries + 1);
  const double stride = static_cast<double>(points.size() - 1) / static_cast<double>(kMaxPointsPerSeries - 1);
  for (size_t i = 0; i + 1 < kMaxPointsPerSeries; ++i) out.push_back(points[static_cast<size_t>(i * stride)]);
  out.push_back(points.back());
  return out;
}

bool has_finite(const ChartPoints& points) {
  return std::any_of(points.begin(), points.end(),
                     [](const auto& p) { return std::isfinite(p.first) && std::isfinite(p.second); });
}

// Dots on the points of a short series only; a staircase (peers, global steps) never has them.
ChartSeries series(std::string label, const ChartPoints& points, int color = -1, bool dashed = false,
                   bool staircase = false) {
  return ChartSeries{std::move(label), thinned(points), dashed, !staircase && points.size() <= 40, color};
}

std::string absolute(const fs::path& path) {
  std::error_code error;
  const fs::path out = fs::absolute(path, error);
  return error ? path.string() : out.string();
}

// The events marked on the time axes, grouped by what they are.
std::vector<ChartMarker> event_markers(const RunTimeline& t) {
  const std::pair<const char*, bool (*)(const std::string&)> groups[] = {
      {"chaos", [](const std::string& e) { return e.starts_with("chaos_"); }},
      {"peer lost", [](const std::string& e) { return e == "peer_lost"; }},
      {"peer joined", [](const std::string& e) { return e == "peer_joined"; }},
      {"peer moved", [](const std::string& e) { return e == "peer_moved"; }},
      {"resumed", [](const std::string& e) { return e == "resumed"; }},
  };
  std::vector<ChartMarker> markers;
  for (const auto& [group, matches] : groups) {
    for (const RunEvent& e : t.events) {
      if (!matches(e.event)) continue;
      std::string label = fmt::format("{:.1f} s: {}", e.time, e.event);
      if (!e.peer.empty()) label += " " + e.peer;
      if (e.event == "peer_moved") {
        label += fmt::format(" (stage {} to {})", e.from_stage, e.stage);
      } else if (e.stage >= 0) {
        label += fmt::format(" (stage {})", e.stage);
      }
      markers.push_back({e.time, group, std::move(label)});
    }
  }
  return markers;
}

struct Plot {
  std::string id;
  std::string title;
  std::string caption;
  std::string no_data;  // why there is nothing to draw; empty when there is
  ChartSpec chart;
  ChartExtras extras;
};

std::string plot_html(const Plot& plot) {
  std::string out = fmt::format(R"(<figure class="plot" data-plot="{}">)", plot.id);
  if (!plot.no_data.empty()) {
    out += fmt::format(R"(<div class="no-data" id="{}"><h3>{}</h3><p>No data: {}</p></div>)", plot.id,
                       xml_escape(plot.title), xml_escape(plot.no_data));
  } else {
    out += render_svg(plot.chart, plot.extras);
  }
  if (!plot.caption.empty()) out += fmt::format("<figcaption>{}</figcaption>", xml_escape(plot.caption));
  return out + "</figure>\n";
}

std::vector<Plot> plots(const RunTimeline& t) {
  const std::vector<ChartMarker> markers = event_markers(t);
  const std::string loss_unit = "nats/" + t.loss_unit;
  const std::string token_axis = t.rate_unit + " trained";
  const std::string per_token = singular(t.rate_unit);
  const bool has_steps = !t.loss_by_time.empty();
  // y from 0, six x intervals; on a time axis, the events marked and the whole run's span.
  auto plot = [&](const char* id, std::string title, std::string caption, std::string x_label, std::string y_label) {
    Plot p;
    p.id = id;
    p.title = p.chart.title = std::move(title);
    p.caption = std::move(caption);
    p.chart.x_label = std::move(x_label);
    p.chart.y_label = std::move(y_label);
    p.chart.y_min = 0.0;
    p.extras.x_ticks = 6;
    p.extras.y_ticks = 5;
    p.extras.id = id;
    return p;
  };
  auto time_plot = [&](const char* id, std::string title, std::string caption, std::string y_label) {
    Plot p = plot(id, std::move(title), std::move(caption), "seconds since the start", std::move(y_label));
    p.extras.markers = markers;
    p.extras.x_min = 0.0;
    p.extras.x_max = std::max(t.end_time, 1e-3);
    return p;
  };
  std::vector<Plot> out;

  {
    Plot p = time_plot("plot-loss-time", "Loss against time",
                       "Training loss of each step's completed microbatches (a step with none has no loss); "
                       "validation loss through the swarm, as recorded.",
                       loss_unit);
    p.chart.series.push_back(series("training loss", t.loss_by_time, 0));
    p.chart.series.push_back(series("validation loss", t.validation_by_time, 1));
    p.chart.series.back().markers = true;
    if (!has_finite(t.loss_by_time) && !has_finite(t.validation_by_time)) p.no_data = "no step recorded a loss yet";
    out.push_back(std::move(p));
  }
  {
    Plot p = plot("plot-loss-tokens", "Loss against " + t.rate_unit, "", token_axis, loss_unit);
    p.chart.series.push_back(series("training loss", t.loss_by_tokens, 0));
    p.chart.series.push_back(series("validation loss", t.validation_by_tokens, 1));
    p.chart.series.back().markers = true;
    if (!has_finite(t.loss_by_tokens) && !has_finite(t.validation_by_tokens)) p.no_data = "no step recorded a loss yet";
    out.push_back(std::move(p));
  }
  {
    std::string title = t.rate_unit + " per second";
    title[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(title[0])));
    Plot p = time_plot("plot-tokens-per-s", title, "Over the last 10 s, at each step.", t.rate_unit + "/s");
    p.chart.series.push_back(series(t.rate_unit + "/s", t.tokens_per_second, 0));
    if (!has_finite(t.tokens_per_second)) p.no_data = "no step record has tokens_per_s";
    out.push_back(std::move(p));
  }
  if (!t.metrics_by_time.empty()) {
    Plot p = time_plot("plot-metrics", "The model's metrics",
                       "What the loss stage reports besides its loss, over each step's completed microbatches.",
                       "value");
    int color = 0;
    for (const auto& [name, points] : t.metrics_by_time) p.chart.series.push_back(series(name, points, color++));
    out.push_back(std::move(p));
  }
  {
    Plot p = time_plot("plot-peers", "Peers per stage",
                       "Serving peers the trainers saw, from peer_joined, peer_lost and peer_moved events.", "peers");
    bool any = false;
    for (int s = 0; s < t.stages; ++s) {
      p.chart.series.push_back(series(fmt::format("stage {}", s), t.peers_per_stage[s], s, s % 2 == 1, true));
      any = any || t.peers_per_stage[s].size() > 2;
    }
    if (!any) p.no_data = "no peer_joined, peer_lost or peer_moved event recorded";
    out.push_back(std::move(p));
  }
  {
    Plot p = time_plot("plot-global-steps", "Global step of each stage",
                       "The newest global step a strict majority of the stage's committed membership vouched "
                       "for (global_step records).",
                       "global step");
    bool any = false;
    for (int s = 0; s < t.stages; ++s) {
      p.chart.series.push_back(series(fmt::format("stage {}", s), t.global_step[s], s, s % 2 == 1, true));
      any = any || !t.global_step[s].empty();
    }
    if (!any) {
      p.no_data = "no global_step record (peers in solo mode, --global-batch 0, take no global steps; runs "
                  "recorded before global_step records were written have none)";
    }
    out.push_back(std::move(p));
  }
  {
    Plot p = time_plot("plot-failures", "Retries, bans, timeouts, abandoned microbatches",
                       "Cumulative: retries and abandoned microbatches from the step records' ledger; bans and "
                       "timeouts count the trainers' banned and timed_out events.",
                       "count");
    p.chart.series.push_back(series("retries", t.retries, 0));
    p.chart.series.push_back(series("bans", t.bans, 1, false, true));
    p.chart.series.push_back(series("timeouts", t.timeouts, 4, true, true));
    p.chart.series.push_back(series("abandoned", t.abandoned, 3, true));
    if (!has_steps && t.events.empty()) p.no_data = "no step or event recorded yet";
    out.push_back(std::move(p));
  }
  {
    Plot p = time_plot("plot-wire", fmt::format("Wire bytes per {}", per_token),
                       fmt::format("Encoded bytes of all four pipeline transfers (tokens and targets included) and "
                                   "of the all-reduce parts, cumulative, over the {}s trained so far.",
                                   per_token),
                       fmt::format("bytes/{}", per_token));
    p.chart.series.push_back(series("pipeline", t.pipeline_bytes_per_token, 0));
    p.chart.series.push_back(series("all-reduce", t.allreduce_bytes_per_token, 2));
    if (!has_finite(t.pipeline_bytes_per_token) && !has_finite(t.allreduce_bytes_per_token)) {
      p.no_data = "no step record with wire_bytes after a completed sample";
    }
    out.push_back(std::move(p));
  }
  return out;
}

void table_row(std::string* out, std::string_view name, std::string_view value_html) {
  *out += fmt::format("<tr><th>{}</th><td>{}</td></tr>\n", xml_escape(name), value_html);
}

// "a.b" -> value, for nested objects.
void flatten(const json& value, const std::string& prefix, std::vector<std::pair<std::string, std::string>>* out) {
  if (value.is_object()) {
    for (auto it = value.begin(); it != value.end(); ++it) {
      flatten(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
    }
    return;
  }
  out->emplace_back(prefix, show(value));
}

std::string record_table(const json& record, const char* id) {
  std::vector<std::pair<std::string, std::string>> rows;
  flatten(record, "", &rows);
  std::string out = fmt::format("<table class=\"kv\" id=\"{}\">\n", id);
  for (const auto& [key, value] : rows) {
    if (key == "kind") continue;
    table_row(&out, key, xml_escape(value));
  }
  return out + "</table>\n";
}

std::string replica_text(const RunTimeline& t) {
  if (t.hashed_steps == 0) return "not recorded (no replica records)";
  std::string text = fmt::format("{} (stage, global step) pairs hashed, {} of them by 2 or more replicas: ",
                                 t.hashed_steps, t.shared_steps);
  if (t.mismatched_steps.empty()) return text + "all agree";
  text += fmt::format("{} differ", t.mismatched_steps.size());
  return text;
}

std::string summary_html(const RunRecords& run, const RunTimeline& t) {
  std::string out = "<table class=\"kv\" id=\"summary\">\n";
  table_row(&out, "run directory", fmt::format("<code>{}</code>", xml_escape(absolute(run.run_dir))));
  std::string state;
  if (t.segments == 0) {
    state = "nothing recorded yet (metrics.jsonl is empty)";
  } else if (t.finished) {
    state = "finished: the run wrote its final record";
    const std::string why = string_or(*t.last_step, "stopped_because");
    if (!why.empty()) state += "; it stopped because: " + why;
  } else {
    state = "no final record: the run is still going, or it stopped before validating (crashed, killed or interrupted)";
  }
  table_row(&out, "state", xml_escape(state));
  table_row(&out, "recorded", xml_escape(fmt::format("{} records over {}{}", run.records.size(), seconds_text(t.end_time),
                                                      t.segments > 1 ? fmt::format(", in {} segments (resumed {} times)",
                                                                                   t.segments, t.segments - 1)
                                                                     : "")));
  if (t.last_step) {
    const json& last = *t.last_step;
    table_row(&out, "steps", xml_escape(show(last.value("step", json()))));
    std::string loss = "not recorded";
    for (auto it = t.loss_by_time.rbegin(); it != t.loss_by_time.rend(); ++it) {
      if (std::isfinite(it->second)) {
        loss = fmt::format("{:.4f} at {:.1f} s", it->second, it->first);
        break;
      }
    }
    table_row(&out, "last training loss", xml_escape(loss));
  }
  const std::string unit = "nats/" + t.loss_unit;
  std::string validation = "not recorded (the run writes it once, after training)";
  if (t.validation_loss) {
    validation = fmt::format("<b id=\"validation-loss\">{:.4f}</b> {}", *t.validation_loss, unit);
  } else if (t.finished) {
    validation = "not recorded";
  }
  if (t.finished) {
    const std::string note = string_or(*t.last_step, "validation_note");
    if (!note.empty()) validation += " (" + xml_escape(note) + ")";
  }
  table_row(&out, "final validation loss", validation);
  for (const auto& [name, value] : t.validation_metrics) {
    table_row(&out, "final validation " + name,
              fmt::format("<b id=\"validation-{}\">{:.4f}</b>", name, value));
  }
  table_row(&out, "replica hashes", xml_escape(replica_text(t)));
  std::string checkpoints;
  if (run.checkpoints.empty()) {
    checkpoints = "none in " + xml_escape((fs::path(run.run_dir) / "checkpoints").string());
  } else {
    for (const CheckpointFile& c : run.checkpoints) {
      checkpoints += fmt::format("<code>{}</code> ({:.1f} KiB)<br>", xml_escape(absolute(c.path)),
                                 static_cast<double>(c.bytes) / 1024);
    }
  }
  if (run.config.is_object() && run.config.contains("checkpoint_every")) {
    checkpoints += xml_escape(fmt::format(" every {} global steps", show(run.config["checkpoint_every"])));
  }
  table_row(&out, "checkpoints", checkpoints);
  table_row(&out, "peer logs", fmt::format("<a href=\"peers/\">{}</a>", xml_escape((fs::path(run.run_dir) / "peers").string())));
  return out + "</table>\n";
}

std::string ledger_html(const RunTimeline& t) {
  std::string out = "<h2>Ledger</h2>\n";
  if (!t.last_step) return out + "<p class=\"not-recorded\">Not recorded: no step record yet.</p>\n";
  out += t.finished ? "<p>The run's final record:</p>\n"
                    : "<p>The run wrote no final record; its last step record:</p>\n";
  out += record_table(*t.last_step, "ledger");
  if (t.stage_samples.empty()) {
    out += "<p class=\"not-recorded\">Sample ledgers per stage: not recorded (written once, after training).</p>\n";
    return out;
  }
  out += "<h3>Samples per stage</h3>\n<table class=\"grid\" id=\"stage-samples\"><tr><th>stage</th>"
         "<th>accumulated</th><th>of completed</th><th>stepped</th><th>in round</th><th>pending</th>"
         "<th>lost: re-sync</th><th>non-finite</th><th>failed rounds</th><th>moved</th>"
         "<th>refused: duplicates</th><th>expired</th><th>peers answered</th><th>silent</th></tr>\n";
  for (const auto& [stage, r] : t.stage_samples) {
    out += fmt::format("<tr><td>{}</td>", stage);
    for (const char* key : {"samples_accumulated_total", "samples_completed", "samples_stepped", "samples_in_round",
                            "samples_pending", "samples_lost_resync", "samples_lost_nonfinite",
                            "samples_lost_failed_round", "samples_lost_moved", "backward_duplicates_refused",
                            "expired_dropped", "peers_answered", "peers_silent"}) {
      out += fmt::format("<td>{}</td>", xml_escape(r.contains(key) ? show(r[key]) : "-"));
    }
    out += "</tr>\n";
  }
  return out + "</table>\n";
}

std::string replicas_html(const RunTimeline& t) {
  std::string out = fmt::format("<h2>Replica hashes</h2>\n<p id=\"replica-agreement\">{}.</p>\n",
                                xml_escape(replica_text(t)));
  if (t.mismatched_steps.empty()) return out;
  out += "<p>Differing: ";
  for (size_t i = 0; i < t.mismatched_steps.size() && i < kMaxMismatchesListed; ++i) {
    out += fmt::format("{}stage {} step {}", i ? ", " : "", t.mismatched_steps[i].first, t.mismatched_steps[i].second);
  }
  if (t.mismatched_steps.size() > kMaxMismatchesListed) {
    out += fmt::format(" and {} more", t.mismatched_steps.size() - kMaxMismatchesListed);
  }
  return out + "</p>\n";
}

std::string peers_html(const RunTimeline& t) {
  std::string out = "<h2>Peers</h2>\n";
  if (t.peers.empty()) return out + "<p class=\"not-recorded\">Not recorded: no peer record yet.</p>\n";
  out += "<table class=\"grid\" id=\"peers\"><tr><th>peer</th><th>stage</th><th>forward</th><th>backward</th>"
         "<th>failures</th><th>throughput (samples/s)</th><th>last seen</th></tr>\n";
  for (const auto& [peer, r] : t.peers) {
    out += fmt::format("<tr><td>{}</td>", xml_escape(peer));
    for (const char* key : {"stage", "forward", "backward", "failures", "throughput"}) {
      out += fmt::format("<td>{}</td>", xml_escape(r.contains(key) ? show(r[key]) : "-"));
    }
    out += fmt::format("<td>{:.1f} s</td></tr>\n", number_or(r, "time", kNaN));
  }
  return out + "</table>\n";
}

std::string events_html(const RunTimeline& t) {
  std::string out = "<h2>Events</h2>\n";
  if (t.events.empty()) return out + "<p class=\"not-recorded\">None recorded.</p>\n";
  out += "<table class=\"grid\" id=\"events\"><tr><th>time</th><th>event</th><th>peer</th><th>stage</th>"
         "<th>detail</th></tr>\n";
  for (size_t i = 0; i < t.events.size() && i < kMaxEventRows; ++i) {
    const RunEvent& e = t.events[i];
    const std::string stage = e.event == "peer_moved" ? fmt::format("{} &rarr; {}", e.from_stage, e.stage)
                              : e.stage >= 0          ? std::to_string(e.stage)
                                                      : std::string();
    out += fmt::format("<tr><td>{:.1f} s</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n", e.time,
                       xml_escape(e.event), xml_escape(e.peer), stage, xml_escape(e.detail));
  }
  out += "</table>\n";
  if (t.events.size() > kMaxEventRows) {
    out += fmt::format("<p>and {} more events (metrics.jsonl has them all).</p>\n", t.events.size() - kMaxEventRows);
  }
  return out;
}

std::string config_html(const RunRecords& run) {
  std::string out = "<h2>Config</h2>\n";
  if (!run.config.is_object()) {
    return out + fmt::format("<p class=\"not-recorded\">{}</p>\n", xml_escape(run.config_problem));
  }
  return out + record_table(run.config, "config");
}

std::string notes_html(const RunRecords& run, const RunTimeline& t) {
  std::vector<std::string> notes;
  if (run.last_line_partial) notes.push_back("metrics.jsonl ends inside a record (left out): the run was writing it, or crashed");
  if (run.skipped_lines > 0) notes.push_back(fmt::format("{} lines of metrics.jsonl are not records (left out)", run.skipped_lines));
  for (const auto& [kind, n] : t.unknown_kinds) {
    notes.push_back(fmt::format("{} records of kind \"{}\", which this page does not show", n, kind));
  }
  if (notes.empty()) return "";
  std::string out = "<h2>Notes</h2>\n<ul id=\"notes\">\n";
  for (const std::string& n : notes) out += fmt::format("<li>{}</li>\n", xml_escape(n));
  return out + "</ul>\n";
}

// "swarm-run" for swarm-run, swarm-run/ or /x/swarm-run.
std::string run_name(const std::string& run_dir) {
  fs::path path(run_dir);
  if (path.filename().empty()) path = path.parent_path();
  const std::string name = path.filename().string();
  return name.empty() ? run_dir : name;
}

constexpr const char* kStyle = R"(body{font-family:sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}h3{font-size:1em}
table{border-collapse:collapse;background:white;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}
table.kv th{background:#f0f0f0;font-weight:normal;white-space:nowrap}
table.grid th{background:#f0f0f0}
.plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:14px}
figure.plot{margin:0;background:white;border:1px solid #ddd;padding:6px}
figure.plot svg{width:100%;height:auto;display:block}
figcaption{font-size:12px;color:#555;margin-top:4px}
.no-data{height:280px;display:flex;flex-direction:column;justify-content:center;align-items:center;color:#777}
.not-recorded{color:#777}
)";

}  // namespace

void parse_metrics(std::string_view text, RunRecords* run) {
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = text.find('\n', at);
    const bool complete = end != std::string_view::npos;
    const std::string_view line = text.substr(at, complete ? end - at : std::string_view::npos);
    at = complete ? end + 1 : text.size();
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    json record = json::parse(line.begin(), line.end(), nullptr, false);
    const bool usable = !record.is_discarded() && record.is_object() && record.contains("kind") &&
                        record["kind"].is_string() && record.contains("time") && record["time"].is_number() &&
                        std::isfinite(record["time"].get<double>());
    if (usable) {
      run->records.push_back(std::move(record));
    } else if (complete) {
      ++run->skipped_lines;
    } else {
      run->last_line_partial = true;
    }
  }
}

Result<RunRecords> read_run_records(const std::string& run_dir) {
  std::error_code error;
  if (!fs::is_directory(run_dir, error)) return not_found("no run directory {}", run_dir);
  const fs::path metrics = fs::path(run_dir) / "metrics.jsonl";
  std::ifstream in(metrics, std::ios::binary);
  if (!in) return not_found("{} has no metrics.jsonl (is it a swarm local run directory?)", run_dir);
  RunRecords run;
  run.run_dir = run_dir;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  parse_metrics(text, &run);

  std::ifstream config_in(fs::path(run_dir) / "config.json");
  if (!config_in) {
    run.config_problem = "config.json is missing";
  } else {
    json config = json::parse(config_in, nullptr, false);
    if (config.is_discarded() || !config.is_object()) {
      run.config_problem = "config.json is not a JSON object";
    } else {
      run.config = std::move(config);
    }
  }

  for (const auto& entry : fs::directory_iterator(fs::path(run_dir) / "checkpoints", error)) {
    if (!entry.is_regular_file(error) || entry.path().extension() != ".ckpt") continue;
    const auto bytes = entry.file_size(error);
    run.checkpoints.push_back({entry.path().string(), error ? 0 : static_cast<int64_t>(bytes)});
  }
  std::sort(run.checkpoints.begin(), run.checkpoints.end(),
            [](const CheckpointFile& a, const CheckpointFile& b) { return a.path < b.path; });

  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char stamp[64];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S %Z", &local);
  run.written_at = stamp;
  return run;
}

RunTimeline build_timeline(const RunRecords& run) { return TimelineBuilder(run).build(); }

std::string render_report_html(const RunRecords& run) {
  const RunTimeline t = build_timeline(run);
  std::string out = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  // A run still going refreshes its report: the page reloads itself (no script needed).
  if (!t.finished) out += "<meta http-equiv=\"refresh\" content=\"15\">\n";
  out += fmt::format("<title>swarm run {}</title>\n<style>{}</style>\n</head>\n<body>\n",
                     xml_escape(run_name(run.run_dir)), kStyle);
  out += fmt::format("<h1>swarm run <code>{}</code></h1>\n<p>Report written {} from config.json and metrics.jsonl{}.</p>\n",
                     xml_escape(run.run_dir), xml_escape(run.written_at),
                     t.finished ? "" : "; it reloads every 15 s until the run's final record");
  out += summary_html(run, t);
  out += "<h2>Plots</h2>\n<div class=\"plots\">\n";
  for (const Plot& plot : plots(t)) out += plot_html(plot);
  out += "</div>\n";
  out += ledger_html(t);
  out += replicas_html(t);
  out += config_html(run);
  out += peers_html(t);
  out += events_html(t);
  out += notes_html(run, t);
  return out + "</body>\n</html>\n";
}

std::string run_report_path(const std::string& run_dir) { return (fs::path(run_dir) / "report.html").string(); }

Status write_run_report(const std::string& run_dir) {
  SWARM_ASSIGN_OR_RETURN(const RunRecords run, read_run_records(run_dir));
  const std::string html = render_report_html(run);
  // Unique per process and call: a refresh during the run and `swarm report` may overlap.
  static std::atomic<int> counter{0};
  const fs::path tmp = fs::path(run_dir) / fmt::format(".report.html.{}.{}.tmp", ::getpid(), counter++);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << html;
    out.close();
    if (!out) {
      std::error_code ignored;
      fs::remove(tmp, ignored);
      return permission_denied("cannot write {}", tmp.string());
    }
  }
  std::error_code error;
  fs::rename(tmp, run_report_path(run_dir), error);
  if (error) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    return permission_denied("cannot rename {} to {}: {}", tmp.string(), run_report_path(run_dir), error.message());
  }
  return Status::ok();
}

int report_command(const std::string& run_dir) {
  const Status status = write_run_report(run_dir);
  if (!status.is_ok()) {
    std::fprintf(stderr, "swarm report: %s\n", status.to_string().c_str());
    return 1;
  }
  std::printf("%s\n", run_report_path(run_dir).c_str());
  return 0;
}

}  // namespace swarm::apps
