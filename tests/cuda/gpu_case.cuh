#pragma once
// The doctest side of a CUDA test case: GRADCOMP_CUDA_TEST_CASE registers a case that runs only
// where gpu_presence_here() says so, and test_gpu() is the executor every CUDA case runs on (a
// non-blocking stream, so that a missing in-stream dependency is not hidden by the legacy default
// stream's implicit synchronisation).
//
// Every case is registered wherever the binary is built, GPU or not, so that ctest (whose list
// is taken at build time) has them all. Where there is no GPU to run on, a case prints
// "GPU test skipped: <why>" and returns, and ctest reports it as skipped (tests/CMakeLists.txt
// sets SKIP_REGULAR_EXPRESSION on that text); where the driver fails, or GRADCOMP_REQUIRE_GPU is
// set, the case fails with the reason instead (cuda/gpu_presence.hpp).
#include <gradcomp/cuda/check.cuh>
#include <gradcomp/cuda/executor.cuh>

#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "cuda/gpu_presence.hpp"

namespace gradcomp::test {

/// The text that marks a skipped GPU case in the output (ctest's SKIP_REGULAR_EXPRESSION).
inline constexpr const char* gpu_skip_marker = "GPU test skipped: ";

/// Ends the current GPU case without running it: a MESSAGE that ctest reads as a skip, or, with
/// GRADCOMP_REQUIRE_GPU set, a failure. The caller returns afterwards.
inline void skip_gpu_case(const std::string& reason) {
  if (gpu_required(std::getenv(require_gpu_variable))) FAIL(std::string(require_gpu_variable), " is set, but ", reason);
  MESSAGE(std::string(gpu_skip_marker), reason);
}

/// Whether the current GPU case runs here. Where it does not, reports why: a skip (returns false)
/// or a failure (FAIL throws).
inline bool proceed_on_gpu() {
  const gpu_presence& presence = gpu_presence_here();
  if (presence.verdict == gpu_verdict::fail) FAIL(presence.reason);
  if (presence.verdict == gpu_verdict::skip) {
    MESSAGE(std::string(gpu_skip_marker), presence.reason);
    return false;
  }
  return true;
}

/// A non-blocking CUDA stream, destroyed with the object.
class test_stream {
 public:
  test_stream() { GRADCOMP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  test_stream(const test_stream&) = delete;
  test_stream& operator=(const test_stream&) = delete;
  ~test_stream() { cudaStreamDestroy(stream_); }

  /// An executor on this stream (with a deferred-error word, when given).
  [[nodiscard]] cuda_executor executor(std::uint32_t* deferred_errors = nullptr) const noexcept {
    return {.stream = stream_, .deferred_errors = deferred_errors};
  }

 private:
  cudaStream_t stream_ = nullptr;
};

/// The executor of the CUDA test cases: one non-blocking stream for the whole process.
inline cuda_executor test_gpu() {
  static const test_stream stream;
  return stream.executor();
}

}  // namespace gradcomp::test

/// A CUDA test case named "cuda: <name>", followed by its body in braces. It runs only where
/// proceed_on_gpu() says so; elsewhere it is reported as skipped, or failed (see above).
#define GRADCOMP_CUDA_TEST_CASE(name) GRADCOMP_CUDA_TEST_CASE_WITH_BODY(DOCTEST_ANONYMOUS(gradcomp_cuda_case_), name)
#define GRADCOMP_CUDA_TEST_CASE_WITH_BODY(body, name) \
  static void body();                                 \
  TEST_CASE("cuda: " name) {                          \
    if (::gradcomp::test::proceed_on_gpu()) body();   \
  }                                                   \
  static void body()
