// --device, --precision and --attention: which combinations name a backend,
// which are refused by name, and that every role asked for CUDA on a machine
// without a usable GPU stops at once with a message naming CUDA and a
// non-zero status, before it writes a run directory or joins a registry.
#include "apps/compute_device.h"
#include "apps/compute_options.h"

#include <chrono>
#include <filesystem>
#include <string>

#include <doctest/doctest.h>

#include "kernels/cuda/device_info.h"
#include "tests/apps/swarm_process.h"

namespace swarm::apps {
namespace {

namespace fs = std::filesystem;
using test_apps::kSwarmBinary;
using test_apps::run_command;

Result<ComputeBackend> parse(std::string device, std::string precision, std::string attention) {
  return parse_compute(ComputeOptions{std::move(device), std::move(precision), std::move(attention)});
}

TEST_CASE("each backend has its flags, and precision defaults to the device's") {
  CHECK(*parse("cpu", "", "flash") == ComputeBackend::cpu_fp32);
  CHECK(*parse("cpu", "fp32", "flash") == ComputeBackend::cpu_fp32);
  CHECK(*parse("cuda", "", "flash") == ComputeBackend::cuda_bf16);
  CHECK(*parse("cuda", "bf16", "flash") == ComputeBackend::cuda_bf16);
  CHECK(*parse("cuda", "fp32", "flash") == ComputeBackend::cuda_fp32);
  CHECK(*parse("cuda", "", "cudnn") == ComputeBackend::cuda_bf16_cudnn);
  CHECK_FALSE(is_cuda(ComputeBackend::cpu_fp32));
  CHECK(is_cuda(ComputeBackend::cuda_bf16_cudnn));
  CHECK(ensure_compute_device(ComputeBackend::cpu_fp32).is_ok());
}

TEST_CASE("combinations no backend computes are refused, naming the flag") {
  struct Case {
    const char *device, *precision, *attention, *names;
  };
  for (const Case& c : {Case{"gpu", "", "flash", "--device gpu"}, Case{"cpu", "bf16", "flash", "--precision bf16"},
                        Case{"cpu", "", "cudnn", "--attention cudnn"}, Case{"cuda", "fp32", "cudnn", "--attention cudnn"},
                        Case{"cuda", "fp8", "flash", "--precision fp8"}, Case{"cuda", "", "paged", "--attention paged"}}) {
    auto backend = parse(c.device, c.precision, c.attention);
    REQUIRE_FALSE(backend.is_ok());
    CHECK(backend.status().code() == StatusCode::invalid_argument);
    CHECK_MESSAGE(backend.status().message().find(c.names) != std::string::npos, backend.status().message());
  }
}

TEST_CASE("the flags a parent passes select the same backend in its children") {
  const ComputeOptions options{"cuda", "fp32", "flash"};
  const std::vector<std::string> flags = compute_flags(options);
  CHECK(flags == std::vector<std::string>{"--device", "cuda", "--attention", "flash", "--precision", "fp32"});
  CHECK(compute_flags(ComputeOptions{}) == std::vector<std::string>{"--device", "cpu", "--attention", "flash"});
}

TEST_CASE("swarm train, peer and local with --device cuda stop at once without a GPU") {
  const cuda::DeviceCount devices = cuda::count_devices();
  if (devices.count > 0) {
    MESSAGE("skipped: a CUDA device is present, so --device cuda starts");
    return;
  }
  const fs::path dir = test_apps::temp_dir("compute_cuda");
  for (const std::string& role : {std::string("train --steps 1"), std::string("local --run-dir ") + dir.string(),
                                  std::string("peer --stage 0 --bootstrap 127.0.0.1:9")}) {
    const auto start = std::chrono::steady_clock::now();
    auto run = run_command(fmt::format("{} {} --device cuda 2>&1", kSwarmBinary, role));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    INFO(role << ": " << run.output);
    CHECK(run.exit_code != 0);
    CHECK(run.exit_code != -1);
    CHECK(run.output.find("--device cuda: no usable CUDA GPU here") != std::string::npos);
    CHECK(seconds < 10.0);  // at once: no registry joined, no peer started, no data read
  }
  CHECK_FALSE(fs::exists(dir));
}

}  // namespace
}  // namespace swarm::apps
