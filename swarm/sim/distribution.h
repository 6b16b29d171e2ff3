// distribution: the value distributions the simulator draws peer properties from.
//
// Written on the command line as text, parsed once, sampled from a seeded SplitMix64
// so that a seed replays the same swarm on every platform:
//   const:10          always 10 (a bare number means the same)
//   uniform:5:20      uniform in [5, 20)
//   lognormal:MU:SIG  exp(MU + SIG * N(0, 1)), MU and SIG of the log
//   choice:4,10,25    one of the listed values, each equally likely (GPU classes)
//
//   auto d = swarm::sim::parse_distribution("choice:4,10,25");
//   double throughput = d->sample(rng);
#pragma once

#include <string>
#include <vector>

#include "swarm/core/random.h"
#include "swarm/core/status.h"

namespace swarm::sim {

class Distribution {
 public:
  enum class Kind { constant, uniform, lognormal, choice };

  static Distribution constant(double value) { return Distribution(Kind::constant, {value}); }

  double sample(SplitMix64& rng) const;
  // The smallest value a draw can take (for lognormal: 0, never reached).
  double min_value() const;
  Kind kind() const { return kind_; }
  const std::vector<double>& parameters() const { return parameters_; }
  // The text this distribution parses from.
  std::string to_string() const;

 private:
  friend Result<Distribution> parse_distribution(const std::string& text);
  Distribution(Kind kind, std::vector<double> parameters) : kind_(kind), parameters_(std::move(parameters)) {}

  Kind kind_ = Kind::constant;
  std::vector<double> parameters_;
};

// Errors name the text and the expected forms.
Result<Distribution> parse_distribution(const std::string& text);

// The fields of a flag's value between separators, empty ones kept ("a,,b" is 3 fields).
std::vector<std::string> split(const std::string& text, char separator);

}  // namespace swarm::sim
