// LayerNorm over the last axis. Rows are independent, so forward and the input
// gradient split over rows; the weight and bias gradients are column sums,
// split over column blocks so that each sum runs in row order on one thread
// and the result does not depend on the thread count.
#include <cmath>

#include "kernels/cpu/ops.h"

namespace swarm::cpu {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C) {
  constexpr float kEps = 1e-5f;
#pragma omp parallel for num_threads(kernel_threads()) schedule(static)
  for (int i = 0; i < N; ++i) {
    const float* x = inp + static_cast<int64_t>(i) * C;
    float sum = 0.0f;
    for (int c = 0; c < C; ++c) sum += x[c];
    const float m = sum / C;
    float var = 0.0f;
    for (int c = 0; c < C; ++c) var += (x[c] - m) * (x[c] - m);
    const float s = 1.0f / std::sqrt(var / C + kEps);
    float* y = out + static_cast<int64_t>(i) * C;
    for (int c = 0; c < C; ++c) y[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[i] = m;
    rstd[i] = s;
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C) {
#pragma omp parallel for num_threads(kernel_threads()) schedule(static)
  for (int i = 0; i < N; ++i) {
    const float* dy = dout + static_cast<int64_t>(i) * C;
    const float* x = inp + static_cast<int64_t>(i) * C;
    float* dx = dinp + static_cast<int64_t>(i) * C;
    const float m = mean[i], s = rstd[i];
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (int c = 0; c < C; ++c) {
      const float norm = (x[c] - m) * s;
      const float dnorm = weight[c] * dy[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    for (int c = 0; c < C; ++c) {
      const float norm = (x[c] - m) * s;
      const float dnorm = weight[c] * dy[c];
      dx[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
  constexpr int kColumnBlock = 32;
  const int blocks = (C + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for num_threads(kernel_threads()) schedule(static)
  for (int block = 0; block < blocks; ++block) {
    const int c0 = block * kColumnBlock;
    const int c1 = c0 + kColumnBlock < C ? c0 + kColumnBlock : C;
    float dw[kColumnBlock] = {}, db[kColumnBlock] = {};
    for (int i = 0; i < N; ++i) {
      const float* dy = dout + static_cast<int64_t>(i) * C;
      const float* x = inp + static_cast<int64_t>(i) * C;
      const float m = mean[i], s = rstd[i];
      for (int c = c0; c < c1; ++c) {
        db[c - c0] += dy[c];
        dw[c - c0] += (x[c] - m) * s * dy[c];
      }
    }
    for (int c = c0; c < c1; ++c) {
      dweight[c] += dw[c - c0];
      dbias[c] += db[c - c0];
    }
  }
}

}  // namespace swarm::cpu
