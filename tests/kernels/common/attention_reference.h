// attention_reference: what both attention tests (the CPU emulation of the flash
// tiling and the CUDA kernels) measure against, beside cpu::attention_*: the
// log-sum-exp statistic in double, and the RMS that scales their error floors.
//
//   const auto want = swarm::kernels::testing::direct_lse(qkv, {B, T, C, NH});
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace swarm::kernels::testing {

// qkv [B, T, 3C] as kernels/cpu/ops.h lays it out; head size C / NH.
struct AttentionShape {
  int B, T, C, NH;
};

inline double rms(const std::vector<float>& v) {
  double sum = 0;
  for (float x : v) sum += double(x) * x;
  return std::sqrt(sum / std::max<size_t>(v.size(), 1));
}

// The log-sum-exp of each row's scaled causal scores, in double: [B, NH, T].
inline std::vector<float> direct_lse(const std::vector<float>& qkv, const AttentionShape& s) {
  const int hd = s.C / s.NH;
  const double scale = 1.0 / std::sqrt(double(hd));
  std::vector<float> lse(size_t(s.B) * s.NH * s.T);
  std::vector<double> scores;
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.NH; ++h) {
      for (int t = 0; t < s.T; ++t) {
        scores.clear();
        for (int u = 0; u <= t; ++u) {
          double dot = 0;
          for (int d = 0; d < hd; ++d) {
            dot += double(qkv[(int64_t(b) * s.T + t) * 3 * s.C + h * hd + d]) *
                   qkv[(int64_t(b) * s.T + u) * 3 * s.C + s.C + h * hd + d];
          }
          scores.push_back(dot * scale);
        }
        const double max = *std::max_element(scores.begin(), scores.end());
        double sum = 0;
        for (double x : scores) sum += std::exp(x - max);
        lse[(size_t(b) * s.NH + h) * s.T + t] = static_cast<float>(max + std::log(sum));
      }
    }
  }
  return lse;
}

}  // namespace swarm::kernels::testing
