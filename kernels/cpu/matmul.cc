// GEMMs through Eigen's blocked, vectorized kernels. Weights are [OC, C]
// row-major, so the forward is inp * W^T: Eigen folds the transpose into its
// packing, and no copy is made. Eigen parallelizes a GEMM over OpenMP threads
// only when called outside a parallel region, which is the case here.
#include <Eigen/Core>

#include "kernels/cpu/ops.h"

namespace swarm::cpu {
namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapMatrix = Eigen::Map<RowMatrix>;
using ConstMapMatrix = Eigen::Map<const RowMatrix>;
using ConstMapRow = Eigen::Map<const Eigen::RowVectorXf>;
using MapRow = Eigen::Map<Eigen::RowVectorXf>;

}  // namespace

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC) {
  MapMatrix o(out, N, OC);
  ConstMapMatrix x(inp, N, C);
  ConstMapMatrix w(weight, OC, C);
  o.noalias() = x * w.transpose();
  if (bias != nullptr) o.rowwise() += ConstMapRow(bias, OC);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int N, int C, int OC) {
  ConstMapMatrix dy(dout, N, OC);
  if (dinp != nullptr) {
    MapMatrix dx(dinp, N, C);
    dx.noalias() += dy * ConstMapMatrix(weight, OC, C);
  }
  MapMatrix dw(dweight, OC, C);
  dw.noalias() += dy.transpose() * ConstMapMatrix(inp, N, C);
  if (dbias != nullptr) MapRow(dbias, OC) += dy.colwise().sum();
}

}  // namespace swarm::cpu
