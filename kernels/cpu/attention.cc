// Causal attention, one (batch, head) pair per OpenMP task. Each pair runs its
// own small single-threaded Eigen GEMMs on strided views of qkv, so no head is
// ever copied out. The T x T probabilities are kept for backward: on the CPU
// they are cheap next to recomputing the softmax.
#include <algorithm>
#include <cmath>

#include <Eigen/Core>

#include "kernels/cpu/ops.h"

namespace swarm::cpu {
namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Strided = Eigen::OuterStride<>;
using HeadView = Eigen::Map<RowMatrix, 0, Strided>;
using ConstHeadView = Eigen::Map<const RowMatrix, 0, Strided>;
using SquareView = Eigen::Map<RowMatrix>;
using ConstSquareView = Eigen::Map<const RowMatrix>;

}  // namespace

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel for num_threads(kernel_threads()) schedule(static)
  for (int bh = 0; bh < B * NH; ++bh) {
    const int b = bh / NH, h = bh % NH;
    const float* base = qkv + static_cast<int64_t>(b) * T * 3 * C + h * hs;
    ConstHeadView q(base, T, hs, Strided(3 * C));
    ConstHeadView k(base + C, T, hs, Strided(3 * C));
    ConstHeadView v(base + 2 * C, T, hs, Strided(3 * C));
    SquareView p(att + static_cast<int64_t>(bh) * T * T, T, T);
    p.noalias() = (q * k.transpose()) * scale;
    for (int i = 0; i < T; ++i) {
      float* row = p.row(i).data();
      float max_value = row[0];
      for (int j = 1; j <= i; ++j) max_value = std::max(max_value, row[j]);
      float sum = 0.0f;
      for (int j = 0; j <= i; ++j) {
        row[j] = std::exp(row[j] - max_value);
        sum += row[j];
      }
      const float inverse = 1.0f / sum;
      for (int j = 0; j <= i; ++j) row[j] *= inverse;
      for (int j = i + 1; j < T; ++j) row[j] = 0.0f;
    }
    HeadView o(out + static_cast<int64_t>(b) * T * C + h * hs, T, hs, Strided(C));
    o.noalias() = p * v;
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B,
                        int T, int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel num_threads(kernel_threads())
  {
    RowMatrix datt(T, T);
#pragma omp for schedule(static)
    for (int bh = 0; bh < B * NH; ++bh) {
      const int b = bh / NH, h = bh % NH;
      const int64_t offset = static_cast<int64_t>(b) * T * 3 * C + h * hs;
      ConstHeadView q(qkv + offset, T, hs, Strided(3 * C));
      ConstHeadView k(qkv + offset + C, T, hs, Strided(3 * C));
      ConstHeadView v(qkv + offset + 2 * C, T, hs, Strided(3 * C));
      HeadView dq(dqkv + offset, T, hs, Strided(3 * C));
      HeadView dk(dqkv + offset + C, T, hs, Strided(3 * C));
      HeadView dv(dqkv + offset + 2 * C, T, hs, Strided(3 * C));
      ConstHeadView dy(dout + static_cast<int64_t>(b) * T * C + h * hs, T, hs, Strided(C));
      ConstSquareView p(att + static_cast<int64_t>(bh) * T * T, T, T);

      dv.noalias() += p.transpose() * dy;
      datt.noalias() = dy * v.transpose();
      // Softmax backward, row by row: dS = P * (dP - sum(P * dP)), zero above the diagonal.
      for (int i = 0; i < T; ++i) {
        const float* prow = p.row(i).data();
        float* drow = datt.row(i).data();
        float dot = 0.0f;
        for (int j = 0; j <= i; ++j) dot += prow[j] * drow[j];
        for (int j = 0; j <= i; ++j) drow[j] = prow[j] * (drow[j] - dot) * scale;
        for (int j = i + 1; j < T; ++j) drow[j] = 0.0f;
      }
      dq.noalias() += datt * k;
      dk.noalias() += datt.transpose() * q;
    }
  }
}

}  // namespace swarm::cpu
