// The rule that decides whether the GPU cases (and gradcomp-bench-cuda) run, skip or fail
// (cuda/gpu_presence.hpp), checked with the device-query results a GPU machine can give, since the
// machines that build the tests may have none: a driver that is present but fails must fail (its
// CUDA error named), no driver or no device is a skip, and GRADCOMP_REQUIRE_GPU turns every skip
// into a failure. Runs everywhere; needs no GPU.
#include <cuda_runtime_api.h>

#include <doctest/doctest.h>

#include <string>

#include "cuda/gpu_presence.hpp"

using namespace gradcomp::test;

namespace {

bool mentions(const gpu_presence& presence, const std::string& text) {
  return presence.reason.find(text) != std::string::npos;
}

}  // namespace

TEST_CASE("gpu presence: a device runs, no driver or no device skips, a driver that fails fails") {
  const gpu_presence device = classify_gpu_presence(cudaSuccess, 2, true, false);
  CHECK(device.verdict == gpu_verdict::run);
  CHECK(device.reason.empty());

  // No driver library: the runtime says cudaErrorInsufficientDriver (as on a machine with no
  // NVIDIA driver at all); that is a skip, not a failure.
  const gpu_presence no_driver = classify_gpu_presence(cudaErrorInsufficientDriver, 0, false, false);
  CHECK(no_driver.verdict == gpu_verdict::skip);
  CHECK(mentions(no_driver, "libcuda.so.1"));
  CHECK(mentions(no_driver, "cudaErrorInsufficientDriver"));

  // A driver with no device.
  for (const bool loadable : {true, false}) {
    const gpu_presence no_device = classify_gpu_presence(cudaErrorNoDevice, 0, loadable, false);
    CHECK(no_device.verdict == gpu_verdict::skip);
    CHECK(mentions(no_device, "cudaErrorNoDevice"));
  }
  CHECK(classify_gpu_presence(cudaSuccess, 0, true, false).verdict == gpu_verdict::skip);

  // The same code from a driver that is there (older than this runtime needs), and any other
  // failure of a present driver: fail, naming the error.
  for (const cudaError_t failure : {cudaErrorInsufficientDriver, cudaErrorNotPermitted, cudaErrorInitializationError,
                                    cudaErrorSystemDriverMismatch, cudaErrorDevicesUnavailable, cudaErrorUnknown}) {
    const gpu_presence broken = classify_gpu_presence(failure, 0, true, false);
    CAPTURE(broken.reason);
    CHECK(broken.verdict == gpu_verdict::fail);
    CHECK(mentions(broken, cudaGetErrorName(failure)));
    CHECK(mentions(broken, "driver is present"));
    // ... whether or not a GPU is required.
    CHECK(classify_gpu_presence(failure, 0, true, true).verdict == gpu_verdict::fail);
  }
}

TEST_CASE("gpu presence: GRADCOMP_REQUIRE_GPU turns every skip into a failure and leaves a device running") {
  for (const cudaError_t query : {cudaErrorInsufficientDriver, cudaErrorNoDevice, cudaSuccess}) {
    const gpu_presence required = classify_gpu_presence(query, 0, false, true);
    CAPTURE(required.reason);
    CHECK(required.verdict == gpu_verdict::fail);
    CHECK(mentions(required, "GRADCOMP_REQUIRE_GPU is set"));
    CHECK(mentions(required, classify_gpu_presence(query, 0, false, false).reason));  // and why there is no GPU
  }
  CHECK(classify_gpu_presence(cudaSuccess, 1, true, true).verdict == gpu_verdict::run);

  CHECK(!gpu_required(nullptr));
  CHECK(!gpu_required(""));
  CHECK(!gpu_required("0"));
  CHECK(gpu_required("1"));
  CHECK(gpu_required("yes"));
}
