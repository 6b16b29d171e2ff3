// live_view: what `swarm local` shows while it runs.
//
// In a terminal: one status block, redrawn in place at most twice a second,
// with the last few events (a peer lost or joined, a move, chaos) below it.
// Elsewhere (a log file, a pipe): plain lines, every event as it happens and
// the status at most every 10 s, as logs want. Before the first status, and in
// a log always, events are ordinary lines.
//
// A pure policy: it returns the text to write and never reads a clock; the
// caller passes `now` (seconds on any steady clock) and writes the text.
//
//   LiveView view({.terminal = isatty(1)});
//   fputs(view.status("step 3/600 | loss 5.1\nstages ...", now).c_str(), stdout);
//   fputs(view.event("chaos: kill-peer stage 1", now).c_str(), stdout);
//   fputs(view.finish().c_str(), stdout);
#pragma once

#include <cstddef>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

namespace swarm::apps {

struct LiveViewConfig {
  bool terminal = false;
  double redraw_seconds = 0.5;       // terminal: at most one redraw per this
  double log_status_seconds = 10.0;  // elsewhere: at most one status line per this
  size_t events_shown = 5;           // terminal: the last events under the block
};

class LiveView {
 public:
  explicit LiveView(LiveViewConfig config) : config_(config) {}

  // A new status: lines separated by '\n' (one line, " | "-joined, in a log).
  std::string status(std::string_view text, double now);
  // Something that happened.
  std::string event(std::string_view line, double now);
  // The last status and events as they stand (the terminal's block redrawn if
  // it changed since it was drawn); afterwards plain lines follow below it.
  std::string finish();

 private:
  std::string redraw();
  std::vector<std::string> block_lines() const;

  LiveViewConfig config_;
  std::string status_;               // the latest status text
  std::deque<std::string> events_;   // terminal: the last events_shown
  size_t drawn_lines_ = 0;           // terminal: lines of the block on screen
  bool drawn_ = false;               // terminal: a block is on screen
  bool dirty_ = false;               // terminal: changed since it was drawn
  bool finished_ = false;
  double last_draw_ = -1e300;        // terminal: redraw; log: status line
};

}  // namespace swarm::apps
