#include "swarm/averaging/robust_mean.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

namespace swarm {
namespace {

using Vector = std::vector<double>;

double distance(std::span<const float> x, const Vector& v) {
  double sum = 0;
  for (size_t k = 0; k < v.size(); ++k) {
    const double d = static_cast<double>(x[k]) - v[k];
    sum += d * d;
  }
  return std::sqrt(sum);
}

double median_of(std::vector<double> values) {
  const size_t n = values.size();
  std::sort(values.begin(), values.end());
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

Vector coordinate_median(const std::vector<const Contribution*>& in, size_t size) {
  Vector median(size);
  std::vector<double> column(in.size());
  for (size_t k = 0; k < size; ++k) {
    for (size_t i = 0; i < in.size(); ++i) column[i] = in[i]->values[k];
    median[k] = median_of(column);
  }
  return median;
}

// How much of x - v counts: all of it within the radius, the radius' worth beyond.
double clip_factor(double dist, double radius) { return dist <= radius ? 1.0 : radius / dist; }

// The weighted mean of `in` pulled towards `center` as far as each one's clip.
Vector clipped_mean(const std::vector<const Contribution*>& in, const Vector& center, const std::vector<double>& clip,
                    double total_weight) {
  Vector v = center;
  for (size_t i = 0; i < in.size(); ++i) {
    const double scale = in[i]->weight * clip[i] / total_weight;
    for (size_t k = 0; k < v.size(); ++k) v[k] += scale * (static_cast<double>(in[i]->values[k]) - center[k]);
  }
  return v;
}

std::vector<float> to_float(const Vector& v) { return {v.begin(), v.end()}; }

// Accumulated in double, in contribution order: the mean the stage took before it clipped.
std::vector<float> weighted_mean(std::span<const Contribution> contributions, size_t size) {
  Vector sum(size, 0.0);
  double total = 0;
  for (const Contribution& c : contributions) {
    if (!(c.weight > 0)) continue;
    total += c.weight;
    for (size_t k = 0; k < size; ++k) sum[k] += c.weight * static_cast<double>(c.values[k]);
  }
  std::vector<float> mean(size, 0.0f);
  if (total > 0) {
    for (size_t k = 0; k < size; ++k) mean[k] = static_cast<float>(sum[k] / total);
  }
  return mean;
}

double cosine(std::span<const float> x, const Vector& y) {
  double xy = 0, xx = 0, yy = 0;
  for (size_t k = 0; k < y.size(); ++k) {
    const double a = x[k];
    xy += a * y[k];
    xx += a * a;
    yy += y[k] * y[k];
  }
  return xx > 0 && yy > 0 ? xy / std::sqrt(xx * yy) : 0.0;
}

}  // namespace

RobustMean centered_clip(std::span<const Contribution> contributions, const RobustMeanOptions& options) {
  RobustMean out;
  const size_t size = contributions.empty() ? 0 : contributions.front().values.size();
  out.judged.resize(contributions.size());
  std::vector<const Contribution*> in;
  std::vector<size_t> index;  // in[i] is contributions[index[i]]
  double total_weight = 0;
  for (size_t i = 0; i < contributions.size(); ++i) {
    if (!(contributions[i].weight > 0)) continue;
    in.push_back(&contributions[i]);
    index.push_back(i);
    total_weight += contributions[i].weight;
  }
  if (in.size() < 3) {
    out.mean = weighted_mean(contributions, size);
    return out;
  }
  const size_t n = in.size();
  Vector v = coordinate_median(in, size);
  std::vector<double> per_sample(n);
  for (size_t i = 0; i < n; ++i) per_sample[i] = distance(in[i]->values, v) * std::sqrt(in[i]->weight);
  out.radius = options.radius_factor * median_of(per_sample);
  std::vector<double> radius(n), clip(n, 1.0);
  for (size_t i = 0; i < n; ++i) radius[i] = out.radius / std::sqrt(in[i]->weight);
  for (int round = 0; round < options.iterations; ++round) {
    for (size_t i = 0; i < n; ++i) clip[i] = clip_factor(distance(in[i]->values, v), radius[i]);
    v = clipped_mean(in, v, clip, total_weight);
  }
  out.mean = to_float(v);

  // Each member against the others as they counted (clipped), so one outlier cannot
  // turn the honest members against each other.
  for (size_t i = 0; i < n; ++i) clip[i] = clip_factor(distance(in[i]->values, v), radius[i]);
  Vector all(size, 0.0);
  for (size_t i = 0; i < n; ++i) {
    for (size_t k = 0; k < size; ++k) {
      all[k] += in[i]->weight * (v[k] + clip[i] * (static_cast<double>(in[i]->values[k]) - v[k]));
    }
  }
  for (size_t i = 0; i < n; ++i) {
    ContributionJudgement& j = out.judged[index[i]];
    j.judged = true;
    const double dist = distance(in[i]->values, v);
    j.spread = radius[i] > 0 ? dist / radius[i] : (dist > 0 ? std::numeric_limits<double>::max() : 0.0);
    Vector others(size);
    for (size_t k = 0; k < size; ++k) {
      others[k] = all[k] - in[i]->weight * (v[k] + clip[i] * (static_cast<double>(in[i]->values[k]) - v[k]));
    }
    j.alignment = cosine(in[i]->values, others);
  }
  return out;
}

}  // namespace swarm
