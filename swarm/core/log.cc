#include "swarm/core/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "swarm/core/status.h"

namespace swarm {
namespace {

std::atomic<LogLevel> g_level{LogLevel::info};
std::mutex g_sink_mutex;
LogSink g_sink;

constexpr std::string_view level_tag(LogLevel level) {
  switch (level) {
    case LogLevel::debug: return "D";
    case LogLevel::info: return "I";
    case LogLevel::warn: return "W";
    case LogLevel::error: return "E";
    case LogLevel::off: return "-";
  }
  return "?";
}

double seconds_since_start() {
  static const auto start = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

void set_log_level(LogLevel level) { g_level.store(level); }
LogLevel log_level() { return g_level.load(); }

bool parse_log_level(std::string_view name, LogLevel* level) {
  struct Entry { std::string_view name; LogLevel level; };
  static constexpr Entry kLevels[] = {{"debug", LogLevel::debug}, {"info", LogLevel::info},
                                      {"warn", LogLevel::warn},   {"error", LogLevel::error},
                                      {"off", LogLevel::off}};
  for (const auto& entry : kLevels) {
    if (entry.name == name) {
      *level = entry.level;
      return true;
    }
  }
  return false;
}

void set_log_sink(LogSink sink) {
  std::lock_guard lock(g_sink_mutex);
  g_sink = std::move(sink);
}

void log_message(LogLevel level, std::string_view message) {
  std::lock_guard lock(g_sink_mutex);
  if (g_sink) {
    g_sink(level, message);
    return;
  }
  fmt::print(stderr, "{} {:9.3f} {}\n", level_tag(level), seconds_since_start(), message);
}

void fatal_error(const char* file, int line, std::string_view message) {
  fmt::print(stderr, "fatal: {}:{}: {}\n", file, line, message);
  std::fflush(stderr);
  std::abort();
}

}  // namespace swarm
