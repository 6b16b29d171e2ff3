// See attention.h for the design. The per-tile math lives in
// kernels/common/flash_tile.h; tests/kernels/common/flash_tile_test.cc runs this
// file's tiling on the CPU (same tiles, loop order, masking and rescaling).
//
// Every kernel has 4 warps. A block owns one tile of rows of one (batch, head);
// warp w owns rows [w * kRowsPerWarp, (w + 1) * kRowsPerWarp) of every
// row-indexed buffer (scores, probabilities, accumulators), so between a warp's
// own products only __syncwarp is needed; __syncthreads guards the tiles all
// warps read (Q, K, V, dO, and in the key kernel P and dS, read column-wise).
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "kernels/common/flash_tile.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/element_types.cuh"

namespace swarm::cuda {
namespace {

namespace flash = kernels::flash;
namespace wmma = nvcuda::wmma;
using kernels::OnlineSoftmax;

constexpr int kWarp = 32;
constexpr int kThreads = flash::kWarps * kWarp;
constexpr int kFragment = 16;  // wmma m = n = k

template <typename E>
constexpr bool kTensorCores = std::is_same_v<E, __nv_bfloat16>;

// The shared-memory geometry of one (element type, head size).
template <typename E, int kHd>
struct Geometry {
  static constexpr int kTile = flash::tile_size(sizeof(E));
  static constexpr int kRowsPerWarp = kTile / flash::kWarps;
  static constexpr int kScoreColsPerLane = kTile / kWarp;
  // Row strides in elements. wmma wants strides of 16 bytes and fragment starts
  // on 32 bytes, which 16-row steps of these strides keep; the padding spreads
  // rows over the banks. Float tiles read down a column by the lanes get an odd stride.
  static constexpr int kPad = kTensorCores<E> ? 8 : 1;
  static constexpr int kLdInput = kHd + kPad;     // Q, K, V, dO tiles (E)
  static constexpr int kLdScore = kTile + 4;      // S and dP (float)
  static constexpr int kLdProb = kTile + kPad;    // P and dS (E)
  static constexpr int kLdAcc = kHd + 4;          // O, dK, dV, dQ accumulators (float)
  static constexpr size_t kInputBytes = size_t(kTile) * kLdInput * sizeof(E);
  static constexpr size_t kScoreBytes = size_t(kTile) * kLdScore * sizeof(float);
  static constexpr size_t kProbBytes = size_t(kTile) * kLdProb * sizeof(E);
  static constexpr size_t kAccBytes = size_t(kTile) * kLdAcc * sizeof(float);
  static constexpr size_t kRowStatBytes = size_t(kTile) * sizeof(float);

  static_assert(kTile % (flash::kWarps * 8) == 0 && kHd % kWarp == 0);
  static_assert(!kTensorCores<E> || kRowsPerWarp == kFragment, "a warp's rows are one fragment high");
  static_assert(kHd % kFragment == 0 && kTile % kFragment == 0);
};

constexpr size_t align_up(size_t bytes) { return (bytes + 127) / 128 * 128; }

// Carves the dynamic shared memory into buffers in order, each 128-byte aligned.
class SharedCarver {
 public:
  __device__ explicit SharedCarver(unsigned char* base) : next_(base) {}
  template <typename U>
  __device__ U* take(size_t bytes) {
    U* p = reinterpret_cast<U*>(next_);
    next_ += align_up(bytes);
    return p;
  }

 private:
  unsigned char* next_;
};

template <typename E, int kHd>
constexpr size_t forward_shared_bytes() {
  using G = Geometry<E, kHd>;
  return 3 * align_up(G::kInputBytes) + align_up(G::kScoreBytes) + align_up(G::kProbBytes) +
         align_up(G::kAccBytes);
}

template <typename E, int kHd>
constexpr size_t backward_key_shared_bytes() {
  using G = Geometry<E, kHd>;
  return 4 * align_up(G::kInputBytes) + align_up(G::kScoreBytes) + 2 * align_up(G::kProbBytes) +
         2 * align_up(G::kAccBytes) + 2 * align_up(G::kRowStatBytes);
}

template <typename E, int kHd>
constexpr size_t backward_query_shared_bytes() {
  using G = Geometry<E, kHd>;
  return 4 * align_up(G::kInputBytes) + align_up(G::kScoreBytes) + align_up(G::kProbBytes) +
         align_up(G::kAccBytes) + 2 * align_up(G::kRowStatBytes);
}

__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

__device__ __forceinline__ int lane_id() { return threadIdx.x % kWarp; }

// tile[r][0..kHd) = src row (first_row + r), zero past T; all threads of the block.
// `vectorized`: src is 16-byte aligned, so rows move in 16-byte chunks (every row
// start is then aligned too: row strides and head offsets are multiples of 32 elements).
template <typename E, int kHd>
__device__ void load_tile(E* tile, const E* src, int64_t src_row_stride, int first_row, int T, bool vectorized) {
  using G = Geometry<E, kHd>;
  constexpr int kPerChunk = 16 / sizeof(E);
  constexpr int kChunksPerRow = kHd / kPerChunk;
  for (int i = threadIdx.x; i < G::kTile * kChunksPerRow; i += kThreads) {
    const int r = i / kChunksPerRow;
    const int col = (i % kChunksPerRow) * kPerChunk;
    const int t = first_row + r;
    alignas(16) E values[kPerChunk];
    if (t >= T) {
#pragma unroll
      for (int e = 0; e < kPerChunk; ++e) values[e] = from_float<E>(0.0f);
    } else if (vectorized) {
      *reinterpret_cast<uint4*>(values) = *reinterpret_cast<const uint4*>(src + t * src_row_stride + col);
    } else {
#pragma unroll
      for (int e = 0; e < kPerChunk; ++e) values[e] = src[t * src_row_stride + col + e];
    }
    E* dst = tile + r * G::kLdInput + col;
    if constexpr (kTensorCores<E>) {
      // kLdInput * 2 bytes is a multiple of 16, so every chunk is aligned.
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(values);
    } else {
#pragma unroll
      for (int e = 0; e < kPerChunk; ++e) dst[e] = values[e];
    }
  }
}

// The warp's rows of a float accumulator [kTile][kLdAcc] set to zero.
template <typename E, int kHd>
__device__ void zero_warp_rows(float* acc, int row0) {
  using G = Geometry<E, kHd>;
  for (int i = lane_id(); i < G::kRowsPerWarp * kHd; i += kWarp) {
    acc[(row0 + i / kHd) * G::kLdAcc + i % kHd] = 0.0f;
  }
}

// out[row0 + r][c] = sum_d a[row0 + r][d] * b[c][d] for the warp's rows r and all
// kTile columns c: S = Q K^T and dP = dO V^T. a, b: [kTile][kLdInput]; out: [kTile][kLdScore].
template <typename E, int kHd>
__device__ void warp_abt(float* out, const E* a, const E* b, int row0) {
  using G = Geometry<E, kHd>;
  if constexpr (kTensorCores<E>) {
#pragma unroll
    for (int c = 0; c < G::kTile / kFragment; ++c) {
      wmma::fragment<wmma::accumulator, kFragment, kFragment, kFragment, float> acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int k = 0; k < kHd / kFragment; ++k) {
        wmma::fragment<wmma::matrix_a, kFragment, kFragment, kFragment, E, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, kFragment, kFragment, kFragment, E, wmma::col_major> fb;
        wmma::load_matrix_sync(fa, a + row0 * G::kLdInput + k * kFragment, G::kLdInput);
        // b^T as a column-major matrix: element (d, c) at b[c * ld + d].
        wmma::load_matrix_sync(fb, b + c * kFragment * G::kLdInput + k * kFragment, G::kLdInput);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(out + row0 * G::kLdScore + c * kFragment, acc, G::kLdScore, wmma::mem_row_major);
    }
  } else {
    const int lane = lane_id();
    float acc[G::kRowsPerWarp][G::kScoreColsPerLane] = {};
    for (int d = 0; d < kHd; ++d) {
      float bv[G::kScoreColsPerLane];
#pragma unroll
      for (int j = 0; j < G::kScoreColsPerLane; ++j) bv[j] = to_float(b[(lane + j * kWarp) * G::kLdInput + d]);
#pragma unroll
      for (int r = 0; r < G::kRowsPerWarp; ++r) {
        const float av = to_float(a[(row0 + r) * G::kLdInput + d]);
#pragma unroll
        for (int j = 0; j < G::kScoreColsPerLane; ++j) acc[r][j] += av * bv[j];
      }
    }
#pragma unroll
    for (int r = 0; r < G::kRowsPerWarp; ++r) {
#pragma unroll
      for (int j = 0; j < G::kScoreColsPerLane; ++j) out[(row0 + r) * G::kLdScore + lane + j * kWarp] = acc[r][j];
    }
  }
}

// acc[row0 + r][n] += sum_k A[row0 + r][k] * b[k][n], k over kTile, where A is a
// (kTransposeA false: O += P V and dQ += dS K, the warp's rows are query rows) or
// a^T (kTransposeA true: dV += P^T dO and dK += dS^T Q, the warp's rows are key
// rows, a's columns). a: [kTile][kLdProb]; b: [kTile][kLdInput]; acc: [kTile][kLdAcc].
template <typename E, int kHd, bool kTransposeA>
__device__ void warp_accumulate(float* acc, const E* a, const E* b, int row0) {
  using G = Geometry<E, kHd>;
  if constexpr (kTensorCores<E>) {
    // a^T as a column-major matrix: element (i, j) at a[j * ld + i].
    using ALayout = std::conditional_t<kTransposeA, wmma::col_major, wmma::row_major>;
#pragma unroll
    for (int c = 0; c < kHd / kFragment; ++c) {
      wmma::fragment<wmma::accumulator, kFragment, kFragment, kFragment, float> fc;
      float* target = acc + row0 * G::kLdAcc + c * kFragment;
      wmma::load_matrix_sync(fc, target, G::kLdAcc, wmma::mem_row_major);
#pragma unroll
      for (int k = 0; k < G::kTile / kFragment; ++k) {
        wmma::fragment<wmma::matrix_a, kFragment, kFragment, kFragment, E, ALayout> fa;
        wmma::fragment<wmma::matrix_b, kFragment, kFragment, kFragment, E, wmma::row_major> fb;
        const E* a_fragment =
            kTransposeA ? a + k * kFragment * G::kLdProb + row0 : a + row0 * G::kLdProb + k * kFragment;
        wmma::load_matrix_sync(fa, a_fragment, G::kLdProb);
        wmma::load_matrix_sync(fb, b + k * kFragment * G::kLdInput + c * kFragment, G::kLdInput);
        wmma::mma_sync(fc, fa, fb, fc);
      }
      wmma::store_matrix_sync(target, fc, G::kLdAcc, wmma::mem_row_major);
    }
  } else {
    constexpr int kHeadColsPerLane = kHd / kWarp;
    const int lane = lane_id();
    float sum[G::kRowsPerWarp][kHeadColsPerLane];
#pragma unroll
    for (int r = 0; r < G::kRowsPerWarp; ++r) {
#pragma unroll
      for (int j = 0; j < kHeadColsPerLane; ++j) sum[r][j] = acc[(row0 + r) * G::kLdAcc + lane + j * kWarp];
    }
    for (int k = 0; k < G::kTile; ++k) {
      float bv[kHeadColsPerLane];
#pragma unroll
      for (int j = 0; j < kHeadColsPerLane; ++j) bv[j] = to_float(b[k * G::kLdInput + lane + j * kWarp]);
#pragma unroll
      for (int r = 0; r < G::kRowsPerWarp; ++r) {
        const float av =
            to_float(kTransposeA ? a[k * G::kLdProb + row0 + r] : a[(row0 + r) * G::kLdProb + k]);
#pragma unroll
        for (int j = 0; j < kHeadColsPerLane; ++j) sum[r][j] += av * bv[j];
      }
    }
#pragma unroll
    for (int r = 0; r < G::kRowsPerWarp; ++r) {
#pragma unroll
      for (int j = 0; j < kHeadColsPerLane; ++j) acc[(row0 + r) * G::kLdAcc + lane + j * kWarp] = sum[r][j];
    }
  }
}

// Where one (batch, head) lives in the [B, T, 3C] and [B, T, C] tensors.
struct HeadView {
  int64_t qkv_offset;  // of q; k at + C, v at + 2C; row stride 3C
  int64_t out_offset;  // into out, dout; row stride C
  int64_t stat_offset; // into lse and D: (b * NH + h) * T

  __device__ HeadView(int bh, int T, int C, int NH, int hd) {
    const int b = bh / NH, h = bh % NH;
    qkv_offset = int64_t(b) * T * 3 * C + int64_t(h) * hd;
    out_offset = int64_t(b) * T * C + int64_t(h) * hd;
    stat_offset = int64_t(bh) * T;
  }
};

// grid (query tiles, B * NH). Writes out and lse for the block's query tile.
template <typename E, int kHd>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(E* out, float* lse, const E* qkv, int T, int C, int NH, float scale, bool vectorized) {
  using G = Geometry<E, kHd>;
  extern __shared__ __align__(128) unsigned char shared[];
  SharedCarver carve(shared);
  E* q_tile = carve.take<E>(G::kInputBytes);
  E* k_tile = carve.take<E>(G::kInputBytes);
  E* v_tile = carve.take<E>(G::kInputBytes);
  float* scores = carve.take<float>(G::kScoreBytes);
  E* probs = carve.take<E>(G::kProbBytes);
  float* o_acc = carve.take<float>(G::kAccBytes);

  const int query_tile = gridDim.x - 1 - blockIdx.x;  // the longest rows start first
  const int first_query = query_tile * G::kTile;
  const HeadView head(blockIdx.y, T, C, NH, kHd);
  const E* q_src = qkv + head.qkv_offset;
  const int64_t qkv_stride = 3 * int64_t(C);
  const int lane = lane_id();
  const int row0 = (threadIdx.x / kWarp) * G::kRowsPerWarp;

  load_tile<E, kHd>(q_tile, q_src, qkv_stride, first_query, T, vectorized);
  zero_warp_rows<E, kHd>(o_acc, row0);
  OnlineSoftmax rows[G::kRowsPerWarp];  // the same in every lane: they come out of butterflies

  for (int key_tile = 0; key_tile < flash::causal_key_tile_end(query_tile); ++key_tile) {
    const int first_key = key_tile * G::kTile;
    __syncthreads();  // no warp still reads the previous K and V
    load_tile<E, kHd>(k_tile, q_src + C, qkv_stride, first_key, T, vectorized);
    load_tile<E, kHd>(v_tile, q_src + 2 * C, qkv_stride, first_key, T, vectorized);
    __syncthreads();

    warp_abt<E, kHd>(scores, q_tile, k_tile, row0);
    __syncwarp();
#pragma unroll
    for (int r = 0; r < G::kRowsPerWarp; ++r) {
      const int row = row0 + r;
      const int query = first_query + row;
      float s[G::kScoreColsPerLane];
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < G::kScoreColsPerLane; ++j) {
        const int col = lane + j * kWarp;
        s[j] = flash::masked_score(scores[row * G::kLdScore + col], scale, query, first_key + col, T);
        tile_max = fmaxf(tile_max, s[j]);
      }
      const flash::TileRescale rescale = flash::begin_key_tile(rows[r], warp_max(tile_max));
      float weight_sum = 0.0f;
#pragma unroll
      for (int j = 0; j < G::kScoreColsPerLane; ++j) {
        // The sum takes the unrounded weight, so lse is the float statistic in
        // both element types; P V sees the stored one.
        const float p = flash::tile_weight(s[j], rescale.max);
        probs[row * G::kLdProb + lane + j * kWarp] = from_float<E>(p);
        weight_sum += p;
      }
      flash::end_key_tile(rows[r], rescale, warp_sum(weight_sum));
      for (int n = lane; n < kHd; n += kWarp) o_acc[row * G::kLdAcc + n] *= rescale.alpha;
    }
    __syncwarp();
    warp_accumulate<E, kHd, false>(o_acc, probs, v_tile, row0);
  }
  __syncwarp();

  E* o_dst = out + head.out_offset;
#pragma unroll
  for (int r = 0; r < G::kRowsPerWarp; ++r) {
    const int row = row0 + r;
    const int query = first_query + row;
    if (query >= T) continue;
    for (int n = lane; n < kHd; n += kWarp) {
      store_float(o_dst + int64_t(query) * C + n, flash::output_value(o_acc[row * G::kLdAcc + n], rows[r]));
    }
    if (lane == 0) lse[head.stat_offset + query] = flash::row_log_sum_exp(rows[r]);
  }
}

constexpr int kDotRowsPerBlock = 8;  // one warp per (b, h, t) row

// row_dot[(b * NH + h) * T + t] = sum over the head's columns of dout * out.
template <typename E, int kHd>
__global__ void attention_row_dot_kernel(float* row_dot, const E* dout, const E* out, int B, int T, int C, int NH) {
  const int64_t row = int64_t(blockIdx.x) * kDotRowsPerBlock + threadIdx.x / kWarp;
  if (row >= int64_t(B) * NH * T) return;  // whole warps leave together
  const int t = static_cast<int>(row % T);
  const int64_t bh = row / T;
  const int64_t b = bh / NH, h = bh % NH;
  const int64_t offset = (b * T + t) * C + h * kHd;
  float sum = 0.0f;
  for (int n = lane_id(); n < kHd; n += kWarp) sum += load_float(dout + offset + n) * load_float(out + offset + n);
  sum = warp_sum(sum);
  if (lane_id() == 0) row_dot[row] = sum;
}

// Loads the lse and D of a query tile's rows (0 past T, where every score is masked).
template <typename E, int kHd>
__device__ void load_row_stats(float* tile_lse, float* tile_dot, const float* lse, const float* row_dot,
                               int first_query, int T) {
  using G = Geometry<E, kHd>;
  for (int i = threadIdx.x; i < G::kTile; i += kThreads) {
    const int t = first_query + i;
    tile_lse[i] = t < T ? lse[t] : 0.0f;
    tile_dot[i] = t < T ? row_dot[t] : 0.0f;
  }
}

// For the warp's query rows: p = P from the scores in `scores` (kept in
// registers), then dP = dO V^T into `scores`, then dS = P * (dP - D) * scale.
// `probs` (may be null) receives P. Reads the Q, K, V, dO tiles; writes the
// warp's rows of scores, probs and dscores only.
template <typename E, int kHd>
__device__ void warp_score_gradients(E* dscores, E* probs, float* scores, const E* q_tile, const E* k_tile,
                                     const E* v_tile, const E* do_tile, const float* tile_lse,
                                     const float* tile_dot, int first_query, int first_key, int T, float scale,
                                     int row0) {
  using G = Geometry<E, kHd>;
  const int lane = lane_id();
  warp_abt<E, kHd>(scores, q_tile, k_tile, row0);
  __syncwarp();
  float p[G::kRowsPerWarp][G::kScoreColsPerLane];
#pragma unroll
  for (int r = 0; r < G::kRowsPerWarp; ++r) {
    const int row = row0 + r;
#pragma unroll
    for (int j = 0; j < G::kScoreColsPerLane; ++j) {
      const int col = lane + j * kWarp;
      const float s =
          flash::masked_score(scores[row * G::kLdScore + col], scale, first_query + row, first_key + col, T);
      p[r][j] = flash::probability(s, tile_lse[row]);
      if (probs != nullptr) probs[row * G::kLdProb + col] = from_float<E>(p[r][j]);
    }
  }
  __syncwarp();  // every lane has read its scores before dP overwrites them
  warp_abt<E, kHd>(scores, do_tile, v_tile, row0);
  __syncwarp();
#pragma unroll
  for (int r = 0; r < G::kRowsPerWarp; ++r) {
    const int row = row0 + r;
#pragma unroll
    for (int j = 0; j < G::kScoreColsPerLane; ++j) {
      const int col = lane + j * kWarp;
      dscores[row * G::kLdProb + col] =
          from_float<E>(flash::score_gradient(p[r][j], scores[row * G::kLdScore + col], tile_dot[row], scale));
    }
  }
}

// grid (key tiles, B * NH). dK and dV of one key tile, summed over query tiles in order.
template <typename E, int kHd>
__global__ void __launch_bounds__(kThreads)
    attention_backward_key_kernel(E* dqkv, const float* lse, const float* row_dot, const E* dout, const E* qkv,
                                  int T, int C, int NH, float scale, bool vectorized) {
  using G = Geometry<E, kHd>;
  extern __shared__ __align__(128) unsigned char shared[];
  SharedCarver carve(shared);
  E* q_tile = carve.take<E>(G::kInputBytes);
  E* k_tile = carve.take<E>(G::kInputBytes);
  E* v_tile = carve.take<E>(G::kInputBytes);
  E* do_tile = carve.take<E>(G::kInputBytes);
  float* scores = carve.take<float>(G::kScoreBytes);
  E* probs = carve.take<E>(G::kProbBytes);
  E* dscores = carve.take<E>(G::kProbBytes);
  float* dk_acc = carve.take<float>(G::kAccBytes);
  float* dv_acc = carve.take<float>(G::kAccBytes);
  float* tile_lse = carve.take<float>(G::kRowStatBytes);
  float* tile_dot = carve.take<float>(G::kRowStatBytes);

  const int key_tile = blockIdx.x;  // key tile 0 meets every query tile: the longest start first
  const int first_key = key_tile * G::kTile;
  const HeadView head(blockIdx.y, T, C, NH, kHd);
  const E* q_src = qkv + head.qkv_offset;
  const E* do_src = dout + head.out_offset;
  const int64_t qkv_stride = 3 * int64_t(C);
  const int lane = lane_id();
  const int row0 = (threadIdx.x / kWarp) * G::kRowsPerWarp;

  load_tile<E, kHd>(k_tile, q_src + C, qkv_stride, first_key, T, vectorized);
  load_tile<E, kHd>(v_tile, q_src + 2 * C, qkv_stride, first_key, T, vectorized);
  zero_warp_rows<E, kHd>(dk_acc, row0);
  zero_warp_rows<E, kHd>(dv_acc, row0);

  const int query_tiles = flash::tile_count(T, G::kTile);
  for (int query_tile = flash::causal_query_tile_begin(key_tile); query_tile < query_tiles; ++query_tile) {
    const int first_query = query_tile * G::kTile;
    __syncthreads();  // no warp still reads the previous Q, dO, P, dS
    load_tile<E, kHd>(q_tile, q_src, qkv_stride, first_query, T, vectorized);
    load_tile<E, kHd>(do_tile, do_src, C, first_query, T, vectorized);
    load_row_stats<E, kHd>(tile_lse, tile_dot, lse + head.stat_offset, row_dot + head.stat_offset, first_query, T);
    __syncthreads();

    // Here the warp's rows are query rows ...
    warp_score_gradients<E, kHd>(dscores, probs, scores, q_tile, k_tile, v_tile, do_tile, tile_lse, tile_dot,
                                 first_query, first_key, T, scale, row0);
    __syncthreads();  // ... and here key rows, reading P and dS down the columns all warps wrote.
    warp_accumulate<E, kHd, true>(dv_acc, probs, do_tile, row0);
    warp_accumulate<E, kHd, true>(dk_acc, dscores, q_tile, row0);
  }
  __syncwarp();

  E* dk_dst = dqkv + head.qkv_offset + C;
  E* dv_dst = dqkv + head.qkv_offset + 2 * C;
#pragma unroll
  for (int r = 0; r < G::kRowsPerWarp; ++r) {
    const int row = row0 + r;
    const int key = first_key + row;
    if (key >= T) continue;
    for (int n = lane; n < kHd; n += kWarp) {
      E* dk = dk_dst + key * qkv_stride + n;
      E* dv = dv_dst + key * qkv_stride + n;
      store_float(dk, load_float(dk) + dk_acc[row * G::kLdAcc + n]);
      store_float(dv, load_float(dv) + dv_acc[row * G::kLdAcc + n]);
    }
  }
}

// grid (query tiles, B * NH). dQ of one query tile, summed over key tiles in order.
template <typename E, int kHd>
__global__ void __launch_bounds__(kThreads)
    attention_backward_query_kernel(E* dqkv, const float* lse, const float* row_dot, const E* dout, const E* qkv,
                                    int T, int C, int NH, float scale, bool vectorized) {
  using G = Geometry<E, kHd>;
  extern __shared__ __align__(128) unsigned char shared[];
  SharedCarver carve(shared);
  E* q_tile = carve.take<E>(G::kInputBytes);
  E* k_tile = carve.take<E>(G::kInputBytes);
  E* v_tile = carve.take<E>(G::kInputBytes);
  E* do_tile = carve.take<E>(G::kInputBytes);
  float* scores = carve.take<float>(G::kScoreBytes);
  E* dscores = carve.take<E>(G::kProbBytes);
  float* dq_acc = carve.take<float>(G::kAccBytes);
  float* tile_lse = carve.take<float>(G::kRowStatBytes);
  float* tile_dot = carve.take<float>(G::kRowStatBytes);

  const int query_tile = gridDim.x - 1 - blockIdx.x;  // the longest rows start first
  const int first_query = query_tile * G::kTile;
  const HeadView head(blockIdx.y, T, C, NH, kHd);
  const E* q_src = qkv + head.qkv_offset;
  const int64_t qkv_stride = 3 * int64_t(C);
  const int lane = lane_id();
  const int row0 = (threadIdx.x / kWarp) * G::kRowsPerWarp;

  load_tile<E, kHd>(q_tile, q_src, qkv_stride, first_query, T, vectorized);
  load_tile<E, kHd>(do_tile, dout + head.out_offset, C, first_query, T, vectorized);
  load_row_stats<E, kHd>(tile_lse, tile_dot, lse + head.stat_offset, row_dot + head.stat_offset, first_query, T);
  zero_warp_rows<E, kHd>(dq_acc, row0);

  for (int key_tile = 0; key_tile < flash::causal_key_tile_end(query_tile); ++key_tile) {
    const int first_key = key_tile * G::kTile;
    __syncthreads();  // no warp still reads the previous K
    load_tile<E, kHd>(k_tile, q_src + C, qkv_stride, first_key, T, vectorized);
    load_tile<E, kHd>(v_tile, q_src + 2 * C, qkv_stride, first_key, T, vectorized);
    __syncthreads();

    warp_score_gradients<E, kHd>(dscores, nullptr, scores, q_tile, k_tile, v_tile, do_tile, tile_lse, tile_dot,
                                 first_query, first_key, T, scale, row0);
    __syncwarp();
    warp_accumulate<E, kHd, false>(dq_acc, dscores, k_tile, row0);
  }
  __syncwarp();

  E* dq_dst = dqkv + head.qkv_offset;
#pragma unroll
  for (int r = 0; r < G::kRowsPerWarp; ++r) {
    const int row = row0 + r;
    const int query = first_query + row;
    if (query >= T) continue;
    for (int n = lane; n < kHd; n += kWarp) {
      E* dq = dq_dst + query * qkv_stride + n;
      store_float(dq, load_float(dq) + dq_acc[row * G::kLdAcc + n]);
    }
  }
}

// Kernels above 48 KiB of dynamic shared memory must say so before launch.
template <typename Kernel>
Status allow_shared_memory(Kernel* kernel, size_t bytes, const char* what) {
  int device = 0;
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  int limit = 0;
  SWARM_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (bytes > static_cast<size_t>(limit)) {
    return unimplemented("attention: the {} kernel needs {} bytes of shared memory per block; the device allows {}",
                         what, bytes, limit);
  }
  SWARM_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  return Status::ok();
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

float score_scale(int hd) { return 1.0f / std::sqrt(static_cast<float>(hd)); }  // as the CPU backend

// Hopper and Ampere's opt-in limits: 227 KiB (sm_90), 163 KiB (sm_80). The largest
// block (bf16, head 128, dK/dV) takes ~170 KiB, so sm_80 reports unimplemented there.
constexpr size_t kMaxSharedBytes = 227 * 1024;

template <typename E, int kHd>
Status launch_forward(E* out, float* lse, const E* qkv, int B, int T, int C, int NH, cudaStream_t stream) {
  using G = Geometry<E, kHd>;
  constexpr size_t bytes = forward_shared_bytes<E, kHd>();
  static_assert(bytes <= kMaxSharedBytes);
  auto* kernel = attention_forward_kernel<E, kHd>;
  SWARM_RETURN_IF_ERROR(allow_shared_memory(kernel, bytes, "forward"));
  const dim3 grid(flash::tile_count(T, G::kTile), B * NH);
  kernel<<<grid, kThreads, bytes, stream>>>(out, lse, qkv, T, C, NH, score_scale(kHd), aligned16(qkv));
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::ok();
}

template <typename E, int kHd>
Status launch_backward(E* dqkv, float* lse, float* row_dot, const E* dout, const E* qkv, const E* out, int B,
                       int T, int C, int NH, cudaStream_t stream) {
  using G = Geometry<E, kHd>;
  const int64_t rows = int64_t(B) * NH * T;
  attention_row_dot_kernel<E, kHd><<<static_cast<unsigned>((rows + kDotRowsPerBlock - 1) / kDotRowsPerBlock),
                                     kDotRowsPerBlock * kWarp, 0, stream>>>(row_dot, dout, out, B, T, C, NH);
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());

  const bool vectorized = aligned16(qkv) && aligned16(dout);
  const dim3 grid(flash::tile_count(T, G::kTile), B * NH);
  const float scale = score_scale(kHd);

  constexpr size_t key_bytes = backward_key_shared_bytes<E, kHd>();
  static_assert(key_bytes <= kMaxSharedBytes);
  auto* key_kernel = attention_backward_key_kernel<E, kHd>;
  SWARM_RETURN_IF_ERROR(allow_shared_memory(key_kernel, key_bytes, "backward dK/dV"));
  key_kernel<<<grid, kThreads, key_bytes, stream>>>(dqkv, lse, row_dot, dout, qkv, T, C, NH, scale, vectorized);
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());

  constexpr size_t query_bytes = backward_query_shared_bytes<E, kHd>();
  static_assert(query_bytes <= kMaxSharedBytes);
  auto* query_kernel = attention_backward_query_kernel<E, kHd>;
  SWARM_RETURN_IF_ERROR(allow_shared_memory(query_kernel, query_bytes, "backward dQ"));
  query_kernel<<<grid, kThreads, query_bytes, stream>>>(dqkv, lse, row_dot, dout, qkv, T, C, NH, scale,
                                                        vectorized);
  SWARM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::ok();
}

Status check_shape(const char* op, int B, int T, int C, int NH, std::initializer_list<const void*> pointers) {
  if (B < 1 || T < 1 || C < 1 || NH < 1) {
    return invalid_argument("{}: sizes must be positive, got B={} T={} C={} NH={}", op, B, T, C, NH);
  }
  if (C % NH != 0) return invalid_argument("{}: C={} is not a multiple of NH={}", op, C, NH);
  for (const void* p : pointers) {
    if (p == nullptr) return invalid_argument("{}: a null device pointer", op);
  }
  const int hd = C / NH;
  if (hd != 32 && hd != 64 && hd != 128) {
    return unimplemented("{}: head size {} (C={} / NH={}); only 32, 64 and 128 are compiled", op, hd, C, NH);
  }
  if (int64_t(B) * NH > 65535) return unimplemented("{}: B * NH = {} exceeds the grid's 65535", op, int64_t(B) * NH);
  return Status::ok();
}

template <typename Element>
Status forward(Element* out, float* scratch, const Element* qkv, int B, int T, int C, int NH,
               cudaStream_t stream) {
  SWARM_RETURN_IF_ERROR(check_shape("attention_forward", B, T, C, NH, {out, scratch, qkv}));
  using E = typename device_type<Element>::type;
  E* d_out = device_cast(out);
  const E* d_qkv = device_cast(qkv);
  switch (C / NH) {
    case 32: return launch_forward<E, 32>(d_out, scratch, d_qkv, B, T, C, NH, stream);
    case 64: return launch_forward<E, 64>(d_out, scratch, d_qkv, B, T, C, NH, stream);
    default: return launch_forward<E, 128>(d_out, scratch, d_qkv, B, T, C, NH, stream);
  }
}

template <typename Element>
Status backward(Element* dqkv, float* scratch, const Element* dout, const Element* qkv, const Element* out, int B,
                int T, int C, int NH, cudaStream_t stream) {
  SWARM_RETURN_IF_ERROR(check_shape("attention_backward", B, T, C, NH, {dqkv, scratch, dout, qkv, out}));
  using E = typename device_type<Element>::type;
  float* lse = scratch;
  float* row_dot = scratch + int64_t(B) * NH * T;
  E* d_dqkv = device_cast(dqkv);
  const E* d_dout = device_cast(dout);
  const E* d_qkv = device_cast(qkv);
  const E* d_out = device_cast(out);
  switch (C / NH) {
    case 32: return launch_backward<E, 32>(d_dqkv, lse, row_dot, d_dout, d_qkv, d_out, B, T, C, NH, stream);
    case 64: return launch_backward<E, 64>(d_dqkv, lse, row_dot, d_dout, d_qkv, d_out, B, T, C, NH, stream);
    default: return launch_backward<E, 128>(d_dqkv, lse, row_dot, d_dout, d_qkv, d_out, B, T, C, NH, stream);
  }
}

}  // namespace

int64_t attention_scratch_floats(int B, int T, int NH) { return 2 * int64_t(B) * NH * T; }

Status attention_forward(float* out, float* scratch, const float* qkv, int B, int T, int C, int NH,
                         cudaStream_t stream) {
  return forward(out, scratch, qkv, B, T, C, NH, stream);
}

Status attention_forward(bf16* out, float* scratch, const bf16* qkv, int B, int T, int C, int NH,
                         cudaStream_t stream) {
  return forward(out, scratch, qkv, B, T, C, NH, stream);
}

Status attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* out,
                          int B, int T, int C, int NH, cudaStream_t stream) {
  return backward(dqkv, scratch, dout, qkv, out, B, T, C, NH, stream);
}

Status attention_backward(bf16* dqkv, float* scratch, const bf16* dout, const bf16* qkv, const bf16* out, int B,
                          int T, int C, int NH, cudaStream_t stream) {
  return backward(dqkv, scratch, dout, qkv, out, B, T, C, NH, stream);
}

}  // namespace swarm::cuda
