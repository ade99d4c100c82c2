#pragma once
/// @file
/// How one operation of the CUDA backend runs: launch shapes, the status words in its workspace
/// where kernels record what they found wrong, and the point where the host reads them back and
/// throws (or, for deferred encoders, does not wait).

#include <gradcomp/cuda/config.cuh>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include <gradcomp/core/error.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cuda/check.cuh>
#include <gradcomp/cuda/executor.cuh>

#ifndef GRADCOMP_CUDA_MAX_GRID
/// The most blocks of one launch of the backend's kernels (default 2^20). A program may define it
/// lower, the same in every translation unit (a different value in two units of one program breaks
/// the one-definition rule): gradcomp's CUDA tests use 3, so that every grid-stride loop runs more
/// than one round at their sizes (docs/cuda.md §6). Results do not depend on it.
#  define GRADCOMP_CUDA_MAX_GRID (std::uint64_t{1} << 20)
#endif

namespace gradcomp::detail::cuda {

/// Threads per block of the backend's kernels (8 warps).
inline constexpr unsigned block_threads = 256;
/// Warps per block of the kernels that give each quantization block (or bucket) one warp.
inline constexpr unsigned block_warps = block_threads / 32;
/// Most blocks of a launch; kernels stride over the rest of their work. Every grid of the backend
/// comes from `grid_for` (directly, or through `streaming_grid_for`), so this caps them all.
inline constexpr std::uint64_t max_grid = GRADCOMP_CUDA_MAX_GRID;
static_assert(max_grid >= 1 && max_grid <= 0x7FFFFFFF, "GRADCOMP_CUDA_MAX_GRID must be a 1-D grid size, 1 to 2^31 - 1");

/// Blocks for `items` items at `per_block` items per block (at least 1, at most `max_grid`).
[[nodiscard]] inline unsigned grid_for(std::uint64_t items, std::uint64_t per_block = block_threads) noexcept {
  return static_cast<unsigned>(std::clamp<std::uint64_t>((items + per_block - 1) / per_block, 1, max_grid));
}

/// Blocks for a kernel that streams over `items` items and reduces into shared memory per block
/// (the radix histograms): as many blocks of `block_threads` as the current device keeps resident
/// at once (its threads per SM over `block_threads`, 8 on Hopper, times its SMs), and no more, so
/// that all of them run in one wave and each covers many items before it flushes its bins.
/// @throws error `device_failed`.
inline unsigned streaming_grid_for(std::uint64_t items) {
  int device = 0;
  int sms = 0;
  int threads_per_sm = 0;
  GRADCOMP_CUDA_CHECK(cudaGetDevice(&device));
  GRADCOMP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  GRADCOMP_CUDA_CHECK(cudaDeviceGetAttribute(&threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device));
  const unsigned resident = std::max(static_cast<unsigned>(threads_per_sm) / block_threads, 1u);
  return std::min(grid_for(items), resident * static_cast<unsigned>(std::max(sms, 1)));
}

/// What the kernels of one operation found wrong: the `errc` of a failure (0 when none), and
/// (position << 8 | reason) of the failure at the smallest position, where `reason` is a small
/// code of the operation's own naming the check that failed.
struct device_status {
  std::uint32_t code;    ///< errc of the failure found (0: none).
  std::uint32_t unused;  ///< Padding.
  std::uint64_t detail;  ///< Smallest (position << 8 | reason) reported; UINT64_MAX when none.
};

/// Records a failure `code` at `position` for check `reason` (device code; any thread, any time).
__device__ inline void record_failure(device_status* status, errc code, std::uint64_t position,
                                      std::uint32_t reason = 0) {
  atomicCAS(&status->code, 0u, static_cast<unsigned>(code));
  atomicMin(reinterpret_cast<unsigned long long*>(&status->detail),
            static_cast<unsigned long long>((position << 8) | (reason & 0xFFu)));
}

/// Whether a failure has been recorded (device code).
__device__ inline bool failed(const device_status* status) {
  return *static_cast<const volatile std::uint32_t*>(&status->code) != 0;
}

/// Calls `kernel<<<grid, threads, 0, stream>>>(args...)` and checks the launch. The backend's
/// kernels are templates (`template <class = void>` where nothing else is a parameter), as CUB's
/// are, so that every translation unit including a header may define them.
/// @throws error `device_failed`.
template <class... Params, class... Args>
void launch(const cuda_executor& exec, unsigned grid, unsigned threads, void (*kernel)(Params...), Args&&... args) {
  kernel<<<grid, threads, 0, exec.native_stream()>>>(std::forward<Args>(args)...);
  GRADCOMP_CUDA_CHECK(cudaGetLastError());
}

/// Writes one u64 `value` at the 8-byte aligned device address `at` (a count field, queued in
/// order with the kernels around it).
template <class = void>
__global__ void store_word_kernel(std::byte* at, std::uint64_t value) {
  if (blockIdx.x == 0 && threadIdx.x == 0) *reinterpret_cast<std::uint64_t*>(at) = value;
}

/// Scratch for the few calls that take no workspace argument (random-k's `accumulate_encoded`,
/// `set_carried_error`): stream-ordered memory from the device's pool (`cudaMallocAsync`, cheap
/// once the pool holds it), returned to the pool on the stream when it goes out of scope.
class stream_scratch {
 public:
  /// `bytes` bytes on `exec`'s stream. @throws error `device_failed`.
  stream_scratch(const cuda_executor& exec, std::size_t bytes) : stream_(exec.native_stream()), size_(bytes) {
    GRADCOMP_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&data_), bytes, stream_));
  }
  stream_scratch(const stream_scratch&) = delete;
  stream_scratch& operator=(const stream_scratch&) = delete;
  ~stream_scratch() { cudaFreeAsync(data_, stream_); }

  /// The scratch as a workspace span.
  [[nodiscard]] std::span<std::byte> span() const noexcept { return {data_, size_}; }

 private:
  cudaStream_t stream_;
  std::byte* data_ = nullptr;
  std::size_t size_;
};

/// One operation's status: carved from its workspace and cleared when made; `finish` reads it back
/// and throws what the kernels recorded.
class operation {
 public:
  /// Workspace bytes of an operation: its status, then what `carve(arena)` takes from a
  /// measuring arena (the scratch the operation carves after its status, in the same order).
  template <class Carve>
  [[nodiscard]] static std::size_t workspace_bytes(Carve&& carve) {
    workspace_arena arena = workspace_arena::measure();
    (void)arena.take<device_status>(1);
    carve(arena);
    return arena.bytes_needed();
  }

  /// Takes the status from `arena` and clears it on `exec`'s stream: all of it, `unused` too, since
  /// `finish` copies the whole record back (compute-sanitizer's initcheck reports a copy of
  /// bytes no one wrote).
  /// @throws error `workspace_too_small`, `device_failed`.
  operation(const cuda_executor& exec, workspace_arena& arena)
      : exec_(exec), status_(arena.take<device_status>(1).data()) {
    GRADCOMP_CUDA_CHECK(cudaMemsetAsync(status_, 0, offsetof(device_status, detail), exec.native_stream()));
    GRADCOMP_CUDA_CHECK(cudaMemsetAsync(&status_->detail, 0xFF, sizeof(std::uint64_t), exec.native_stream()));
  }

  /// The device status the operation's kernels record into.
  [[nodiscard]] device_status* status() const noexcept { return status_; }

  /// Waits for the stream and throws the recorded failure: `describe(code, position, reason)`
  /// gives its detail text. @throws error the recorded `errc`, or `device_failed`.
  template <class Describe>
  void finish(Describe&& describe) const {
    const device_status host = read_back();
    if (host.code == 0) return;
    const auto code = static_cast<errc>(host.code);
    throw error(code, describe(code, host.detail >> 8, static_cast<std::uint32_t>(host.detail & 0xFFu)));
  }

  /// `finish` where the check that failed (the reason of the smallest position), not the first
  /// code recorded, names the error: `code_of(reason)`, for checks whose order decides the error
  /// as on the CPU (the reasons numbered in that order).
  template <class CodeOf, class Describe>
  void finish_by_reason(CodeOf&& code_of, Describe&& describe) const {
    const device_status host = read_back();
    if (host.code == 0) return;
    const auto reason = static_cast<std::uint32_t>(host.detail & 0xFFu);
    throw error(code_of(reason), describe(host.detail >> 8, reason));
  }

  /// `finish`, unless the executor defers errors (then the message's seal has recorded them).
  template <class Describe>
  void finish_encode(Describe&& describe) const {
    if (exec_.deferred_errors == nullptr) finish(std::forward<Describe>(describe));
  }

 private:
  /// The status, once the stream's work has run. @throws error `device_failed`.
  [[nodiscard]] device_status read_back() const {
    device_status host{};
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(&host, status_, sizeof host, cudaMemcpyDeviceToHost, exec_.native_stream()));
    exec_.synchronize();
    return host;
  }

  const cuda_executor& exec_;
  device_status* status_;
};

}  // namespace gradcomp::detail::cuda
