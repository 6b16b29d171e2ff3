// report.html of a real run, rendered by a real browser. `swarm local` trains a tiny
// model with a peer killed by chaos, `swarm report` writes the page, and headless
// Chromium lays it out: a probe script appended to a copy of the page measures what
// was drawn (each plot's <svg> on screen, its lines' points and boxes, the event
// markers), and --dump-dom brings the measurements back. The report itself has no
// script. A screenshot goes to the test's undeclared outputs.
//
// Skips (passes, saying "skipped:") only when no Chromium is installed.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <doctest/doctest.h>

namespace {

namespace fs = std::filesystem;

// The binary under test, relative to the test's working directory (the runfiles root).
constexpr const char* kSwarm = "apps/swarm";

struct Ran {
  int exit_code = -1;
  std::string output;
};

// A shell command to its end: its stdout (add 2>&1 for stderr) and exit code.
Ran run(const std::string& command) {
  Ran ran;
  FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[4096];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) ran.output.append(buffer, n);
  const int status = ::pclose(pipe);
  ran.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return ran;
}

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

fs::path scratch(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(base ? base : "/tmp") / name;
  fs::remove_all(dir);
  return dir;
}

// Debian's chromium, or another Chromium-family browser where one is installed.
std::string find_browser() {
  if (const char* given = std::getenv("SWARM_TEST_BROWSER")) return given;
  for (const char* path : {"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome",
                           "/usr/bin/google-chrome-stable"}) {
    if (::access(path, X_OK) == 0) return path;
  }
  return "";
}

// Headless Chromium as root in a sandbox: its own profile and home under the test's
// temporary directory, no GPU, no crash reporter; `timeout` bounds a browser that hangs.
std::string browser_command(const std::string& browser, const fs::path& home, const std::string& what,
                            const fs::path& page) {
  return fmt::format(
      "HOME={0} XDG_CONFIG_HOME={0} XDG_CACHE_HOME={0} timeout -k 5 60 {1} --headless --disable-gpu --no-sandbox "
      "--disable-dev-shm-usage --no-first-run --no-default-browser-check --disable-extensions --disable-breakpad "
      "--user-data-dir={0}/profile --window-size=1400,2600 {2} file://{3} 2>>{0}/browser.log",
      home.string(), browser, what, fs::absolute(page).string());
}

// Measures, after layout, what each plot drew; the result is a <pre id="probe"> of JSON.
constexpr const char* kProbe = R"(<script>
const plots = [];
for (const fig of document.querySelectorAll('figure.plot')) {
  const svg = fig.querySelector('svg');
  const entry = {id: fig.dataset.plot, svg: svg !== null, svg_id: svg ? svg.id : '',
                 no_data: fig.querySelector('.no-data') !== null, lines: [], markers: []};
  if (svg) {
    const box = svg.getBoundingClientRect();
    entry.width = box.width;
    entry.height = box.height;
    for (const line of svg.querySelectorAll('g.series polyline')) {
      const b = line.getBoundingClientRect();
      entry.lines.push({points: line.points.numberOfItems, width: b.width, height: b.height,
                        length: line.getTotalLength()});
    }
    for (const marker of svg.querySelectorAll('g.marker')) {
      const b = marker.querySelector('line').getBoundingClientRect();
      entry.markers.push({height: b.height, title: marker.querySelector('title').textContent});
    }
  }
  plots.push(entry);
}
const pre = document.createElement('pre');
pre.id = 'probe';
pre.textContent = JSON.stringify({plots: plots, scripts: document.scripts.length});
document.body.appendChild(pre);
</script>
)";

std::string html_unescape(std::string text) {
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"&quot;", "\""}, {"&lt;", "<"}, {"&gt;", ">"}, {"&#39;", "'"}, {"&amp;", "&"}}) {
    for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
      text.replace(at, from.size(), to);
    }
  }
  return text;
}

TEST_CASE("a real run's report.html, laid out by headless Chromium, draws every plot and the event markers") {
  const std::string browser = find_browser();
  if (browser.empty()) {
    std::printf("skipped: no Chromium found (Debian package chromium; ./bazelw installs it)\n");
    return;
  }
  const fs::path home = scratch("report-browser");
  fs::create_directories(home);
  const fs::path dir = home / "run";

  // A tiny swarm: 2 stages x 2 peers, one of stage 1's peers killed 4 s into training.
  const Ran local = run(fmt::format(
      "{} local --run-dir {} --d-model 32 --layers 2 --heads 2 --seq-len 32 --microbatch 4 "
      "--microbatches-per-step 4 --eval-windows 8 --steps 100000 --peers-per-stage 2 --time-limit 12 "
      "--forward-timeout 1.5 --backward-timeout 2.5 --chaos kill-peer:1:4 2>&1",
      kSwarm, dir.string()));
  INFO(local.output);
  REQUIRE(local.exit_code == 0);

  // `swarm report`: the page's path on stdout; a clear error and status 1 without a run.
  const Ran report = run(fmt::format("{} report {} 2>&1", kSwarm, dir.string()));
  INFO(report.output);
  REQUIRE(report.exit_code == 0);
  const fs::path page = dir / "report.html";
  CHECK(report.output == page.string() + "\n");
  REQUIRE(fs::exists(page));
  const Ran missing = run(fmt::format("{} report {} 2>&1", kSwarm, (home / "absent").string()));
  CHECK(missing.exit_code == 1);
  CHECK(missing.output.find("swarm report: not_found: no run directory") != std::string::npos);
  fs::create_directories(home / "empty");
  const Ran no_metrics = run(fmt::format("{} report {} 2>&1", kSwarm, (home / "empty").string()));
  CHECK(no_metrics.exit_code == 1);
  CHECK(no_metrics.output.find("has no metrics.jsonl") != std::string::npos);

  const std::string html = read_all(page);
  REQUIRE(html.find("</body>") != std::string::npos);
  CHECK(html.find("<script") == std::string::npos);
  const fs::path probe = home / "probe.html";
  std::ofstream(probe) << std::string(html).insert(html.rfind("</body>"), kProbe);

  const Ran dom = run(browser_command(browser, home, "--dump-dom", probe));
  INFO("browser log: " << read_all(home / "browser.log"));
  REQUIRE(dom.exit_code == 0);
  const size_t open = dom.output.find("<pre id=\"probe\">");
  REQUIRE(open != std::string::npos);
  const size_t begin = open + std::string("<pre id=\"probe\">").size();
  const nlohmann::json measured =
      nlohmann::json::parse(html_unescape(dom.output.substr(begin, dom.output.find("</pre>", begin) - begin)));
  INFO("measured: " << measured.dump());
  CHECK(measured["scripts"] == 1);  // the probe's own

  const std::vector<std::string> expected = {"plot-loss-time", "plot-loss-tokens", "plot-tokens-per-s", "plot-peers",
                                             "plot-global-steps", "plot-failures", "plot-wire"};
  REQUIRE(measured["plots"].size() == expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const nlohmann::json& plot = measured["plots"][i];
    INFO("plot " << expected[i]);
    CHECK(plot["id"] == expected[i]);
    // This run has data for every plot: each is an <svg> laid out on screen with a line of 2+ points drawn.
    REQUIRE(plot["svg"] == true);
    CHECK(plot["svg_id"] == expected[i]);
    CHECK_FALSE(plot["no_data"].get<bool>());
    CHECK(plot["width"].get<double>() > 300);
    CHECK(plot["height"].get<double>() > 150);
    int drawn = 0;
    for (const auto& line : plot["lines"]) {
      if (line["points"].get<int>() >= 2 && line["length"].get<double>() > 10 &&
          (line["width"].get<double>() > 0 || line["height"].get<double>() > 0)) {
        ++drawn;
      }
    }
    CHECK(drawn >= 1);
    // Time axes carry the event markers: the 4 peers' joins and the chaos kill at least.
    if (expected[i] != "plot-loss-tokens") {
      CHECK(plot["markers"].size() >= 5);
      int chaos = 0, joined = 0;
      for (const auto& marker : plot["markers"]) {
        CHECK(marker["height"].get<double>() > 100);
        const std::string title = marker["title"];
        if (title.find("chaos_kill-peer") != std::string::npos) ++chaos;
        if (title.find("peer_joined") != std::string::npos) ++joined;
      }
      CHECK(chaos == 1);
      CHECK(joined >= 4);
    } else {
      CHECK(plot["markers"].empty());
    }
  }
  std::printf("drawn: %zu plots in %s, %zu event markers on each time axis\n", expected.size(), browser.c_str(),
              measured["plots"][0]["markers"].size());

  // A screenshot of the page itself (no probe), kept with the test's outputs.
  const char* outputs = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  const fs::path shot = fs::path(outputs ? outputs : home.string()) / "report.png";
  const Ran screenshot = run(browser_command(browser, home, fmt::format("--screenshot={}", shot.string()), page));
  CHECK(screenshot.exit_code == 0);
  REQUIRE(fs::exists(shot));
  CHECK(fs::file_size(shot) > 50000);  // a page of plots and tables, not a blank one
  std::printf("screenshot: %s (%ju bytes)\n", shot.string().c_str(), static_cast<uintmax_t>(fs::file_size(shot)));
}

}  // namespace
