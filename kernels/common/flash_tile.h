// flash_tile: the per-tile math of causal flash attention, shared by the CUDA
// kernels (kernels/cuda/attention.cu) and a CPU emulation of their tiling
// (tests/kernels/common/flash_tile_test.cc), so the CPU test checks what the GPU runs.
//
// Query and key tiles are square (tile_size rows each) and start at multiples of
// the tile size, so query tile i needs key tiles 0..i, and key tile j feeds query
// tiles j..last; only the diagonal tile (i, i) and the ragged last tile mix
// visible and masked pairs, and masked_score() decides those element by element.
// Forward keeps a running OnlineSoftmax per query row; backward recomputes the
// probabilities from the row's log-sum-exp.
//
//   TileRescale r = begin_key_tile(row, tile_max);          // then O *= r.alpha
//   float p = tile_weight(masked_score(dot, scale, q, k, T), r.max);
//   end_key_tile(row, r, sum_of_p);
#pragma once

#include <cmath>

#include "kernels/common/online_softmax.h"
#include "swarm/core/dtype.h"  // SWARM_HOST_DEVICE

namespace swarm::kernels::flash {

// Four warps per block, each owning tile_size / 4 rows. bf16 runs on 16x16x16
// tensor-core fragments, so a warp needs 16 rows: tile 64. The float path uses
// plain FMAs and the smaller tile 32 keeps its float tiles in shared memory.
inline constexpr int kWarps = 4;
SWARM_HOST_DEVICE constexpr int tile_size(int element_bytes) { return element_bytes == 2 ? 64 : 32; }

SWARM_HOST_DEVICE constexpr int tile_count(int T, int tile) { return (T + tile - 1) / tile; }

// Key tiles [0, causal_key_tile_end) can hold keys a query of this tile sees.
SWARM_HOST_DEVICE constexpr int causal_key_tile_end(int query_tile) { return query_tile + 1; }
// Query tiles [causal_query_tile_begin, tile_count) can see keys of this tile.
SWARM_HOST_DEVICE constexpr int causal_query_tile_begin(int key_tile) { return key_tile; }

// Rows past T (the padding of the last tile) see nothing, so they contribute
// nothing to backward's key gradients and are never stored.
SWARM_HOST_DEVICE constexpr bool causal_visible(int query, int key, int T) { return query < T && key <= query; }

SWARM_HOST_DEVICE inline float masked_score(float dot, float scale, int query, int key, int T) {
  return causal_visible(query, key, T) ? dot * scale : -INFINITY;
}

// Entering a key tile: the row's new running max and the factor by which its
// output accumulator and sum, built under the old max, must be multiplied.
struct TileRescale {
  float max;
  float alpha;
};

SWARM_HOST_DEVICE inline TileRescale begin_key_tile(const OnlineSoftmax& row, float tile_max) {
  const float new_max = fmaxf(row.max, tile_max);
  return {new_max, OnlineSoftmax::rescale(row.max, new_max)};  // 0 while the row has seen nothing
}

// exp(score - max), and 0 for a masked score even when the max is still -inf
// (a row with nothing visible yet would otherwise give exp(-inf + inf) = NaN).
SWARM_HOST_DEVICE inline float tile_weight(float score, float row_max) {
  return score == -INFINITY ? 0.0f : expf(score - row_max);
}

SWARM_HOST_DEVICE inline void end_key_tile(OnlineSoftmax& row, TileRescale rescale, float tile_weight_sum) {
  row.sum = row.sum * rescale.alpha + tile_weight_sum;
  row.max = rescale.max;
}

SWARM_HOST_DEVICE inline float output_value(float accumulator, const OnlineSoftmax& row) {
  return row.sum > 0.0f ? accumulator / row.sum : 0.0f;
}

SWARM_HOST_DEVICE inline float row_log_sum_exp(const OnlineSoftmax& row) {
  return row.sum > 0.0f ? row.log_sum_exp() : -INFINITY;
}

// Backward recomputes P from the forward's statistic instead of storing it.
SWARM_HOST_DEVICE inline float probability(float score, float log_sum_exp) {
  return score == -INFINITY ? 0.0f : expf(score - log_sum_exp);
}

// Softmax backward for one score: dS = P * (dP - D), D = rowsum(dO * O) =
// rowsum(P * dP); the 1/sqrt(hd) of the forward's scores is folded in here, so
// dQ = dS K and dK = dS^T Q need no further scaling (as the CPU backend does).
SWARM_HOST_DEVICE inline float score_gradient(float p, float dp, float row_dot, float scale) {
  return p * (dp - row_dot) * scale;
}

}  // namespace swarm::kernels::flash
