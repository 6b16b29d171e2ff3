#include "swarm/core/log.h"

#include <string>
#include <vector>

#include <doctest/doctest.h>

namespace swarm {
namespace {

TEST_CASE("log formats through fmt and honours the level") {
  std::vector<std::pair<LogLevel, std::string>> lines;
  set_log_sink([&](LogLevel level, std::string_view message) { lines.emplace_back(level, message); });
  set_log_level(LogLevel::info);

  log_debug("hidden {}", 1);
  log_info("stage {} has {} peers", 2, 3);
  log_error("{:.2f}", 0.125);

  REQUIRE(lines.size() == 2);
  CHECK(lines[0].first == LogLevel::info);
  CHECK(lines[0].second == "stage 2 has 3 peers");
  CHECK(lines[1].second == "0.12");

  set_log_level(LogLevel::off);
  log_error("silenced");
  CHECK(lines.size() == 2);

  set_log_sink(nullptr);
  set_log_level(LogLevel::info);
}

TEST_CASE("parse_log_level knows the names and rejects others") {
  LogLevel level = LogLevel::info;
  CHECK(parse_log_level("warn", &level));
  CHECK(level == LogLevel::warn);
  CHECK_FALSE(parse_log_level("verbose", &level));
  CHECK(level == LogLevel::warn);
}

}  // namespace
}  // namespace swarm
