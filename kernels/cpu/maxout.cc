// Maxout over contiguous slices, the compression of a boundary layer.
//
// Rows are independent and each input element feeds at most one output, so
// both passes split over rows with no reduction and the bits never depend on
// the thread count. The backward recomputes the argmax from the input instead
// of keeping an index tensor: the stage keeps the input anyway (it is the
// LayerNorm output), and the same comparison on the same values picks the same
// winner, so forward and backward always agree on it.
#include <cstdint>

#include "kernels/cpu/ops.h"

namespace swarm::cpu {
namespace {

// The first g in [0, k) whose value is the maximum of x[g * stride], where a
// NaN beats everything (so a NaN upstream is never hidden from the wire checks).
int first_argmax(const float* x, int k, int stride) {
  int arg = 0;
  float best = x[0];
  for (int g = 1; g < k; ++g) {
    const float v = x[static_cast<int64_t>(g) * stride];
    if (v > best || (v != v && best == best)) {
      best = v;
      arg = g;
    }
  }
  return arg;
}

}  // namespace

void maxout_forward(float* out, const float* inp, int N, int C, int k) {
  const int W = C / k;
#pragma omp parallel for num_threads(kernel_threads()) schedule(static) if (int64_t{N} * C > (1 << 15))
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<int64_t>(n) * C;
    float* y = out + static_cast<int64_t>(n) * W;
    for (int j = 0; j < W; ++j) y[j] = x[j + static_cast<int64_t>(first_argmax(x + j, k, W)) * W];
  }
}

void maxout_backward(float* dinp, const float* dout, const float* inp, int N, int C, int k) {
  const int W = C / k;
#pragma omp parallel for num_threads(kernel_threads()) schedule(static) if (int64_t{N} * C > (1 << 15))
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<int64_t>(n) * C;
    const float* dy = dout + static_cast<int64_t>(n) * W;
    float* dx = dinp + static_cast<int64_t>(n) * C;
    for (int j = 0; j < W; ++j) dx[j + static_cast<int64_t>(first_argmax(x + j, k, W)) * W] += dy[j];
  }
}

}  // namespace swarm::cpu
