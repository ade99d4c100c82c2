#pragma once
// Whether the GPU half of gradcomp's tests and of gradcomp-bench-cuda runs, is skipped, or fails:
// one rule for both (the bench includes this header too).
//
// The CUDA runtime cannot tell "no driver here" from "a driver too old for this runtime": both give
// cudaErrorInsufficientDriver. So the rule also asks whether the driver library can be loaded:
//
//   - the device query succeeds with at least one device: run;
//   - cudaErrorNoDevice, or a query that fails where no driver library can be loaded (a machine
//     without an NVIDIA driver): skip;
//   - any other failure of a driver that is present (too old for the runtime, not initialised, a
//     broken installation): fail, naming the CUDA error.
//
// GRADCOMP_REQUIRE_GPU=1 in the environment turns every skip into a failure, so that a run meant
// for a GPU cannot pass while testing nothing (docs/cuda.md §6). The rule itself is the pure
// function `classify_gpu_presence`, which the tests check on machines without a GPU by feeding it
// the query results a GPU machine could give.
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdlib>
#include <string>

namespace gradcomp::test {

/// What the GPU half of a test program does here.
enum class gpu_verdict {
  run,   ///< A CUDA device answers: run the GPU cases.
  skip,  ///< No driver or no device: skip them, saying why.
  fail,  ///< A driver that fails, or GRADCOMP_REQUIRE_GPU with nothing to run on: fail, saying why.
};

/// The verdict and the sentence that explains it (empty for `run`).
struct gpu_presence {
  gpu_verdict verdict;
  std::string reason;
};

/// The environment switch that turns every GPU skip into a failure.
inline constexpr const char* require_gpu_variable = "GRADCOMP_REQUIRE_GPU";

/// Whether a value of GRADCOMP_REQUIRE_GPU asks for a GPU: any value but unset, empty or "0".
[[nodiscard]] inline bool gpu_required(const char* value) noexcept {
  return value != nullptr && value[0] != '\0' && std::string(value) != "0";
}

/// The rule: `query` and `devices` from cudaGetDeviceCount, whether the CUDA driver library can be
/// loaded, and whether GRADCOMP_REQUIRE_GPU is set.
[[nodiscard]] inline gpu_presence classify_gpu_presence(cudaError_t query, int devices, bool driver_loadable,
                                                        bool required) {
  std::string skip_reason;
  if (query == cudaSuccess && devices > 0) return {gpu_verdict::run, {}};
  if (query == cudaSuccess || query == cudaErrorNoDevice) {
    skip_reason = "no CUDA device (cudaGetDeviceCount: " + std::string(cudaGetErrorName(query)) + ", " +
                  std::to_string(devices) + " devices)";
  } else if (!driver_loadable) {
    skip_reason =
        "no CUDA driver (libcuda.so.1 cannot be loaded; cudaGetDeviceCount: " + std::string(cudaGetErrorName(query)) +
        ")";
  } else {
    return {gpu_verdict::fail, "the CUDA driver is present but the device query failed: cudaGetDeviceCount returned " +
                                   std::string(cudaGetErrorName(query)) + " (" + cudaGetErrorString(query) + ")"};
  }
  if (required) return {gpu_verdict::fail, std::string(require_gpu_variable) + " is set, but " + skip_reason};
  return {gpu_verdict::skip, skip_reason};
}

/// Whether the CUDA driver library (libcuda.so.1) can be loaded into this process.
[[nodiscard]] inline bool cuda_driver_loadable() noexcept {
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (driver == nullptr) return false;
  dlclose(driver);
  return true;
}

/// The verdict for this process: the device query, the driver library and the environment, asked
/// once (the runtime's answer does not change while a process runs).
[[nodiscard]] inline const gpu_presence& gpu_presence_here() {
  static const gpu_presence presence = [] {
    int devices = 0;
    const cudaError_t query = cudaGetDeviceCount(&devices);
    const bool loadable = query == cudaSuccess || cuda_driver_loadable();
    return classify_gpu_presence(query, devices, loadable, gpu_required(std::getenv(require_gpu_variable)));
  }();
  return presence;
}

}  // namespace gradcomp::test
