// Element-wise kernels: GELU, residual add, accumulate, embeddings and the
// fused softmax cross-entropy. Memory-bound; split over rows or elements.
#include <algorithm>
#include <cmath>

#include <Eigen/Core>

#include "kernels/cpu/ops.h"

namespace swarm::cpu {
namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr int64_t kParallelThreshold = 1 << 15;

}  // namespace

// GELU runs on Eigen arrays: Eigen's tanh is vectorized (AVX-512 here), where
// std::tanh is a scalar libm call that dominated the MLP's element-wise time.
void gelu_forward(float* out, const float* inp, int64_t n) {
  constexpr int64_t kChunk = 1 << 14;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for num_threads(kernel_threads()) schedule(static) if (n > kParallelThreshold)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t begin = chunk * kChunk, size = std::min(kChunk, n - begin);
    Eigen::Map<const Eigen::ArrayXf> x(inp + begin, size);
    Eigen::Map<Eigen::ArrayXf> y(out + begin, size);
    y = 0.5f * x * (1.0f + (kGeluScale * (x + 0.044715f * x.cube())).tanh());
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  constexpr int64_t kChunk = 1 << 14;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for num_threads(kernel_threads()) schedule(static) if (n > kParallelThreshold)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t begin = chunk * kChunk, size = std::min(kChunk, n - begin);
    Eigen::Map<const Eigen::ArrayXf> x(inp + begin, size), dy(dout + begin, size);
    Eigen::Map<Eigen::ArrayXf> dx(dinp + begin, size);
    const Eigen::ArrayXf t = (kGeluScale * (x + 0.044715f * x.cube())).tanh();
    dx += dy * (0.5f * (1.0f + t) +
                x * 0.5f * (1.0f - t.square()) * kGeluScale * (1.0f + 3.0f * 0.044715f * x.square()));
  }
}

void residual_forward(float* out, const float* a, const float* b, int64_t n) {
#pragma omp parallel for simd num_threads(kernel_threads()) schedule(static) if (n > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void accumulate(float* dst, const float* src, int64_t n) {
#pragma omp parallel for simd num_threads(kernel_threads()) schedule(static) if (n > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                       int T, int C) {
#pragma omp parallel for num_threads(kernel_threads()) schedule(static)
  for (int bt = 0; bt < B * T; ++bt) {
    const float* token_row = wte + static_cast<int64_t>(tokens[bt]) * C;
    const float* position_row = wpe + static_cast<int64_t>(bt % T) * C;
    float* y = out + static_cast<int64_t>(bt) * C;
    for (int c = 0; c < C; ++c) y[c] = token_row[c] + position_row[c];
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                        int T, int C) {
  // Tokens repeat, so rows of dwte collide: scatter in a fixed order, one thread.
  for (int bt = 0; bt < B * T; ++bt) {
    const float* dy = dout + static_cast<int64_t>(bt) * C;
    float* token_row = dwte + static_cast<int64_t>(tokens[bt]) * C;
    for (int c = 0; c < C; ++c) token_row[c] += dy[c];
  }
  // Positions are columns of work: each t sums over b in order.
#pragma omp parallel for num_threads(kernel_threads()) schedule(static)
  for (int t = 0; t < T; ++t) {
    float* position_row = dwpe + static_cast<int64_t>(t) * C;
    for (int b = 0; b < B; ++b) {
      const float* dy = dout + (static_cast<int64_t>(b) * T + t) * C;
      for (int c = 0; c < C; ++c) position_row[c] += dy[c];
    }
  }
}

void cross_entropy_forward_backward(float* losses, float* dlogits, const float* logits,
                                    const int32_t* targets, int N, int V, float dloss_scale) {
#pragma omp parallel for num_threads(kernel_threads()) schedule(static)
  for (int i = 0; i < N; ++i) {
    const float* row = logits + static_cast<int64_t>(i) * V;
    float max_value = row[0];
    for (int v = 1; v < V; ++v) max_value = std::max(max_value, row[v]);
    float sum = 0.0f;
    for (int v = 0; v < V; ++v) sum += std::exp(row[v] - max_value);
    const float log_sum = std::log(sum) + max_value;
    const int target = targets[i];
    losses[i] = log_sum - row[target];
    if (dlogits != nullptr) {
      float* drow = dlogits + static_cast<int64_t>(i) * V;
      const float inverse = 1.0f / sum;
      for (int v = 0; v < V; ++v) drow[v] = std::exp(row[v] - max_value) * inverse * dloss_scale;
      drow[target] -= dloss_scale;
    }
  }
}

}  // namespace swarm::cpu
