#include <fmt/core.h>

#include <doctest/doctest.h>

#include "kernels/cuda/device_info.h"

namespace swarm::cuda {
namespace {

TEST_CASE("CUDA smoke: count devices, and run a kernel where one exists") {
  DeviceCount devices = count_devices();
  fmt::print("CUDA devices: {}\n", devices.count);
  if (devices.count == 0) {
    fmt::print("skipped: no CUDA device ({})\n", devices.reason);
    CHECK_FALSE(devices.reason.empty());
    return;
  }
  for (const auto& line : describe_devices()) fmt::print("  {}\n", line);

  std::vector<float> a(1000), b(1000), out;
  for (int i = 0; i < 1000; ++i) {
    a[i] = static_cast<float>(i);
    b[i] = 0.5f * static_cast<float>(i);
  }
  Status status = smoke_add(a, b, &out);
  REQUIRE_MESSAGE(status.is_ok(), status.to_string());
  REQUIRE(out.size() == 1000);
  for (int i = 0; i < 1000; ++i) CHECK(out[i] == 1.5f * static_cast<float>(i));
}

}  // namespace
}  // namespace swarm::cuda
