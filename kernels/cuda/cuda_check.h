// cuda_check: every CUDA runtime call is checked and reports file:line.
//
// Two forms: SWARM_CUDA_RETURN_IF_ERROR for code that returns Status (the
// usual path: a launcher reports, it does not crash), and SWARM_CUDA_CHECK
// for places where failure means a broken program.
//
//   SWARM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, stream));
#pragma once

#include <cuda_runtime_api.h>

#include "swarm/core/status.h"

namespace swarm::cuda {

inline Status cuda_status(cudaError_t error, const char* call, const char* file, int line) {
  if (error == cudaSuccess) return Status::ok();
  StatusCode code = StatusCode::internal;
  if (error == cudaErrorNoDevice || error == cudaErrorInsufficientDriver) code = StatusCode::unavailable;
  if (error == cudaErrorMemoryAllocation) code = StatusCode::resource_exhausted;
  if (error == cudaErrorInvalidValue) code = StatusCode::invalid_argument;
  return Status(code, fmt::format("{}:{}: {} failed: {} ({})", file, line, call,
                                  cudaGetErrorString(error), cudaGetErrorName(error)));
}

}  // namespace swarm::cuda

#define SWARM_CUDA_RETURN_IF_ERROR(call) \
  SWARM_RETURN_IF_ERROR(::swarm::cuda::cuda_status((call), #call, __FILE__, __LINE__))

#define SWARM_CUDA_CHECK(call)                                                              \
  do {                                                                                      \
    ::swarm::Status swarm_cuda_status_ = ::swarm::cuda::cuda_status((call), #call, __FILE__, __LINE__); \
    if (!swarm_cuda_status_.is_ok()) ::swarm::fatal_error(__FILE__, __LINE__, swarm_cuda_status_.message()); \
  } while (0)
