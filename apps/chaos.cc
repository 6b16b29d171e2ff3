#include "apps/chaos.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

namespace swarm::apps {
namespace {

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::stringstream stream(text);
  std::string part;
  while (std::getline(stream, part, separator)) parts.push_back(part);
  return parts;
}

Result<double> parse_number(const std::string& text, const std::string& item, const char* what) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !(value >= 0)) {
    return invalid_argument("chaos item \"{}\": {} \"{}\" is not a number >= 0", item, what, text);
  }
  return value;
}

}  // namespace

const char* chaos_kind_name(ChaosAction::Kind kind) {
  switch (kind) {
    case ChaosAction::Kind::kill_peer: return "kill-peer";
    case ChaosAction::Kind::stop_peer: return "stop-peer";
    case ChaosAction::Kind::continue_peer: return "continue-peer";
    case ChaosAction::Kind::restart_peer: return "restart-peer";
  }
  return "?";
}

Result<std::vector<ChaosAction>> parse_chaos(const std::string& spec, int num_stages) {
  std::vector<ChaosAction> actions;
  if (spec.empty()) return actions;
  int group = 0;
  for (const std::string& item : split(spec, ',')) {
    const auto fields = split(item, ':');
    if (fields.empty()) return invalid_argument("empty chaos item in \"{}\"", spec);
    const std::string& verb = fields[0];
    const size_t expected = verb == "stop-peer" ? 4 : 3;
    if (verb != "kill-peer" && verb != "stop-peer" && verb != "restart-peer") {
      return invalid_argument("chaos item \"{}\": unknown fault \"{}\" (kill-peer, stop-peer, restart-peer)", item, verb);
    }
    if (fields.size() != expected) {
      return invalid_argument("chaos item \"{}\": expected {}", item,
                              verb == "stop-peer" ? "stop-peer:STAGE:AT_SECONDS:FOR_SECONDS"
                                                  : verb + ":STAGE:AT_SECONDS");
    }
    SWARM_ASSIGN_OR_RETURN(double stage, parse_number(fields[1], item, "stage"));
    if (stage != static_cast<int>(stage) || stage >= num_stages) {
      return invalid_argument("chaos item \"{}\": stage {} does not exist (stages 0..{})", item, fields[1],
                              num_stages - 1);
    }
    SWARM_ASSIGN_OR_RETURN(double at, parse_number(fields[2], item, "time"));
    ++group;
    if (verb == "kill-peer") {
      actions.push_back({ChaosAction::Kind::kill_peer, static_cast<int>(stage), at, group});
    } else if (verb == "restart-peer") {
      actions.push_back({ChaosAction::Kind::restart_peer, static_cast<int>(stage), at, group});
    } else {
      SWARM_ASSIGN_OR_RETURN(double duration, parse_number(fields[3], item, "duration"));
      actions.push_back({ChaosAction::Kind::stop_peer, static_cast<int>(stage), at, group});
      actions.push_back({ChaosAction::Kind::continue_peer, static_cast<int>(stage), at + duration, group});
    }
  }
  std::stable_sort(actions.begin(), actions.end(),
                   [](const ChaosAction& a, const ChaosAction& b) { return a.at_seconds < b.at_seconds; });
  return actions;
}

}  // namespace swarm::apps
