// serve_peer on the CPU backend, and the dispatch to the backend --device chose.
#include "apps/peer_serving_impl.h"
#include "kernels/cpu/cpu_backend.h"

namespace swarm::apps {

int serve_peer_cpu(const PeerServing& serving) { return serve_peer_on<CpuBackend>(serving); }

int serve_peer(ComputeBackend backend, const PeerServing& serving) {
  return is_cuda(backend) ? serve_peer_cuda(backend, serving) : serve_peer_cpu(serving);
}

}  // namespace swarm::apps
