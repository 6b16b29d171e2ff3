// Causal attention, one (batch, head) pair per OpenMP task. Each pair runs its
// own small single-threaded Eigen GEMMs on strided views of qkv, so no head is
// ever copied out. The T x T probabilities are kept for backward: on the CPU
// they are cheap next to recomputing the softmax.
//
// Rows go in blocks of kRowBlock queries, and a block's GEMMs stop at its last
// query's key: the masked upper triangle is never multiplied, which halves
// attention's FLOPs at long sequences. Only the lower triangle of the
// probabilities (and each block's diagonal square) is written; backward reads
// no more than that. Results depend on the block size, never on the threads.
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
using RowArray = Eigen::Map<Eigen::ArrayXf>;
using ConstRowArray = Eigen::Map<const Eigen::ArrayXf>;

constexpr int kRowBlock = 64;

// Query i sees keys 0..i: softmax over them in place, zeros after them up to
// `width` (the end of i's row block), where the block's GEMM reads.
void causal_softmax_row(float* row, int i, int width) {
  RowArray seen(row, i + 1);
  seen = (seen - seen.maxCoeff()).exp();
  seen *= 1.0f / seen.sum();
  std::fill(row + i + 1, row + width, 0.0f);
}

// dS = P * (dP - sum(P * dP)) * scale over keys 0..i, zeros after them up to width.
void causal_softmax_backward_row(float* drow, const float* prow, int i, int width, float scale) {
  RowArray d(drow, i + 1);
  ConstRowArray p(prow, i + 1);
  const float dot = (p * d).sum();
  d = p * (d - dot) * scale;
  std::fill(drow + i + 1, drow + width, 0.0f);
}

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
    HeadView o(out + static_cast<int64_t>(b) * T * C + h * hs, T, hs, Strided(C));
    for (int r0 = 0; r0 < T; r0 += kRowBlock) {
      const int rows = std::min(kRowBlock, T - r0), keys = r0 + rows;
      auto scores = p.block(r0, 0, rows, keys);
      scores.noalias() = (q.middleRows(r0, rows) * k.topRows(keys).transpose()) * scale;
      for (int i = r0; i < keys; ++i) causal_softmax_row(p.row(i).data(), i, keys);
      o.middleRows(r0, rows).noalias() = scores * v.topRows(keys);
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B,
                        int T, int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel num_threads(kernel_threads())
  {
    RowMatrix dscores(kRowBlock, T);
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
      for (int r0 = 0; r0 < T; r0 += kRowBlock) {
        const int rows = std::min(kRowBlock, T - r0), keys = r0 + rows;
        auto probs = p.block(r0, 0, rows, keys);
        auto ds = dscores.block(0, 0, rows, keys);
        dv.topRows(keys).noalias() += probs.transpose() * dy.middleRows(r0, rows);
        ds.noalias() = dy.middleRows(r0, rows) * v.topRows(keys).transpose();
        for (int i = r0; i < keys; ++i) {
          causal_softmax_backward_row(dscores.row(i - r0).data(), p.row(i).data(), i, keys, scale);
        }
        dq.middleRows(r0, rows).noalias() += ds * k.topRows(keys);
        dk.topRows(keys).noalias() += ds.transpose() * q.middleRows(r0, rows);
      }
    }
  }
}

}  // namespace swarm::cpu
