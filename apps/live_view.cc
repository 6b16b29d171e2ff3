#include "apps/live_view.h"

#include <algorithm>

#include <fmt/format.h>

namespace swarm::apps {
namespace {

std::vector<std::string> split_lines(std::string_view text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = text.find('\n', start);
    lines.emplace_back(text.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return lines;
}

std::string joined(std::string_view text) {
  std::string out;
  for (const std::string& line : split_lines(text)) out += (out.empty() ? "" : " | ") + line;
  return out;
}

}  // namespace

std::string LiveView::status(std::string_view text, double now) {
  if (finished_) return {};
  status_ = std::string(text);
  if (!config_.terminal) {
    if (now - last_draw_ < config_.log_status_seconds) return {};
    last_draw_ = now;
    return joined(text) + "\n";
  }
  dirty_ = true;
  if (drawn_ && now - last_draw_ < config_.redraw_seconds) return {};
  last_draw_ = now;
  return redraw();
}

std::string LiveView::event(std::string_view line, double now) {
  if (!config_.terminal || !drawn_ || finished_) return std::string(line) + "\n";
  events_.emplace_back(line);
  while (events_.size() > config_.events_shown) events_.pop_front();
  dirty_ = true;
  if (now - last_draw_ < config_.redraw_seconds) return {};
  last_draw_ = now;
  return redraw();
}

std::string LiveView::finish() {
  if (finished_) return {};
  finished_ = true;
  if (config_.terminal && drawn_ && dirty_) return redraw();
  if (!config_.terminal && !status_.empty()) return joined(status_) + "\n";  // the last status, whatever the rate
  return {};
}

std::vector<std::string> LiveView::block_lines() const {
  std::vector<std::string> lines = split_lines(status_);
  if (!events_.empty()) {
    lines.emplace_back("recent events:");
    for (const std::string& e : events_) lines.push_back("  " + e);
  }
  return lines;
}

// Up to the block's first line, then every line cleared and written again; a
// shorter block clears the lines it no longer uses.
std::string LiveView::redraw() {
  const std::vector<std::string> lines = block_lines();
  std::string out;
  if (drawn_ && drawn_lines_ > 0) out += fmt::format("\x1b[{}F", drawn_lines_);
  for (const std::string& line : lines) out += "\x1b[2K" + line + "\n";
  for (size_t extra = lines.size(); extra < drawn_lines_; ++extra) out += "\x1b[2K\n";
  drawn_lines_ = std::max(drawn_lines_, lines.size());
  drawn_ = true;
  dirty_ = false;
  return out;
}

}  // namespace swarm::apps
