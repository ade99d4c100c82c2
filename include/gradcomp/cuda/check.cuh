#pragma once
/// @file
/// The checked call of the CUDA backend: `GRADCOMP_CUDA_CHECK(call)` runs a CUDA runtime call and
/// throws `gradcomp::error` with `errc::device_failed` when it fails, naming the call, the file
/// and line, and the CUDA error's name and description. After a kernel launch,
/// `GRADCOMP_CUDA_CHECK(cudaGetLastError())` reports a failed launch the same way.

#include <gradcomp/cuda/config.cuh>

#include <cuda_runtime.h>

#include <string>

#include <gradcomp/core/error.hpp>

namespace gradcomp::detail::cuda {

/// Throws `device_failed` for a status other than `cudaSuccess`, naming `call` at `file`:`line`.
inline void check(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) [[likely]]
    return;
  throw error(errc::device_failed, std::string(call) + " at " + file + ":" + std::to_string(line) + " failed: " +
                                       cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
}

}  // namespace gradcomp::detail::cuda

/// Runs a CUDA runtime call; throws `gradcomp::error` (`errc::device_failed`) naming the call, the
/// file and line, and the CUDA error when it does not return `cudaSuccess`.
#define GRADCOMP_CUDA_CHECK(call) ::gradcomp::detail::cuda::check((call), #call, __FILE__, __LINE__)
