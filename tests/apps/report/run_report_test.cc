// report.html from a run directory's records: parsing that tolerates what a
// crash leaves (a partial last line, no final records), null losses, unknown
// kinds and junk; the series derived from them (loss, peers per stage, global
// steps, failures, wire bytes, a resumed run's clock); and a page that escapes
// every text and says "no data" where a plot has none.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "apps/report/run_report.h"

namespace swarm::apps {
namespace {

namespace fs = std::filesystem;

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The <svg> with this id, or "" when the page has none.
std::string svg_of(const std::string& html, const std::string& id) {
  const size_t at = html.find("<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"" + id + "\"");
  if (at == std::string::npos) return "";
  return html.substr(at, html.find("</svg>", at) - at);
}

RunRecords records_of(const std::string& text, nlohmann::json config = nullptr) {
  RunRecords run;
  run.run_dir = "/runs/test";
  run.config = std::move(config);
  if (run.config.is_null()) run.config_problem = "config.json is missing";
  parse_metrics(text, &run);
  return run;
}

const nlohmann::json kConfig = {{"stages", 2}, {"microbatch", 4}, {"checkpoint_every", 25},
                                {"model", {{"max_seq_len", 32}, {"d_model", 32}}}};

// What swarm local writes, in its order: joins, steps, replica hashes, a chaos kill
// and its consequences; cut off mid-record by a crash.
const char* kCrashedRun = R"({"event":"peer_joined","kind":"event","peer":"s0p0","stage":0,"time":0.8}
{"event":"peer_joined","kind":"event","peer":"s0p1","stage":0,"time":0.8}
{"event":"peer_joined","kind":"event","peer":"s1p2","stage":1,"time":0.8}
{"event":"peer_joined","kind":"event","peer":"s1p3","stage":1,"time":0.8}
{"kind":"step","step":1,"loss":5.5,"tokens_per_s":1000,"microbatches_completed":4,"microbatches_abandoned":0,"retries":0,"samples_completed":16,"wire_bytes":16000,"wire_values":15000,"allreduce_bytes":0,"allreduce_values":0,"time":1.0}
{"kind":"global_step","stage":0,"step":1,"time":1.1}
{"hash":"aa","kind":"replica","peer":"s0p0","stage":0,"step":1,"time":1.1}
{"hash":"aa","kind":"replica","peer":"s0p1","stage":0,"step":1,"time":1.1}
{"hash":"bb","kind":"replica","peer":"s1p2","stage":1,"step":1,"time":1.1}
{"hash":"bc","kind":"replica","peer":"s1p3","stage":1,"step":1,"time":1.1}
{"kind":"step","step":2,"loss":null,"tokens_per_s":900,"microbatches_completed":4,"microbatches_abandoned":2,"retries":3,"samples_completed":16,"wire_bytes":20000,"wire_values":19000,"allreduce_bytes":500,"allreduce_values":500,"time":2.0}
{"event":"chaos_kill-peer","kind":"event","peer":"s1p2","stage":1,"time":2.5}
{"detail":"deadline_exceeded: call deadline passed","event":"timed_out","kind":"event","peer":"s1p2","stage":1,"time":3.0}
{"detail":"unavailable: gone","event":"banned","kind":"event","peer":"s1p2","stage":1,"time":3.1}
{"kind":"step","step":3,"loss":4.5,"tokens_per_s":1100,"microbatches_completed":8,"microbatches_abandoned":2,"retries":4,"samples_completed":32,"wire_bytes":32000,"wire_values":30000,"allreduce_bytes":1000,"allreduce_values":1000,"time":3.5}
{"event":"peer_lost","kind":"event","peer":"s1p2","stage":1,"time":4.0}
{"event":"peer_moved","from_stage":0,"kind":"event","peer":"s0p1","time":5.0,"to_stage":1}
{"kind":"step","step":4,"loss":4.0,"tokens_per_s":1200,"microbatch)";

TEST_CASE("a crashed run: a partial last line is left out, and the page says there is no final record") {
  const RunRecords run = records_of(kCrashedRun, kConfig);
  CHECK(run.records.size() == 17);
  CHECK(run.last_line_partial);
  CHECK(run.skipped_lines == 0);

  const RunTimeline t = build_timeline(run);
  CHECK(t.stages == 2);
  CHECK(t.segments == 1);
  CHECK_FALSE(t.finished);
  CHECK_FALSE(t.validation_loss.has_value());
  CHECK(t.end_time == doctest::Approx(5.0));
  REQUIRE(t.loss_by_time.size() == 3);
  CHECK(std::isnan(t.loss_by_time[1].second));  // step 2 completed no microbatch: its loss is null
  // Tokens: samples_completed x max_seq_len.
  CHECK(t.loss_by_tokens[2].first == doctest::Approx(32 * 32));
  CHECK(t.pipeline_bytes_per_token.back().second == doctest::Approx(32000.0 / (32 * 32)));
  CHECK(t.retries.back().second == 4);
  CHECK(t.abandoned.back().second == 2);
  CHECK(t.bans.back().second == 1);
  CHECK(t.timeouts.back().second == 1);
  // Peers per stage: 2 and 2, then stage 1 loses s1p2 and gains s0p1 from stage 0.
  CHECK(t.peers_per_stage[0].back().second == 1);
  CHECK(t.peers_per_stage[1].back().second == 2);
  bool stage1_had_one = false;
  for (const auto& [time, n] : t.peers_per_stage[1]) stage1_had_one = stage1_had_one || (n == 1 && time == 4.0);
  CHECK(stage1_had_one);
  // Replicas: stage 1's two hashes at step 1 differ.
  CHECK(t.hashed_steps == 2);
  CHECK(t.shared_steps == 2);
  REQUIRE(t.mismatched_steps.size() == 1);
  CHECK(t.mismatched_steps[0] == std::make_pair(1, int64_t{1}));
  CHECK(t.global_step[0].front().second == 1);

  const std::string html = render_report_html(run);
  CHECK(html.find("no final record") != std::string::npos);
  CHECK(html.find("final validation loss</th><td>not recorded") != std::string::npos);
  CHECK(html.find("ends inside a record") != std::string::npos);
  CHECK(html.find("1 differ") != std::string::npos);
  CHECK(html.find("http-equiv=\"refresh\"") != std::string::npos);  // still going, perhaps: it reloads
  for (const char* id : {"plot-loss-time", "plot-loss-tokens", "plot-tokens-per-s", "plot-peers", "plot-global-steps",
                         "plot-failures", "plot-wire"}) {
    INFO(id);
    const std::string svg = svg_of(html, id);
    REQUIRE_FALSE(svg.empty());
    CHECK(count(svg, "<polyline") >= 1);
    CHECK(svg.find("nan") == std::string::npos);
    CHECK(svg.find("inf") == std::string::npos);
  }
  // Chaos, peer lost, joined and moved are marked on the time axes, not on the token axis.
  CHECK(count(svg_of(html, "plot-loss-time"), "<g class=\"marker\">") == 7);
  CHECK(count(svg_of(html, "plot-loss-tokens"), "<g class=\"marker\">") == 0);
  CHECK(svg_of(html, "plot-peers").find("chaos_kill-peer s1p2") != std::string::npos);
  // No script, nothing from the network.
  CHECK(html.find("<script") == std::string::npos);
  CHECK(count(html, "http://") == count(html, "http://www.w3.org/2000/svg"));  // the SVG namespace only
  CHECK(html.find("https://") == std::string::npos);
}

TEST_CASE("a finished run: its final record gives the validation loss and the ledger, and is not a step") {
  std::string text = kCrashedRun;
  text.resize(text.rfind('\n') + 1);  // without the partial line
  text += R"({"kind":"stage_samples","stage":0,"samples_accumulated_total":32,"samples_completed":32,"peers_answered":2,"peers_silent":0,"time":6.0})"
          "\n"
          R"({"kind":"step","step":3,"loss":4.5,"validation_loss":4.25,"tokens_per_s":950,"microbatches_completed":8,"microbatches_abandoned":2,"retries":4,"wire_bytes":32000,"wire_values":30000,"allreduce_bytes":1000,"allreduce_values":1000,"time":6.5})"
          "\n";
  const RunRecords run = records_of(text, kConfig);
  CHECK_FALSE(run.last_line_partial);
  const RunTimeline t = build_timeline(run);
  CHECK(t.finished);
  REQUIRE(t.validation_loss.has_value());
  CHECK(*t.validation_loss == doctest::Approx(4.25));
  CHECK(t.loss_by_time.size() == 3);       // the final record is no fourth step
  CHECK(t.tokens_per_second.size() == 3);  // nor is its run-average rate a step's
  REQUIRE(t.validation_by_tokens.size() == 1);
  CHECK(t.validation_by_tokens[0].first == doctest::Approx(32 * 32));
  const std::string html = render_report_html(run);
  CHECK(html.find("<b id=\"validation-loss\">4.2500</b> nats/byte") != std::string::npos);
  CHECK(html.find("finished: the run wrote its final record") != std::string::npos);
  CHECK(html.find("http-equiv=\"refresh\"") == std::string::npos);
  CHECK(html.find("id=\"stage-samples\"") != std::string::npos);
  CHECK(html.find("<tr><th>validation_loss</th><td>4.25</td></tr>") != std::string::npos);
}

TEST_CASE("a final record whose validation was cut short: no validation loss, and the reasons shown") {
  const RunRecords run = records_of(
      R"({"kind":"step","step":1,"loss":3.0,"tokens_per_s":10,"samples_completed":4,"time":1.0}
{"kind":"step","step":2,"loss":2.5,"tokens_per_s":12,"samples_completed":8,"time":2.0}
{"kind":"step","step":2,"loss":2.5,"validation_loss":null,"validation_windows":0,"validation_note":"cut short by --time-limit","stopped_because":"time limit <90 s>","tokens_per_s":11,"time":3.0}
)",
      kConfig);
  const RunTimeline t = build_timeline(run);
  CHECK(t.finished);
  CHECK_FALSE(t.validation_loss.has_value());
  CHECK(t.validation_by_time.empty());
  CHECK(t.loss_by_time.size() == 2);
  const std::string html = render_report_html(run);
  CHECK(html.find("it stopped because: time limit &lt;90 s&gt;") != std::string::npos);
  CHECK(html.find("final validation loss</th><td>not recorded (cut short by --time-limit)") != std::string::npos);
}

TEST_CASE("null and non-numeric losses are gaps; a run without any loss says so in the plot's place") {
  const RunRecords run = records_of(
      R"({"kind":"step","step":1,"loss":null,"tokens_per_s":0,"microbatches_completed":0,"microbatches_abandoned":4,"retries":8,"samples_completed":0,"time":1.0}
{"kind":"step","step":2,"loss":"NaN","tokens_per_s":0,"microbatches_completed":0,"microbatches_abandoned":8,"retries":16,"samples_completed":0,"time":2.0}
)",
      kConfig);
  const RunTimeline t = build_timeline(run);
  REQUIRE(t.loss_by_time.size() == 2);
  CHECK(std::isnan(t.loss_by_time[0].second));
  CHECK(std::isnan(t.loss_by_time[1].second));
  CHECK(t.pipeline_bytes_per_token.empty());  // no sample completed: no bytes per token
  const std::string html = render_report_html(run);
  CHECK(svg_of(html, "plot-loss-time").empty());
  CHECK(html.find("<div class=\"no-data\" id=\"plot-loss-time\"><h3>Loss against time</h3><p>No data: no step recorded a "
                  "loss yet</p></div>") != std::string::npos);
  CHECK(html.find("id=\"plot-wire\"><h3>") != std::string::npos);  // no data there either
  CHECK_FALSE(svg_of(html, "plot-failures").empty());              // but the abandoned microbatches are plotted
  CHECK(html.find(">nan<") == std::string::npos);
}

TEST_CASE("an empty metrics.jsonl: every plot says it has no data, and nothing is invented") {
  const RunRecords run = records_of("", kConfig);
  CHECK(run.records.empty());
  const RunTimeline t = build_timeline(run);
  CHECK(t.segments == 0);
  CHECK_FALSE(t.last_step.has_value());
  const std::string html = render_report_html(run);
  CHECK(html.find("nothing recorded yet") != std::string::npos);
  CHECK(count(html, "<div class=\"no-data\"") == 7);
  CHECK(count(html, "<svg") == 0);
  CHECK(html.find("Not recorded: no step record yet.") != std::string::npos);
  CHECK(html.find("</html>") != std::string::npos);
}

TEST_CASE("unknown kinds are ignored and noted; junk lines are counted, not fatal") {
  const RunRecords run = records_of(R"({"kind":"mystery","time":1.0,"loss":99}
not json at all
{"kind":"step"}
[1, 2, 3]
{"kind":"step","step":1,"loss":3.0,"tokens_per_s":10,"samples_completed":4,"time":2.0}

{"kind":"step","step":2,"loss":2.0,"tokens_per_s":10,"samples_completed":8,"time":3.0}
)",
                                    kConfig);
  CHECK(run.records.size() == 3);
  CHECK(run.skipped_lines == 3);  // not JSON, no time, not an object; the blank line is nothing
  CHECK_FALSE(run.last_line_partial);
  const RunTimeline t = build_timeline(run);
  CHECK(t.loss_by_time.size() == 2);  // the mystery record's loss is not a step's
  CHECK(t.unknown_kinds.at("mystery") == 1);
  const std::string html = render_report_html(run);
  CHECK(html.find("1 records of kind &quot;mystery&quot;") != std::string::npos);
  CHECK(html.find("3 lines of metrics.jsonl are not records") != std::string::npos);
}

TEST_CASE("config strings, peer ids and event details are HTML-escaped") {
  nlohmann::json config = kConfig;
  config["chaos"] = "<script>alert('x')</script>";
  config["data"] = "/data/a&b \"quoted\"";
  const RunRecords run = records_of(
      R"({"event":"banned","kind":"event","peer":"<b>evil</b>","stage":0,"detail":"<img src=x onerror=alert(1)>","time":1.0}
{"kind":"step","step":1,"loss":3.0,"tokens_per_s":10,"samples_completed":4,"time":2.0}
)",
      config);
  const std::string html = render_report_html(run);
  CHECK(html.find("<script") == std::string::npos);
  CHECK(html.find("<img") == std::string::npos);
  CHECK(html.find("<b>evil</b>") == std::string::npos);
  CHECK(html.find("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;") != std::string::npos);
  CHECK(html.find("/data/a&amp;b &quot;quoted&quot;") != std::string::npos);
  CHECK(html.find("&lt;b&gt;evil&lt;/b&gt;") != std::string::npos);
  CHECK(html.find("<tr><th>model.max_seq_len</th><td>32</td></tr>") != std::string::npos);
}

TEST_CASE("a resumed run: its clock restarting at 0 continues the time axis, and its counters continue") {
  const RunRecords run = records_of(R"({"event":"peer_joined","kind":"event","peer":"s0p0","stage":0,"time":0.5}
{"kind":"step","step":1,"loss":3.0,"tokens_per_s":10,"samples_completed":16,"retries":2,"microbatches_abandoned":0,"wire_bytes":100,"time":1.0}
{"kind":"step","step":2,"loss":2.9,"tokens_per_s":10,"samples_completed":32,"retries":3,"microbatches_abandoned":0,"wire_bytes":200,"time":10.0}
{"event":"peer_joined","kind":"event","peer":"s0p1","stage":0,"time":0.7}
{"event":"resumed","kind":"event","peer":"","step":2,"time":0.8}
{"kind":"step","step":3,"loss":2.8,"tokens_per_s":10,"samples_completed":16,"retries":1,"microbatches_abandoned":0,"wire_bytes":100,"time":2.0}
)",
                                    kConfig);
  const RunTimeline t = build_timeline(run);
  CHECK(t.segments == 2);
  REQUIRE(t.loss_by_time.size() == 3);
  CHECK(t.loss_by_time[2].first == doctest::Approx(12.0));
  CHECK(t.loss_by_tokens[2].first == doctest::Approx(48 * 32));
  CHECK(t.retries.back().second == 4);
  CHECK(t.pipeline_bytes_per_token.back().second == doctest::Approx(300.0 / (48 * 32)).scale(0));
  // The first segment's peer went with its process; the second segment's joined.
  CHECK(t.peers_per_stage[0].back().second == 1);
  REQUIRE(t.events.size() == 3);
  CHECK(t.events[2].event == "resumed");
  CHECK(t.events[2].time == doctest::Approx(10.8));
  const std::string html = render_report_html(run);
  CHECK(html.find("in 2 segments (resumed 1 times)") != std::string::npos);
  CHECK(svg_of(html, "plot-loss-time").find("<title>10.8 s: resumed</title>") != std::string::npos);
}

TEST_CASE("the global step chart draws the steps the stages vouched for, never one peer's word") {
  // What a run whose metrics hold a forged record's replica hashes at step 2^40 looks like
  // (swarm local wrote such records before it logged vouched steps only).
  const RunRecords run = records_of(R"({"kind":"global_step","stage":0,"step":39,"time":1.0}
{"kind":"replica","peer":"a","stage":0,"step":40,"hash":"40","time":2.0}
{"kind":"replica","peer":"m","stage":0,"step":1099511627776,"hash":"bad","time":2.0}
{"kind":"global_step","stage":0,"step":40,"time":2.0}
{"kind":"replica","peer":"m","stage":1,"step":1099511627776,"hash":"bad","time":2.5}
)", kConfig);
  const RunTimeline t = build_timeline(run);
  REQUIRE(t.global_step.size() == 2);
  REQUIRE_FALSE(t.global_step[0].empty());
  double highest = 0;
  for (const auto& [time, step] : t.global_step[0]) highest = std::max(highest, step);
  CHECK(highest == 40);
  CHECK(t.global_step[1].empty());  // a replica record alone draws nothing
  const std::string svg = svg_of(render_report_html(run), "plot-global-steps");
  CHECK(svg.find("1099511627776") == std::string::npos);
  CHECK(svg.find("1.09951e+12") == std::string::npos);
}

TEST_CASE("without config.json the page says so, and token axes count samples") {
  const RunRecords run = records_of(R"({"kind":"step","step":1,"loss":3.0,"tokens_per_s":10,"samples_completed":4,"time":2.0}
{"kind":"replica","peer":"s3p0","stage":3,"step":1,"hash":"ab","time":2.1}
)");
  const RunTimeline t = build_timeline(run);
  CHECK(t.stages == 4);  // one past the highest stage recorded
  CHECK(t.loss_by_tokens[0].first == 4);
  const std::string html = render_report_html(run);
  CHECK(html.find("config.json is missing") != std::string::npos);
  CHECK(html.find("samples trained") != std::string::npos);
  CHECK(html.find("Samples per second") != std::string::npos);
}

TEST_CASE("a model's own units name the loss, the rate and the axes; odd units are not taken") {
  const char* steps = R"({"kind":"step","step":1,"loss":1.1,"tokens_per_s":8000,"samples_completed":16,"wire_bytes":1600,"time":1.0}
{"kind":"step","step":2,"loss":0.3,"validation_loss":0.08,"tokens_per_s":7000,"samples_completed":32,"time":2.0}
)";
  const nlohmann::json classifier = {{"stages", 2}, {"microbatch", 16}, {"model", nlohmann::json::object()},
                                     {"units", {{"loss", "sample"}, {"rate", "samples"}}}};
  const RunRecords run = records_of(steps, classifier);
  const RunTimeline t = build_timeline(run);
  CHECK(t.loss_unit == "sample");
  CHECK(t.rate_unit == "samples");
  const std::string html = render_report_html(run);
  CHECK(html.find("<b id=\"validation-loss\">0.0800</b> nats/sample") != std::string::npos);
  CHECK(html.find("Samples per second") != std::string::npos);
  CHECK(html.find("samples/s") != std::string::npos);
  CHECK(html.find("samples trained") != std::string::npos);
  CHECK(html.find("bytes/sample") != std::string::npos);
  CHECK(html.find("no sequence length") == std::string::npos);
  for (const char* gpt_word : {"nats/byte", "Tokens per second", "tokens/s", "against tokens"}) {
    CHECK_MESSAGE(html.find(gpt_word) == std::string::npos, gpt_word);
  }
  // A GPT run that names no units keeps the GPT's: nats/byte and tokens.
  const RunTimeline gpt = build_timeline(records_of(steps, kConfig));
  CHECK(gpt.loss_unit == "byte");
  CHECK(gpt.rate_unit == "tokens");
  // Units that are not short words are ignored, never written into the page.
  nlohmann::json odd = classifier;
  odd["units"] = {{"loss", "<script>"}, {"rate", std::string(100, 'x')}};
  const RunRecords odd_run = records_of(steps, odd);
  const RunTimeline odd_t = build_timeline(odd_run);
  CHECK(odd_t.loss_unit == "byte");
  CHECK(odd_t.rate_unit == "samples");
  CHECK(render_report_html(odd_run).find("nats/<script>") == std::string::npos);
}

TEST_CASE("a model's metrics: each step's in a plot, the validation's in the summary; junk names are left out") {
  const char* steps = R"({"kind":"step","step":1,"loss":1.1,"metrics":{"accuracy":0.4,"Bad Name":1,"top_2":"x"},"samples_completed":16,"time":1.0}
{"kind":"step","step":2,"loss":0.3,"metrics":{"accuracy":0.9},"samples_completed":32,"time":2.0}
{"kind":"step","step":2,"loss":0.3,"validation_loss":0.08,"validation_metrics":{"accuracy":0.975,"<script>":1},"time":2.5}
)";
  const RunRecords run = records_of(steps, kConfig);
  const RunTimeline t = build_timeline(run);
  REQUIRE(t.metrics_by_time.size() == 1);
  REQUIRE(t.metrics_by_time.count("accuracy") == 1);
  CHECK(t.metrics_by_time.at("accuracy").size() == 2);
  CHECK(t.metrics_by_time.at("accuracy").back().second == doctest::Approx(0.9));
  REQUIRE(t.validation_metrics.size() == 1);
  CHECK(t.validation_metrics.at("accuracy") == doctest::Approx(0.975));
  const std::string html = render_report_html(run);
  CHECK(html.find("<tr><th>final validation accuracy</th><td><b id=\"validation-accuracy\">0.9750</b></td></tr>") !=
        std::string::npos);
  CHECK_FALSE(svg_of(html, "plot-metrics").empty());
  CHECK(html.find("<script>") == std::string::npos);
  // A run without metrics has no such plot or row.
  const std::string plain = render_report_html(records_of(kCrashedRun, kConfig));
  CHECK(svg_of(plain, "plot-metrics").empty());
  CHECK(plain.find("final validation accuracy") == std::string::npos);
}

fs::path scratch(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(base ? base : "/tmp") / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TEST_CASE("write_run_report writes RUN_DIR/report.html by a rename, and refuses a directory without metrics.jsonl") {
  const fs::path dir = scratch("report-write");
  CHECK(write_run_report((dir / "absent").string()).code() == StatusCode::not_found);
  const Status no_metrics = write_run_report(dir.string());
  CHECK(no_metrics.code() == StatusCode::not_found);
  CHECK(no_metrics.message().find("metrics.jsonl") != std::string::npos);

  std::ofstream(dir / "metrics.jsonl") << kCrashedRun;
  std::ofstream(dir / "config.json") << kConfig.dump(2);
  fs::create_directories(dir / "checkpoints");
  std::ofstream(dir / "checkpoints" / "stage-0.ckpt") << "0123456789";
  REQUIRE(write_run_report(dir.string()).is_ok());
  REQUIRE(write_run_report(dir.string()).is_ok());  // again, over the last one
  std::ifstream in(run_report_path(dir.string()));
  const std::string html((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(html.find("</html>") != std::string::npos);
  CHECK(html.find("stage-0.ckpt</code> (0.0 KiB)") != std::string::npos);
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    INFO(entry.path().string());
    CHECK(entry.path().extension() != ".tmp");  // no temporary file left behind
    ++files;
  }
  CHECK(files == 4);  // metrics.jsonl, config.json, checkpoints, report.html
}

}  // namespace
}  // namespace swarm::apps
