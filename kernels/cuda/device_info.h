// device_info: how many CUDA devices this process can use, and a smoke kernel.
//
// A missing GPU or driver is an ordinary answer (zero devices plus the
// reason), so tests and programs can say "skipped: no CUDA device" and go on.
//
//   auto devices = swarm::cuda::count_devices();
//   if (devices.count == 0) fmt::print("skipped: {}\n", devices.reason);
#pragma once

#include <string>
#include <vector>

#include "swarm/core/status.h"

namespace swarm::cuda {

struct DeviceCount {
  int count = 0;
  std::string reason;  // why there are none, when count == 0
};

DeviceCount count_devices();

// One line per device: name, compute capability, memory.
std::vector<std::string> describe_devices();

// Runs out[i] = a[i] + b[i] on device 0 through device memory: proves that the
// compiled machine code loads and runs on this GPU.
Status smoke_add(const std::vector<float>& a, const std::vector<float>& b, std::vector<float>* out);

}  // namespace swarm::cuda
