// robust_mean: the average of a stage's gradients that one bad member cannot steer.
//
// Centered clipping (Karimireddy et al., 2021) around the coordinate-wise median:
// each contribution moves the result by at most a radius, so a member that sends
// its gradient x100, sign-flipped or made up shifts the round's average by at most
// radius x its share of the samples, however large it makes its numbers. The
// radius comes from the contributions themselves: twice the median distance from
// the median, measured per square root of samples, since a member's noise shrinks
// as 1/sqrt(samples) and an honest member with few samples must not look like an
// outlier. Contributions within their radius are not clipped at all: when every
// member is honest the result is the weighted mean.
//
// Pure and deterministic: the same contributions in the same order give the same
// bits, so every member of a round that reduces them holds the same average.
//
//   RobustMean r = centered_clip({{x0, 4}, {x1, 4}, {x2, 3}});
//   r.mean;              // the average
//   r.judged[2].spread;  // how far member 2 lay from it, in radii
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace swarm {

struct Contribution {
  std::span<const float> values;
  double weight = 0;  // samples; 0 leaves it out of the mean and the judgement
};

struct RobustMeanOptions {
  int iterations = 3;          // of the clipping around the current estimate
  double radius_factor = 2.0;  // radius: this many median distances (per sqrt(sample))
};

// How one contribution lay against the others in a round.
struct ContributionJudgement {
  bool judged = false;  // weight > 0 and at least 3 such contributions
  // Distance from the result over its radius: at most 1 for one not clipped; an
  // honest member stays near 1 or below.
  double spread = 0;
  // Cosine between it and the weighted mean of the others: an honest member's
  // gradient points with the stage's on average, a sign-flipped one against it.
  double alignment = 0;
};

struct RobustMean {
  std::vector<float> mean;
  double radius = 0;  // per sqrt(sample)
  std::vector<ContributionJudgement> judged;  // in contribution order
};

// All contributions have the same size. With fewer than 3 weighted contributions
// there is no majority to clip towards: the weighted mean, nobody judged.
RobustMean centered_clip(std::span<const Contribution> contributions, const RobustMeanOptions& options = {});

}  // namespace swarm
