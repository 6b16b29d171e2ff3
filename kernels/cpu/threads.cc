#include <omp.h>

#include <atomic>

#include <Eigen/Core>

#include "kernels/cpu/ops.h"

namespace swarm::cpu {
namespace {

std::atomic<int> g_threads{0};  // 0: not set yet, use all cores

}  // namespace

void set_num_threads(int threads) {
  if (threads <= 0) threads = omp_get_num_procs();
  g_threads = threads;
  omp_set_num_threads(threads);
  Eigen::setNbThreads(threads);
}

int num_threads() {
  const int threads = g_threads.load(std::memory_order_relaxed);
  return threads > 0 ? threads : omp_get_num_procs();
}

}  // namespace swarm::cpu
