// GEMMs through OpenBLAS (Debian's OpenMP build). Weights are [OC, C]
// row-major, so the forward is inp * W^T, a transposed operand that BLAS packs
// without a copy. On this machine's cores OpenBLAS's kernels run the block's
// GEMMs about 1.3x faster than Eigen's (//bench:block_vs_pytorch prints both).
//
// Results do not depend on the thread count: OpenBLAS splits a GEMM over rows
// and columns of the output, never over the summed dimension, so every output
// is summed in the same order at 1 or many threads. ops_test checks it.
#include <omp.h>

#include <algorithm>
#include <cblas.h>

#include "kernels/cpu/ops.h"

namespace swarm::cpu {
namespace {

// OpenBLAS's OpenMP build takes its thread count from the calling thread's
// OpenMP setting, and a server's I/O thread has its own: set it per call.
void use_kernel_threads() { omp_set_num_threads(kernel_threads()); }

}  // namespace

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC) {
  use_kernel_threads();
  float beta = 0.0f;
  if (bias != nullptr) {
    // The bias is written first and the GEMM adds onto it: one pass over out.
    for (int i = 0; i < N; ++i) std::copy(bias, bias + OC, out + static_cast<int64_t>(i) * OC);
    beta = 1.0f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, beta, out,
              OC);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int N, int C, int OC) {
  use_kernel_threads();
  if (dinp != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C,
                1.0f, dinp, C);
  }
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f,
              dweight, C);
  if (dbias == nullptr) return;
  // Column sums over rows in row order, split over column blocks: the order
  // of each sum is fixed whatever the thread count.
  constexpr int kColumnBlock = 64;
  const int blocks = (OC + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for num_threads(kernel_threads()) schedule(static) if (int64_t{N} * OC > (1 << 16))
  for (int block = 0; block < blocks; ++block) {
    const int c0 = block * kColumnBlock, c1 = std::min(OC, c0 + kColumnBlock);
    float sums[kColumnBlock] = {};
    for (int i = 0; i < N; ++i) {
      const float* row = dout + static_cast<int64_t>(i) * OC;
      for (int c = c0; c < c1; ++c) sums[c - c0] += row[c];
    }
    for (int c = c0; c < c1; ++c) dbias[c] += sums[c - c0];
  }
}

}  // namespace swarm::cpu
