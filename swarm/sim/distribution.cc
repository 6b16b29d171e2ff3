#include "swarm/sim/distribution.h"

#include <charconv>
#include <cmath>

#include <fmt/format.h>

namespace swarm::sim {
namespace {

constexpr const char* kForms = "expected const:X, uniform:LO:HI, lognormal:MU:SIGMA, choice:A,B,... or a number";

// A whole-string finite number; std::from_chars accepts no leading '+' or spaces.
Result<double> parse_number(const std::string& text, const std::string& whole) {
  double value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || !std::isfinite(value)) {
    return invalid_argument("distribution '{}': '{}' is not a finite number ({})", whole, text, kForms);
  }
  return value;
}

Result<std::vector<double>> parse_numbers(const std::vector<std::string>& parts, const std::string& whole) {
  std::vector<double> values;
  for (const std::string& part : parts) {
    SWARM_ASSIGN_OR_RETURN(double v, parse_number(part, whole));
    values.push_back(v);
  }
  return values;
}

// Box-Muller from two unit draws; 1 - u keeps the log away from 0.
double standard_normal(SplitMix64& rng) {
  const double u1 = 1.0 - rng.next_unit();
  const double u2 = rng.next_unit();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

}  // namespace

double Distribution::sample(SplitMix64& rng) const {
  switch (kind_) {
    case Kind::constant: return parameters_[0];
    case Kind::uniform: return parameters_[0] + (parameters_[1] - parameters_[0]) * rng.next_unit();
    case Kind::lognormal: return std::exp(parameters_[0] + parameters_[1] * standard_normal(rng));
    case Kind::choice: return parameters_[rng.below(parameters_.size())];
  }
  return parameters_[0];
}

double Distribution::min_value() const {
  switch (kind_) {
    case Kind::constant: return parameters_[0];
    case Kind::uniform: return parameters_[0];
    case Kind::lognormal: return 0;
    case Kind::choice: {
      double lowest = parameters_[0];
      for (double v : parameters_) lowest = std::min(lowest, v);
      return lowest;
    }
  }
  return 0;
}

std::string Distribution::to_string() const {
  switch (kind_) {
    case Kind::constant: return fmt::format("const:{}", parameters_[0]);
    case Kind::uniform: return fmt::format("uniform:{}:{}", parameters_[0], parameters_[1]);
    case Kind::lognormal: return fmt::format("lognormal:{}:{}", parameters_[0], parameters_[1]);
    case Kind::choice: return fmt::format("choice:{}", fmt::join(parameters_, ","));
  }
  return "";
}

Result<Distribution> parse_distribution(const std::string& text) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos) {
    SWARM_ASSIGN_OR_RETURN(double v, parse_number(text, text));
    return Distribution(Distribution::Kind::constant, {v});
  }
  const std::string name = text.substr(0, colon);
  const std::string rest = text.substr(colon + 1);
  if (name == "const") {
    SWARM_ASSIGN_OR_RETURN(double v, parse_number(rest, text));
    return Distribution(Distribution::Kind::constant, {v});
  }
  if (name == "choice") {
    SWARM_ASSIGN_OR_RETURN(std::vector<double> values, parse_numbers(split(rest, ','), text));
    return Distribution(Distribution::Kind::choice, std::move(values));
  }
  if (name != "uniform" && name != "lognormal") {
    return invalid_argument("distribution '{}': unknown kind '{}' ({})", text, name, kForms);
  }
  const std::vector<std::string> parts = split(rest, ':');
  if (parts.size() != 2) return invalid_argument("distribution '{}': {} takes two numbers ({})", text, name, kForms);
  SWARM_ASSIGN_OR_RETURN(std::vector<double> values, parse_numbers(parts, text));
  if (name == "uniform") {
    if (!(values[0] <= values[1])) return invalid_argument("distribution '{}': uniform needs LO <= HI", text);
    return Distribution(Distribution::Kind::uniform, std::move(values));
  }
  if (values[1] < 0) return invalid_argument("distribution '{}': lognormal needs SIGMA >= 0", text);
  return Distribution(Distribution::Kind::lognormal, std::move(values));
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    const size_t end = text.find(separator, start);
    parts.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) return parts;
    start = end + 1;
  }
}

}  // namespace swarm::sim
