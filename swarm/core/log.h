// log: leveled logging through fmt, to stderr or to a sink a test installs.
//
// Light on purpose: it pulls in only <fmt/core.h>, so every file may include it.
//
//   swarm::log_info("stage {} has {} peers", stage, peers);
//   swarm::set_log_level(swarm::LogLevel::warn);   // quieter
#pragma once

#include <functional>
#include <string_view>
#include <utility>

#include <fmt/core.h>

namespace swarm {

enum class LogLevel : int { debug = 0, info = 1, warn = 2, error = 3, off = 4 };

void set_log_level(LogLevel level);
LogLevel log_level();
bool parse_log_level(std::string_view name, LogLevel* level);

// Replaces the stderr writer (for tests, or to tee into a file); null restores stderr.
using LogSink = std::function<void(LogLevel, std::string_view)>;
void set_log_sink(LogSink sink);

void log_message(LogLevel level, std::string_view message);

template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (level < log_level()) return;
  log_message(level, fmt::format(format, std::forward<Args>(args)...));
}

template <typename... Args>
void log_debug(fmt::format_string<Args...> format, Args&&... args) {
  log(LogLevel::debug, format, std::forward<Args>(args)...);
}
template <typename... Args>
void log_info(fmt::format_string<Args...> format, Args&&... args) {
  log(LogLevel::info, format, std::forward<Args>(args)...);
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> format, Args&&... args) {
  log(LogLevel::warn, format, std::forward<Args>(args)...);
}
template <typename... Args>
void log_error(fmt::format_string<Args...> format, Args&&... args) {
  log(LogLevel::error, format, std::forward<Args>(args)...);
}

}  // namespace swarm
