#pragma once
/// @file
/// `collective_memory<cuda_executor>`: the compressed collectives' memory operations on the GPU
/// (collective/collective_memory.hpp lists them). Every kernel and copy is queued on the executor's
/// stream; the operations that return a host value (`all_finite`, `max_abs_difference`,
/// `to_host`) wait for it.
///
/// Buffers are stream-ordered allocations on the executor's stream: from `cuda_executor::memory_pool`
/// when the caller set one (`cudaMallocFromPoolAsync`), else from the device's default pool
/// (`cudaMallocAsync`). Either way they return to their pool on the stream they were allocated on
/// (`cudaFreeAsync`), so a buffer must not outlive that stream. The default pool keeps no memory
/// across synchronisations (its release threshold is 0) and this library does not change it: a
/// caller who runs the collectives every step gives the executor a pool of its own with a high
/// release threshold (`cudaMemPoolAttrReleaseThreshold`), so that the per-call buffers (frames,
/// sums, workspace) are reused instead of mapped again.

#include <gradcomp/cuda/config.cuh>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include <gradcomp/collective/collective_memory.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/cuda/check.cuh>
#include <gradcomp/cuda/executor.cuh>
#include <gradcomp/cuda/detail/grid.cuh>
#include <gradcomp/cuda/detail/operation.cuh>

namespace gradcomp {

namespace detail::cuda {

/// values[i] = value.
template <class T>
struct fill_values {
  T* values;
  T value;
  __device__ void operator()(std::uint64_t i) const { values[i] = value; }
};

/// values[i] = values[i] / divisor, in T (the `average` option).
template <class T>
struct divide_values {
  T* values;
  T divisor;
  __device__ void operator()(std::uint64_t i) const { values[i] = values[i] / divisor; }
};

/// Sets `*found` when a[i] (b null) or a[i] + b[i] in T is NaN or ±Inf.
template <class T>
struct find_non_finite_sum {
  const T* a;
  const T* b;
  unsigned int* found;
  __device__ void operator()(std::uint64_t i) const {
    const T v = b == nullptr ? a[i] : static_cast<T>(a[i] + b[i]);
    if (!is_finite(v)) atomicOr(found, 1u);
  }
};

/// The largest |a[i] − b[i]| in double, as the bits of a non-negative double (which order like
/// the values; a NaN, its sign cleared, orders above +Inf, so it wins as on the CPU).
template <class T>
struct largest_difference {
  const T* a;
  const T* b;
  unsigned long long* largest;
  __device__ void operator()(std::uint64_t i) const {
    const double d = fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    atomicMax(largest, static_cast<unsigned long long>(__double_as_longlong(d)));
  }
};

}  // namespace detail::cuda

/// The collectives' memory operations on the GPU.
template <>
struct collective_memory<cuda_executor> {
  /// An array of T in device memory, stream-ordered on the executor's stream, not initialised,
  /// grow-only; move-only.
  template <class T>
  class buffer {
   public:
    /// An empty buffer.
    buffer() noexcept = default;
    /// `count` elements (contents unspecified). @throws error `device_failed`.
    buffer(const cuda_executor& e, std::size_t count) { resize(e, count); }
    buffer(buffer&& other) noexcept
        : data_(std::exchange(other.data_, nullptr)),
          size_(std::exchange(other.size_, 0)),
          capacity_(std::exchange(other.capacity_, 0)),
          stream_(other.stream_) {}
    buffer& operator=(buffer&& other) noexcept {
      if (this != &other) {
        release();
        data_ = std::exchange(other.data_, nullptr);
        size_ = std::exchange(other.size_, 0);
        capacity_ = std::exchange(other.capacity_, 0);
        stream_ = other.stream_;
      }
      return *this;
    }
    buffer(const buffer&) = delete;
    buffer& operator=(const buffer&) = delete;
    /// Returns the memory to its pool on the stream it was allocated on.
    ~buffer() { release(); }

    /// Makes the buffer `count` elements long; when it grows, the old memory is freed and new
    /// memory allocated on `e`'s stream (contents unspecified). @throws error `device_failed`.
    void resize(const cuda_executor& e, std::size_t count) {
      if (count > capacity_) {
        release();
        void* grown = nullptr;
        const std::size_t bytes = count * sizeof(T);
        if (e.memory_pool != nullptr)
          GRADCOMP_CUDA_CHECK(cudaMallocFromPoolAsync(&grown, bytes, e.memory_pool, e.native_stream()));
        else
          GRADCOMP_CUDA_CHECK(cudaMallocAsync(&grown, bytes, e.native_stream()));
        data_ = static_cast<T*>(grown);
        capacity_ = count;
        stream_ = e.native_stream();
      }
      size_ = count;
    }
    /// The elements (device memory).
    [[nodiscard]] std::span<T> span() noexcept { return {data_, size_}; }
    /// The elements (device memory).
    [[nodiscard]] std::span<const T> span() const noexcept { return {data_, size_}; }
    /// Number of elements.
    [[nodiscard]] std::size_t size() const noexcept { return size_; }

   private:
    void release() noexcept {
      if (data_ != nullptr) cudaFreeAsync(data_, stream_);
      data_ = nullptr;
      capacity_ = 0;
      size_ = 0;
    }

    T* data_ = nullptr;
    std::size_t size_ = 0;
    std::size_t capacity_ = 0;
    cudaStream_t stream_ = nullptr;
  };

  template <class T>
  static void fill(const cuda_executor& e, std::span<T> values, T value) {
    detail::cuda::for_each_item(e, values.size(), detail::cuda::fill_values<T>{values.data(), value});
  }

  template <class T>
  static void copy(const cuda_executor& e, std::span<const T> from, std::span<T> to) {
    if (!from.empty())
      GRADCOMP_CUDA_CHECK(
          cudaMemcpyAsync(to.data(), from.data(), from.size_bytes(), cudaMemcpyDeviceToDevice, e.native_stream()));
  }

  template <class T>
  static void divide(const cuda_executor& e, std::span<T> values, T divisor) {
    detail::cuda::for_each_item(e, values.size(), detail::cuda::divide_values<T>{values.data(), divisor});
  }

  /// Waits for the stream.
  template <class T>
  [[nodiscard]] static bool all_finite(const cuda_executor& e, std::span<const T> a, std::span<const T> b = {}) {
    if (a.empty()) return true;
    buffer<unsigned int> found(e, 1);
    unsigned int* const word = found.span().data();
    GRADCOMP_CUDA_CHECK(cudaMemsetAsync(word, 0, sizeof *word, e.native_stream()));
    detail::cuda::for_each_item(e, a.size(),
                                detail::cuda::find_non_finite_sum<T>{a.data(), b.empty() ? nullptr : b.data(), word});
    unsigned int host = 0;
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(&host, word, sizeof host, cudaMemcpyDeviceToHost, e.native_stream()));
    e.synchronize();
    return host == 0;
  }

  /// Waits for the stream.
  template <class T>
  [[nodiscard]] static double max_abs_difference(const cuda_executor& e, std::span<const T> a, std::span<const T> b) {
    if (a.empty()) return 0.0;
    buffer<unsigned long long> largest(e, 1);
    unsigned long long* const word = largest.span().data();
    GRADCOMP_CUDA_CHECK(cudaMemsetAsync(word, 0, sizeof *word, e.native_stream()));  // the bits of +0.0
    detail::cuda::for_each_item(e, a.size(), detail::cuda::largest_difference<T>{a.data(), b.data(), word});
    unsigned long long host = 0;
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(&host, word, sizeof host, cudaMemcpyDeviceToHost, e.native_stream()));
    e.synchronize();
    return from_bits<double>(static_cast<std::uint64_t>(host));
  }

  /// Copies a few device bytes to the host and waits for them.
  static void to_host(const cuda_executor& e, std::span<const std::byte> from, std::span<std::byte> to) {
    if (from.empty()) return;
    GRADCOMP_CUDA_CHECK(
        cudaMemcpyAsync(to.data(), from.data(), from.size(), cudaMemcpyDeviceToHost, e.native_stream()));
    e.synchronize();
  }

  /// Queues the copy of a few host bytes into device memory (pageable memory is staged by the
  /// runtime before the call returns, so `from` may go away then).
  static void from_host(const cuda_executor& e, std::span<const std::byte> from, std::span<std::byte> to) {
    if (!from.empty())
      GRADCOMP_CUDA_CHECK(
          cudaMemcpyAsync(to.data(), from.data(), from.size(), cudaMemcpyHostToDevice, e.native_stream()));
  }

  /// A device transport that names its stream (`stream()`: `nccl_transport`, `staged_transport`)
  /// must run on the executor's, so that its calls see the executor's queued work and the other
  /// way round. @throws error `invalid_argument` otherwise.
  template <class X>
  static void require_ordered(const cuda_executor& e, const X& t) {
    if constexpr (requires { t.stream(); }) {
      detail::require(
          t.stream() == e.native_stream(), errc::invalid_argument,
          "the transport and the cuda_executor run on different CUDA streams; give both the same stream, so that "
          "the transport's calls are ordered with the executor's kernels");
    }
  }
};

}  // namespace gradcomp
