#pragma once
/// @file
/// `device_array<T>`: an owning array in device memory, the storage of the CUDA backend's states
/// (error-feedback residuals, LoCo's 8-bit error). States are made once per tensor, not per step,
/// so allocating here is off the hot path; everything per step runs in the caller's workspace.
///
/// Zero fill. Given an executor, the array is zero-filled in order on its stream (`cudaMemsetAsync`):
/// work queued after it on that stream finds the zeros, and the host does not wait. Without one,
/// the fill runs on the legacy default stream and is waited for, so work on any stream finds the
/// zeros (at the price of a host wait that also stalls a graph capture in global mode).

#include <gradcomp/cuda/config.cuh>

#include <cuda_runtime.h>

#include <cstddef>
#include <span>
#include <utility>

#include <gradcomp/cuda/check.cuh>
#include <gradcomp/cuda/executor.cuh>

namespace gradcomp {

/// An array of `T` in device memory (`cudaMalloc`), zero-filled at creation; move-only.
template <class T>
class device_array {
 public:
  /// An empty array (no allocation).
  device_array() noexcept = default;
  /// `count` zero-filled elements on the current device, the fill complete on return.
  /// @throws error `device_failed`.
  explicit device_array(std::size_t count) : device_array(count, cuda_executor{}) {
    // The memset was queued on the legacy default stream and is asynchronous: wait for it, so that
    // work queued on any other stream (a non-blocking one too) finds the zeros and is not overwritten.
    if (data_ != nullptr) finish_fill(cudaStreamSynchronize(0));
  }
  /// `count` elements on the current device, zero-filled in order on `exec`'s stream (work queued
  /// there afterwards finds the zeros; the host does not wait). @throws error `device_failed`.
  device_array(std::size_t count, const cuda_executor& exec) : size_(count) {
    if (count == 0) return;
    GRADCOMP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), count * sizeof(T)));
    finish_fill(cudaMemsetAsync(data_, 0, count * sizeof(T), exec.native_stream()));
  }
  device_array(device_array&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  device_array& operator=(device_array&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
  ~device_array() { release(); }

  /// Device pointer to the first element (null when empty).
  [[nodiscard]] T* data() noexcept { return data_; }
  /// Device pointer to the first element (null when empty).
  [[nodiscard]] const T* data() const noexcept { return data_; }
  /// Number of elements.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  /// The elements as a span of device memory.
  [[nodiscard]] std::span<T> span() noexcept { return {data_, size_}; }
  /// The elements as a span of device memory.
  [[nodiscard]] std::span<const T> span() const noexcept { return {data_, size_}; }

 private:
  /// Frees the memory and throws when a step of the zero fill failed.
  void finish_fill(cudaError_t status) {
    if (status == cudaSuccess) return;
    release();
    GRADCOMP_CUDA_CHECK(status);
  }
  void release() noexcept {
    if (data_ != nullptr) cudaFree(data_);
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace gradcomp
