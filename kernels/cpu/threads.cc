#include <omp.h>

#include <Eigen/Core>

#include "kernels/cpu/ops.h"

namespace swarm::cpu {

void set_num_threads(int threads) {
  if (threads <= 0) threads = omp_get_num_procs();
  omp_set_num_threads(threads);
  Eigen::setNbThreads(threads);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace swarm::cpu
