// The flash-attention tiling of kernels/cuda/attention.cu, run on the CPU: the
// same square tiles (flash::tile_size), the same loop order (forward and dQ walk
// key tiles 0..i of query tile i; dK, dV walk query tiles j..last of key tile
// j), the same masking, rescaling and per-element rounding of the stored values
// (P, dS and outputs in the element type), all through kernels/common/flash_tile.h.
// Checked against cpu::attention_forward/backward on shapes whose T is not a
// multiple of the tile, for the float tiling (tile 32) and the bf16 one (tile 64).
//
// Tolerances, as the CUDA test measures them: max |got - want| / (rms(want) + |want|),
// i.e. relative to each value but never to less than the typical value, because
// the errors scale with the typical value, not with each one (a score's absolute
// error passes into exp(); bf16 rounds O before backward's D = rowsum(dO * O)).
// Measured over 8 seeds: float forward <= 2e-6 and backward <= 6e-6, checked at
// 1e-4 and 1e-3; bf16 forward <= 1.1e-2 and backward <= 3.4e-2, checked at 3e-2
// and 8e-2 (nearly all of backward's error is D from the rounded O, as in every
// flash backward). lse, a float statistic in both: <= 2e-5 with floor 1e-3, checked at 1e-4.
#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <type_traits>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include "kernels/common/flash_tile.h"
#include "kernels/common/online_softmax.h"
#include "kernels/cpu/ops.h"
#include "swarm/core/dtype.h"
#include "tests/kernels/common/attention_reference.h"

namespace swarm::kernels::flash {
namespace {

using Shape = testing::AttentionShape;
using testing::direct_lse;
using testing::rms;


std::vector<float> random_vector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// The value a kernel of element type Element leaves in memory.
template <typename Element>
float stored(float x) {
  if constexpr (std::is_same_v<Element, bf16>) {
    return bf16::from_float(x).to_float();
  } else {
    return x;
  }
}

template <typename Element>
std::vector<float> stored(std::vector<float> v) {
  for (float& x : v) x = stored<Element>(x);
  return v;
}

double max_relative_error(const std::vector<float>& got, const std::vector<float>& want, double floor) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(double(got[i]) - want[i]) / (floor + std::abs(double(want[i])));
    if (!(err <= worst)) worst = err;  // NaN propagates as the worst
  }
  return worst;
}

// One (batch, head) of the [B, T, 3C] / [B, T, C] layouts, and the kernel's
// tile loads: tile rows [first, first + tile), zero past T.
struct Head {
  const Shape& s;
  int b, h, hd, tile;

  using Tile = std::vector<float>;  // [tile][hd]

  Tile load(const std::vector<float>& src, int64_t column, int64_t row_stride, int first) const {
    Tile out(size_t(tile) * hd, 0.0f);
    for (int r = 0; r < tile; ++r) {
      const int t = first + r;
      if (t >= s.T) continue;
      for (int d = 0; d < hd; ++d) out[size_t(r) * hd + d] = src[(int64_t(b) * s.T + t) * row_stride + column + d];
    }
    return out;
  }
  Tile q(const std::vector<float>& qkv, int first) const { return load(qkv, int64_t(h) * hd, 3 * s.C, first); }
  Tile k(const std::vector<float>& qkv, int first) const { return load(qkv, s.C + int64_t(h) * hd, 3 * s.C, first); }
  Tile v(const std::vector<float>& qkv, int first) const {
    return load(qkv, 2 * s.C + int64_t(h) * hd, 3 * s.C, first);
  }
  Tile o(const std::vector<float>& out, int first) const { return load(out, int64_t(h) * hd, s.C, first); }
  int64_t stat(int t) const { return (int64_t(b) * s.NH + h) * s.T + t; }
};

// out[r][c] = sum_d a[r][d] * b[c][d] (warp_abt).
std::vector<float> abt(const std::vector<float>& a, const std::vector<float>& b, int tile, int hd) {
  std::vector<float> out(size_t(tile) * tile, 0.0f);
  for (int r = 0; r < tile; ++r) {
    for (int c = 0; c < tile; ++c) {
      float sum = 0.0f;
      for (int d = 0; d < hd; ++d) sum += a[size_t(r) * hd + d] * b[size_t(c) * hd + d];
      out[size_t(r) * tile + c] = sum;
    }
  }
  return out;
}

// acc[r][n] += sum_k a[r][k] * b[k][n] (warp_accumulate_ab).
void accumulate_ab(std::vector<float>& acc, const std::vector<float>& a, const std::vector<float>& b, int tile,
                   int hd) {
  for (int r = 0; r < tile; ++r) {
    for (int k = 0; k < tile; ++k) {
      for (int n = 0; n < hd; ++n) acc[size_t(r) * hd + n] += a[size_t(r) * tile + k] * b[size_t(k) * hd + n];
    }
  }
}

// acc[i][n] += sum_j a[j][i] * b[j][n] (warp_accumulate_atb).
void accumulate_atb(std::vector<float>& acc, const std::vector<float>& a, const std::vector<float>& b, int tile,
                    int hd) {
  for (int i = 0; i < tile; ++i) {
    for (int j = 0; j < tile; ++j) {
      for (int n = 0; n < hd; ++n) acc[size_t(i) * hd + n] += a[size_t(j) * tile + i] * b[size_t(j) * hd + n];
    }
  }
}

template <typename Element>
void emulate_forward(std::vector<float>& out, std::vector<float>& lse, const std::vector<float>& qkv, const Shape& s) {
  const int tile = tile_size(sizeof(Element));
  const int hd = s.C / s.NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int bh = 0; bh < s.B * s.NH; ++bh) {
    const Head head{s, bh / s.NH, bh % s.NH, hd, tile};
    for (int query_tile = 0; query_tile < tile_count(s.T, tile); ++query_tile) {
      const int first_query = query_tile * tile;
      const auto q = head.q(qkv, first_query);
      std::vector<OnlineSoftmax> rows(tile);
      std::vector<float> o_acc(size_t(tile) * hd, 0.0f);
      for (int key_tile = 0; key_tile < causal_key_tile_end(query_tile); ++key_tile) {
        const int first_key = key_tile * tile;
        const auto k = head.k(qkv, first_key);
        const auto v = head.v(qkv, first_key);
        const auto scores = abt(q, k, tile, hd);
        std::vector<float> probs(size_t(tile) * tile);
        for (int r = 0; r < tile; ++r) {
          std::vector<float> row_scores(tile);
          float tile_max = -INFINITY;
          for (int c = 0; c < tile; ++c) {
            row_scores[c] = masked_score(scores[size_t(r) * tile + c], scale, first_query + r, first_key + c, s.T);
            tile_max = std::max(tile_max, row_scores[c]);
          }
          const TileRescale rescale = begin_key_tile(rows[r], tile_max);
          float weight_sum = 0.0f;
          for (int c = 0; c < tile; ++c) {
            const float p = tile_weight(row_scores[c], rescale.max);
            probs[size_t(r) * tile + c] = stored<Element>(p);
            weight_sum += p;
          }
          end_key_tile(rows[r], rescale, weight_sum);
          for (int n = 0; n < hd; ++n) o_acc[size_t(r) * hd + n] *= rescale.alpha;
        }
        accumulate_ab(o_acc, probs, v, tile, hd);
      }
      for (int r = 0; r < tile; ++r) {
        const int t = first_query + r;
        if (t >= s.T) continue;
        for (int n = 0; n < hd; ++n) {
          out[(int64_t(head.b) * s.T + t) * s.C + int64_t(head.h) * hd + n] =
              stored<Element>(output_value(o_acc[size_t(r) * hd + n], rows[r]));
        }
        lse[head.stat(t)] = row_log_sum_exp(rows[r]);
      }
    }
  }
}

// warp_score_gradients: P and dS of one (query tile, key tile) pair.
struct ScoreGradients {
  std::vector<float> probs, dscores;  // [tile][tile], as stored
};

template <typename Element>
ScoreGradients score_gradients(const Head& head, const std::vector<float>& q, const std::vector<float>& k,
                               const std::vector<float>& v, const std::vector<float>& dout_tile,
                               const std::vector<float>& tile_lse, const std::vector<float>& tile_dot,
                               int first_query, int first_key, float scale) {
  const int tile = head.tile, hd = head.hd;
  const auto scores = abt(q, k, tile, hd);
  const auto dprobs = abt(dout_tile, v, tile, hd);
  ScoreGradients g{std::vector<float>(size_t(tile) * tile), std::vector<float>(size_t(tile) * tile)};
  for (int r = 0; r < tile; ++r) {
    for (int c = 0; c < tile; ++c) {
      const size_t i = size_t(r) * tile + c;
      const float p =
          probability(masked_score(scores[i], scale, first_query + r, first_key + c, head.s.T), tile_lse[r]);
      g.probs[i] = stored<Element>(p);
      g.dscores[i] = stored<Element>(score_gradient(p, dprobs[i], tile_dot[r], scale));
    }
  }
  return g;
}

template <typename Element>
void emulate_backward(std::vector<float>& dqkv, const std::vector<float>& dout, const std::vector<float>& qkv,
                      const std::vector<float>& out, const std::vector<float>& lse, const Shape& s) {
  const int tile = tile_size(sizeof(Element));
  const int hd = s.C / s.NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // D = rowsum(dO * O), the small kernel before the two passes.
  std::vector<float> row_dot(size_t(s.B) * s.NH * s.T);
  for (int bh = 0; bh < s.B * s.NH; ++bh) {
    const int b = bh / s.NH, h = bh % s.NH;
    for (int t = 0; t < s.T; ++t) {
      float sum = 0.0f;
      for (int n = 0; n < hd; ++n) {
        const int64_t i = (int64_t(b) * s.T + t) * s.C + int64_t(h) * hd + n;
        sum += dout[i] * out[i];
      }
      row_dot[size_t(bh) * s.T + t] = sum;
    }
  }
  auto add_rows = [&](const Head& head, const std::vector<float>& acc, int64_t column, int first) {
    for (int r = 0; r < tile; ++r) {
      const int t = first + r;
      if (t >= s.T) continue;
      for (int n = 0; n < hd; ++n) {
        float& target = dqkv[(int64_t(head.b) * s.T + t) * 3 * s.C + column + int64_t(head.h) * hd + n];
        target = stored<Element>(target + acc[size_t(r) * hd + n]);
      }
    }
  };
  auto row_stats = [&](const Head& head, const std::vector<float>& stats, int first) {
    std::vector<float> tile_stats(tile, 0.0f);
    for (int r = 0; r < tile; ++r) {
      if (first + r < s.T) tile_stats[r] = stats[head.stat(first + r)];
    }
    return tile_stats;
  };

  for (int bh = 0; bh < s.B * s.NH; ++bh) {
    const Head head{s, bh / s.NH, bh % s.NH, hd, tile};
    const int tiles = tile_count(s.T, tile);
    // dK, dV: one key tile at a time, query tiles in order.
    for (int key_tile = 0; key_tile < tiles; ++key_tile) {
      const int first_key = key_tile * tile;
      const auto k = head.k(qkv, first_key);
      const auto v = head.v(qkv, first_key);
      std::vector<float> dk_acc(size_t(tile) * hd, 0.0f), dv_acc(size_t(tile) * hd, 0.0f);
      for (int query_tile = causal_query_tile_begin(key_tile); query_tile < tiles; ++query_tile) {
        const int first_query = query_tile * tile;
        const auto q = head.q(qkv, first_query);
        const auto dout_tile = head.o(dout, first_query);
        const auto g = score_gradients<Element>(head, q, k, v, dout_tile, row_stats(head, lse, first_query),
                                                row_stats(head, row_dot, first_query), first_query, first_key, scale);
        accumulate_atb(dv_acc, g.probs, dout_tile, tile, hd);
        accumulate_atb(dk_acc, g.dscores, q, tile, hd);
      }
      add_rows(head, dk_acc, s.C, first_key);
      add_rows(head, dv_acc, 2 * s.C, first_key);
    }
    // dQ: one query tile at a time, key tiles in order.
    for (int query_tile = 0; query_tile < tiles; ++query_tile) {
      const int first_query = query_tile * tile;
      const auto q = head.q(qkv, first_query);
      const auto dout_tile = head.o(dout, first_query);
      const auto tile_lse = row_stats(head, lse, first_query);
      const auto tile_dot = row_stats(head, row_dot, first_query);
      std::vector<float> dq_acc(size_t(tile) * hd, 0.0f);
      for (int key_tile = 0; key_tile < causal_key_tile_end(query_tile); ++key_tile) {
        const int first_key = key_tile * tile;
        const auto k = head.k(qkv, first_key);
        const auto g = score_gradients<Element>(head, q, k, head.v(qkv, first_key), dout_tile, tile_lse, tile_dot,
                                                first_query, first_key, scale);
        accumulate_ab(dq_acc, g.dscores, k, tile, hd);
      }
      add_rows(head, dq_acc, 0, first_query);
    }
  }
}

const Shape kShapes[] = {{2, 64, 128, 2}, {1, 100, 96, 3}, {1, 257, 256, 2}, {2, 1, 64, 1}, {1, 70, 64, 2}};

template <typename Element>
void check_against_cpu(double forward_tolerance, double backward_tolerance) {
  for (const Shape& s : kShapes) {
    INFO("B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH << " tile=" << tile_size(sizeof(Element)));
    const size_t qkv_n = size_t(s.B) * s.T * 3 * s.C, out_n = size_t(s.B) * s.T * s.C;
    const auto qkv = stored<Element>(random_vector(qkv_n, 1));  // what the kernel reads
    const auto dout = stored<Element>(random_vector(out_n, 2));

    std::vector<float> want_out(out_n), att(size_t(s.B) * s.NH * s.T * s.T), want_dqkv(qkv_n, 0.0f);
    cpu::attention_forward(want_out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    cpu::attention_backward(want_dqkv.data(), dout.data(), qkv.data(), att.data(), s.B, s.T, s.C, s.NH);

    std::vector<float> out(out_n, NAN), lse(size_t(s.B) * s.NH * s.T, NAN), dqkv(qkv_n, 0.0f);
    emulate_forward<Element>(out, lse, qkv, s);
    emulate_backward<Element>(dqkv, dout, qkv, out, lse, s);

    const double out_error = max_relative_error(out, want_out, rms(want_out));
    const double lse_error = max_relative_error(lse, direct_lse(qkv, s), 1e-3);
    const double dqkv_error = max_relative_error(dqkv, want_dqkv, rms(want_dqkv));
    MESSAGE("errors: out " << out_error << " lse " << lse_error << " dqkv " << dqkv_error);
    CHECK(out_error < forward_tolerance);
    CHECK(lse_error < 1e-4);  // lse is a float statistic in both element types
    CHECK(dqkv_error < backward_tolerance);
  }
}

TEST_CASE("the float tiling (tile 32) matches the CPU backend, forward, lse and backward") {
  check_against_cpu<float>(1e-4, 1e-3);
}

TEST_CASE("the bf16 tiling (tile 64, P and dS rounded to bf16) matches the CPU backend on bf16 inputs") {
  check_against_cpu<bf16>(3e-2, 8e-2);
}

TEST_CASE("the causal tile ranges cover exactly the visible pairs") {
  for (int tile : {tile_size(4), tile_size(2)}) {
    for (int T : {1, 2, 31, 32, 33, 63, 64, 65, 100, 129}) {
      INFO("tile=" << tile << " T=" << T);
      const int tiles = tile_count(T, tile);
      CHECK(tiles * tile >= T);
      CHECK((tiles - 1) * tile < T);
      std::set<std::pair<int, int>> by_query, by_key;
      for (int i = 0; i < tiles; ++i) {
        for (int j = 0; j < causal_key_tile_end(i); ++j) by_query.insert({i, j});
      }
      for (int j = 0; j < tiles; ++j) {
        for (int i = causal_query_tile_begin(j); i < tiles; ++i) by_key.insert({i, j});
      }
      CHECK(by_query == by_key);  // dQ and dK/dV see the same tile pairs
      // Every visible pair lies in a walked tile pair; a skipped pair has nothing visible.
      for (int q = 0; q < tiles * tile; ++q) {
        for (int k = 0; k < tiles * tile; ++k) {
          if (causal_visible(q, k, T)) {
            CHECK(by_query.count({q / tile, k / tile}) == 1);
            CHECK(q < T);
            CHECK(k < T);
          }
        }
      }
    }
  }
}

TEST_CASE("a row that has seen nothing yet stays finite and contributes nothing") {
  OnlineSoftmax row;
  TileRescale r = begin_key_tile(row, -INFINITY);  // a wholly masked tile first
  CHECK(r.alpha == 0.0f);
  CHECK(tile_weight(masked_score(3.0f, 1.0f, 0, 5, 10), r.max) == 0.0f);
  end_key_tile(row, r, 0.0f);
  CHECK(row.sum == 0.0f);
  CHECK(output_value(0.0f, row) == 0.0f);
  CHECK(row_log_sum_exp(row) == -INFINITY);
  CHECK(probability(-INFINITY, 0.0f) == 0.0f);
  CHECK(probability(-INFINITY, -INFINITY) == 0.0f);

  // Then a visible tile: the row behaves as if the masked one never happened.
  r = begin_key_tile(row, 2.0f);
  CHECK(r.max == 2.0f);
  CHECK(r.alpha == 0.0f);
  end_key_tile(row, r, tile_weight(2.0f, r.max) + tile_weight(1.0f, r.max));
  CHECK(row_log_sum_exp(row) == doctest::Approx(std::log(std::exp(2.0) + std::exp(1.0))).epsilon(1e-6));
  CHECK(masked_score(4.0f, 0.5f, 3, 3, 4) == 2.0f);  // the diagonal is visible
  CHECK(masked_score(4.0f, 0.5f, 3, 4, 5) == -INFINITY);  // the future is not
  CHECK(masked_score(4.0f, 0.5f, 4, 0, 4) == -INFINITY);  // nor a padding row past T
}

TEST_CASE("tile by tile rescaling gives the row's softmax output exactly as one pass would") {
  // One query row against 200 keys in tiles of 32: the running output equals the
  // direct softmax-weighted sum of a value per key.
  const auto scores = random_vector(200, 5, 4.0f);
  const auto values = random_vector(200, 6);
  OnlineSoftmax row;
  float acc = 0.0f;
  for (int first = 0; first < 200; first += 32) {
    float tile_max = -INFINITY;
    for (int c = first; c < std::min(200, first + 32); ++c) tile_max = std::max(tile_max, scores[c]);
    const TileRescale r = begin_key_tile(row, tile_max);
    float sum = 0.0f;
    acc *= r.alpha;
    for (int c = first; c < std::min(200, first + 32); ++c) {
      const float p = tile_weight(scores[c], r.max);
      sum += p;
      acc += p * values[c];
    }
    end_key_tile(row, r, sum);
  }
  double max = -INFINITY, sum = 0, weighted = 0;
  for (float s : scores) max = std::max<double>(max, s);
  for (int c = 0; c < 200; ++c) {
    sum += std::exp(scores[c] - max);
    weighted += std::exp(scores[c] - max) * values[c];
  }
  CHECK(output_value(acc, row) == doctest::Approx(weighted / sum).epsilon(1e-5).scale(0));
  CHECK(row_log_sum_exp(row) == doctest::Approx(max + std::log(sum)).epsilon(1e-6));
  CHECK(score_gradient(0.5f, 2.0f, 1.0f, 0.25f) == 0.125f);
}

}  // namespace
}  // namespace swarm::kernels::flash
