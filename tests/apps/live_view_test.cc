// The live view's policy, with a fake clock: in a terminal one block redrawn in
// place at most twice a second with the last events under it (checked on a
// small emulated screen that applies the escape codes); in a log, every event
// and at most one status line per 10 s, and the last status at the end.
#include "apps/live_view.h"

#include <algorithm>
#include <string>
#include <vector>

#include <doctest/doctest.h>

namespace swarm::apps {
namespace {

// Applies text to a screen as a terminal would, for the codes the view uses:
// "\x1b[NF" (up N lines, to column 0), "\x1b[2K" (clear the line), '\n'.
class Screen {
 public:
  void write(const std::string& text) {
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '\x1b' && text.compare(i, 4, "\x1b[2K") == 0) {
        line().clear();
        i += 3;
      } else if (text[i] == '\x1b' && i + 1 < text.size() && text[i + 1] == '[') {
        const size_t end = text.find('F', i);
        REQUIRE(end != std::string::npos);
        row_ -= std::stoi(text.substr(i + 2, end - i - 2));
        REQUIRE(row_ >= 0);
        i = end;
      } else if (text[i] == '\n') {
        ++row_;
      } else {
        line() += text[i];
      }
    }
  }
  // The lines written so far, without the empty one under the cursor.
  std::vector<std::string> lines() const {
    std::vector<std::string> out = rows_;
    while (!out.empty() && out.back().empty()) out.pop_back();
    return out;
  }

 private:
  std::string& line() {
    if (rows_.size() <= static_cast<size_t>(row_)) rows_.resize(row_ + 1);
    return rows_[row_];
  }
  std::vector<std::string> rows_;
  int row_ = 0;
};

TEST_CASE("in a terminal: one block, redrawn in place at most twice a second, the last events below it") {
  LiveView view({.terminal = true});
  Screen screen;
  screen.write(view.event("registry: OpenDHT", 0.0));  // before the block: an ordinary line
  screen.write(view.status("step 1/600 | loss 5.5\nstages: 2,2\nretries 0", 1.0));
  CHECK(screen.lines() == std::vector<std::string>{"registry: OpenDHT", "step 1/600 | loss 5.5", "stages: 2,2",
                                                    "retries 0"});
  CHECK(view.status("step 2/600 | loss 5.4\nstages: 2,2\nretries 0", 1.2).empty());  // too soon
  screen.write(view.status("step 3/600 | loss 5.3\nstages: 2,1\nretries 1", 1.6));
  CHECK(screen.lines() == std::vector<std::string>{"registry: OpenDHT", "step 3/600 | loss 5.3", "stages: 2,1",
                                                    "retries 1"});
  for (int e = 0; e < 7; ++e) screen.write(view.event("peer s1p" + std::to_string(e) + " lost", 2.0 + e));
  const std::vector<std::string> expected{"registry: OpenDHT", "step 3/600 | loss 5.3", "stages: 2,1", "retries 1",
                                          "recent events:", "  peer s1p2 lost", "  peer s1p3 lost",
                                          "  peer s1p4 lost", "  peer s1p5 lost", "  peer s1p6 lost"};
  CHECK(screen.lines() == expected);
  // A change held back by the rate is drawn at the end; lines after it go below the block.
  CHECK(view.status("step 600/600 | loss 2.3\nstages: 2,1\nretries 1", 8.2).empty());  // 0.2 s after the last draw
  screen.write(view.finish());
  screen.write(view.event("done: 600 steps", 9.2));
  CHECK(screen.lines().size() == expected.size() + 1);
  CHECK(screen.lines()[1] == "step 600/600 | loss 2.3");
  CHECK(screen.lines().back() == "done: 600 steps");
}

TEST_CASE("in a log: every event, a status line at most every 10 s, and the last status at the end") {
  LiveView view({.terminal = false});
  std::string log;
  for (int step = 1; step <= 600; ++step) {
    log += view.status("step " + std::to_string(step) + "/600\nstages: 2,2", step * 0.125);
    if (step == 250) log += view.event("chaos: kill-peer stage 1", step * 0.125);
  }
  log += view.finish();
  std::vector<std::string> lines;
  for (size_t start = 0, end; (end = log.find('\n', start)) != std::string::npos; start = end + 1) {
    lines.push_back(log.substr(start, end - start));
  }
  CHECK(lines.front() == "step 1/600 | stages: 2,2");
  CHECK(lines.back() == "step 600/600 | stages: 2,2");
  CHECK(std::count(lines.begin(), lines.end(), "chaos: kill-peer stage 1") == 1);
  // 75 s of steps: a line at 0.125 s, then one per 10 s (8 in all), the event, and the last status.
  CHECK(lines.size() == 8 + 1 + 1);
  CHECK(log.find('\x1b') == std::string::npos);
}

}  // namespace
}  // namespace swarm::apps
