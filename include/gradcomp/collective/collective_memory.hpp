#pragma once
/// @file
/// `collective_memory<E>`: the memory operations the compressed collectives need on executor E,
/// the customisation point that makes one collective layer run on any executor, as
/// `backend<Codec, E>` does for codecs. Gradients, frames, sums, sketches and indexes stay in E's
/// memory; only small words (frame headers, status words, the agreement record) are read to the
/// host.
///
/// A specialisation provides, all as static members taking the executor first:
///
/// | Member | Does |
/// |---|---|
/// | `template <class T> class buffer` | an owning array of T in E's memory: `buffer(e, count)`, `resize(e, count)` (grow-only; the contents are unspecified after a resize), `span()`, `size()`; move-only |
/// | `fill(e, span<T>, T value)` | every element becomes `value` |
/// | `copy(e, span<const T> from, span<T> to)` | `to` (same size) becomes `from`; the spans do not overlap |
/// | `divide(e, span<T>, T divisor)` | v ← v / divisor in T, element by element (the `average` option) |
/// | `all_finite(e, span<const T> a, span<const T> b)` | whether every a_i (b empty) or a_i + b_i in T (b of a's size) is finite |
/// | `max_abs_difference(e, span<const T> a, span<const T> b)` | max \|a_i − b_i\| in double; NaN when any difference is NaN (`measure_error`) |
/// | `to_host(e, span<const byte> from, span<byte> to)` | copies a few bytes of E's memory to the host, waiting for them |
/// | `from_host(e, span<const byte> from, span<byte> to)` | copies a few host bytes into E's memory (in order with E's work) |
/// | `require_ordered(e, transport)` | throws `invalid_argument` unless the transport's work is ordered with E's (the CUDA executor and a device transport must share a stream) |
///
/// The specialisation for host executors (`cpu_executor`, `reference_executor`: plain loops over
/// host memory) is in this header. The one for `cuda_executor` is in
/// `gradcomp/cuda/collective_memory.cuh`, included by `gradcomp/cuda.cuh`.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>

#include <gradcomp/core/concepts.hpp>
#include <gradcomp/core/memory_space.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/narrowing.hpp>

namespace gradcomp {

/// The memory operations of the collectives on executor E (see this file's comment). The primary
/// template is never defined usefully.
template <class E>
struct collective_memory {
  static_assert(!std::is_same_v<E, E>,
                "gradcomp's collectives have no memory operations for this executor; for cuda_executor, include "
                "<gradcomp/cuda.cuh> from a .cu file");
};

/// An owning array of T in E's memory (`collective_memory<E>::buffer<T>`).
template <class E, class T>
using collective_buffer = typename collective_memory<E>::template buffer<T>;

/// The collectives' memory operations on the host, for every executor whose memory is the host's.
template <executor E>
  requires(memory_space_of<E> == memory_space::host)
struct collective_memory<E> {
  /// An array of T in host memory, not initialised, grow-only.
  template <class T>
  class buffer {
   public:
    /// An empty buffer.
    buffer() noexcept = default;
    /// `count` elements (contents unspecified).
    buffer(const E& e, std::size_t count) { resize(e, count); }
    /// Makes the buffer `count` elements long; contents are unspecified when it grows.
    void resize(const E&, std::size_t count) {
      if (count > capacity_) {
        data_ = std::make_unique_for_overwrite<T[]>(count);
        capacity_ = count;
      }
      size_ = count;
    }
    /// The elements.
    [[nodiscard]] std::span<T> span() noexcept { return {data_.get(), size_}; }
    /// The elements.
    [[nodiscard]] std::span<const T> span() const noexcept { return {data_.get(), size_}; }
    /// Number of elements.
    [[nodiscard]] std::size_t size() const noexcept { return size_; }

   private:
    std::unique_ptr<T[]> data_;
    std::size_t size_ = 0;
    std::size_t capacity_ = 0;
  };

  template <class T>
  static void fill(const E&, std::span<T> values, T value) {
    std::fill(values.begin(), values.end(), value);
  }

  template <class T>
  static void copy(const E&, std::span<const T> from, std::span<T> to) {
    if (!from.empty()) std::memcpy(to.data(), from.data(), from.size_bytes());
  }

  template <class T>
  static void divide(const E&, std::span<T> values, T divisor) {
    for (T& v : values) v = v / divisor;
  }

  /// The largest magnitude key, without an early exit, so that the loop vectorizes.
  template <class T>
  [[nodiscard]] static bool all_finite(const E&, std::span<const T> a, std::span<const T> b = {}) {
    typename float_traits<T>::bits_type largest = 0;
    if (b.empty()) {
      for (const T v : a) largest = std::max(largest, magnitude_key(v));
    } else {
      for (std::size_t i = 0; i < a.size(); ++i) {
        if constexpr (half_precision<T>)
          largest = std::max(largest, magnitude_key(narrow<T>(widen(a[i]) + widen(b[i]))));
        else
          largest = std::max(largest, magnitude_key(static_cast<T>(a[i] + b[i])));
      }
    }
    return largest < float_traits<T>::infinity_key;
  }

  template <class T>
  [[nodiscard]] static double max_abs_difference(const E&, std::span<const T> a, std::span<const T> b) {
    double worst = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      const double d = std::fabs(static_cast<double>(widen(a[i])) - static_cast<double>(widen(b[i])));
      if (!(d <= worst) && worst == worst) worst = d;  // a NaN difference wins and stays, so it is never hidden
    }
    return worst;
  }

  static void to_host(const E&, std::span<const std::byte> from, std::span<std::byte> to) {
    if (!from.empty()) std::memcpy(to.data(), from.data(), from.size());
  }

  static void from_host(const E&, std::span<const std::byte> from, std::span<std::byte> to) {
    if (!from.empty()) std::memcpy(to.data(), from.data(), from.size());
  }

  /// Host transports run their calls to completion on the calling thread: always ordered.
  template <class X>
  static void require_ordered(const E&, const X&) noexcept {}
};

namespace detail {

/// The collectives' result convention: a sum over ranks, or with `average` the sum divided by the
/// P `ranks` in the value type (v / T(P), element by element). Returns the factor an error bound of
/// the sum is multiplied by: 1/P, or 1.
template <executor E, class T>
double apply_average(const E& e, int ranks, std::span<T> values, bool average) {
  if (!average) return 1.0;
  // 16-bit data: the plans that take it (dense, gather_decode) averaged their float32 sums before
  // narrowing them once (`narrow_sums`).
  if constexpr (!half_precision<T>) collective_memory<E>::divide(e, values, static_cast<T>(ranks));
  return 1.0 / static_cast<double>(ranks);
}

/// Writes float32 `sums` (the mean with `average` over `ranks`, divided in float32) into the
/// 16-bit `out` (host memory: the codecs take 16-bit values on host executors only), each rounded
/// once to nearest even, after checking that none becomes ±Inf.
/// @throws error `narrowing_overflow` (every rank alike: their sums are the same); `out` is then
/// untouched.
template <gradient_value T>
  requires half_precision<T>
void narrow_sums(std::span<compute_type<T>> sums, int ranks, bool average, std::span<T> out) {
  if (average)
    for (compute_type<T>& v : sums) v = v / static_cast<compute_type<T>>(ranks);
  for (std::size_t i = 0; i < sums.size(); ++i) require_narrows<T>(i, sums[i]);
  for (std::size_t i = 0; i < sums.size(); ++i) out[i] = narrow<T>(sums[i]);
}

/// `narrow_sums` for sums that differ between ranks (a chunk of a reduce-scatter): returns 0, or
/// the code of `narrowing_overflow` for the caller to agree on (`out` is then unspecified).
template <gradient_value T>
  requires half_precision<T>
[[nodiscard]] std::uint8_t narrowing_status(std::span<compute_type<T>> sums, int ranks, bool average,
                                            std::span<T> out) {
  try {
    narrow_sums(sums, ranks, average, out);
  } catch (const error& failure) {
    return static_cast<std::uint8_t>(failure.code());
  }
  return 0;
}

}  // namespace detail
}  // namespace gradcomp
