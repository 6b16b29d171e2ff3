// compute_device: whether this machine can compute on a backend. Apart from
// compute_options because it links the CUDA runtime: a model that computes on
// the CPU only (a user's, through apps/cli) never needs it.
#pragma once

#include "apps/compute_options.h"
#include "swarm/core/status.h"

namespace swarm::apps {

// For a CUDA backend: the GPU is there and its allocator installs; otherwise
// unavailable, naming CUDA and the reason. Always ok for the CPU.
Status ensure_compute_device(ComputeBackend backend);

}  // namespace swarm::apps
