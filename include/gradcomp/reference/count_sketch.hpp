#pragma once
/// @file
/// Reference backend of the count sketch (docs/sketches.md §1, docs/wire-format.md §16): the
/// specification the `cpu_executor` backend is checked against, byte for byte and bit for bit.
/// Every cell and estimate is one loop over the elements; the heavy hitters are chosen with
/// `std::nth_element` on the estimates' magnitude keys. A 16-bit gradient's values are widened to
/// float32 cells; its decoded values are rounded into a 16-bit output after all are checked to fit.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/narrowing.hpp>
#include <gradcomp/core/reference_executor.hpp>
#include <gradcomp/core/wire_envelope.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/reference/selection.hpp>
#include <gradcomp/reference/values.hpp>
#include <gradcomp/sketch/count_sketch.hpp>

namespace gradcomp {

namespace detail::reference {

/// docs/sketches.md §1.3: x̂_i, the median over the rows of σ_j(i)·S[j][h_j(i)], for every element
/// of `out`, from the cells of a checked message.
template <gradient_value T>
void count_sketch_estimates(const count_sketch<T>& codec, const std::byte* cells, std::span<compute_type<T>> out) {
  using C = compute_type<T>;
  for (std::uint64_t i = 0; i < out.size(); ++i) {
    C row_estimates[count_sketch_max_rows] = {};
    for (std::uint32_t j = 0; j < codec.rows(); ++j) {
      const std::uint32_t hash = count_sketch_hash(count_sketch_row_seed(codec.params().seed, j), i);
      const std::uint64_t cell = j * codec.columns() + count_sketch_bucket(hash, codec.columns());
      row_estimates[j] = count_sketch_signed(hash, load_value<C>(cells, cell));
    }
    out[i] = count_sketch_median(row_estimates, codec.rows());
  }
}

/// docs/sketches.md §1.3: calls f(i) in ascending i for the k (1 ≤ k ≤ n) estimates of largest
/// magnitude, ties to the lower index (reference/selection.hpp). `keys` holds n scratch keys.
template <gradient_value T, class F>
void for_each_heavy_hitter(std::span<const T> estimates, std::uint64_t k,
                           std::span<typename float_traits<T>::bits_type> keys, F&& f) {
  for (std::size_t i = 0; i < estimates.size(); ++i) keys[i] = magnitude_key(estimates[i]);
  const auto kth = kth_largest(keys, k);
  for_each_kept(estimates, kth, k - count_above(estimates, kth), f);
}

}  // namespace detail::reference

/// The count sketch, written to be read.
template <gradient_value T>
struct backend<count_sketch<T>, reference_executor> {
  using C = compute_type<T>;  ///< The cells' and estimates' type: float32 for a 16-bit T.
  using key_type = typename float_traits<C>::bits_type;

  /// The n estimates and n magnitude keys of `decode` and `heavy_hitters`.
  struct scratch {
    std::span<C> estimates;
    std::span<key_type> keys;
  };
  static scratch carve(workspace_arena& arena, std::uint64_t n) {
    return {arena.take<C>(static_cast<std::size_t>(n)), arena.take<key_type>(static_cast<std::size_t>(n))};
  }

  static std::size_t workspace_bytes(const count_sketch<T>&, const reference_executor&, std::uint64_t n) {
    workspace_arena arena = workspace_arena::measure();
    (void)carve(arena, n);
    return arena.bytes_needed();
  }

  static std::size_t encode(const count_sketch<T>& codec, const reference_executor&, std::span<const T> grad,
                            std::span<std::byte> out, std::span<std::byte>, message_key key) {
    namespace ref = detail::reference;
    const std::uint64_t n = grad.size();
    // docs/sketches.md §1.5: a gradient holding NaN or ±Inf is rejected before anything is written.
    ref::require_finite(grad);
    const std::size_t size = codec.max_encoded_bytes(n);
    detail::begin_host_message(out, size);
    std::byte* const cells = out.data() + envelope::size;
    std::memset(cells, 0, codec.summable_bytes(n));
    // docs/sketches.md §1: S[j][h_j(i)] += σ_j(i)·x_i for every row j and element i, in ascending i
    // (a 16-bit x_i widened to float32 exactly).
    for (std::uint32_t j = 0; j < codec.rows(); ++j) {
      const std::uint32_t row_seed = count_sketch_row_seed(codec.params().seed, j);
      for (std::uint64_t i = 0; i < n; ++i) {
        const std::uint32_t hash = count_sketch_hash(row_seed, i);
        const std::uint64_t cell = j * codec.columns() + count_sketch_bucket(hash, codec.columns());
        ref::store_value(cells, cell, ref::load_value<C>(cells, cell) + count_sketch_signed(hash, C{widen(grad[i])}));
      }
    }
    // docs/sketches.md §1.5: a cell sum that overflowed leaves the envelope zeroed.
    for (std::uint64_t m = 0; m < codec.rows() * codec.columns(); ++m)
      detail::require(is_finite(ref::load_value<C>(cells, m)), errc::non_finite_input,
                      "a cell sum overflows the value type (the gradient's magnitudes are too large to sketch)");
    detail::seal_host_message(
        out, {codec_id::count_sketch, dtype_of<T>, 0, 0, key, n, size - envelope::size, codec.params_hash(), 0}, false);
    return size;
  }

  /// Decodes into `out` of T, or (a 16-bit T) of float32; with `accumulate` adds instead.
  template <gradient_value O>
  static void decode(const count_sketch<T>& codec, const reference_executor&, std::span<const std::byte> message,
                     std::span<O> out, std::span<std::byte> ws, const decode_limits& limits, bool accumulate) {
    namespace ref = detail::reference;
    const std::uint64_t n = out.size();
    (void)detail::count_sketch_checked(codec, message, n, limits);
    workspace_arena arena(ws);
    const scratch s = carve(arena, n);
    if (n == 0) return;
    // docs/sketches.md §1.3: the estimates, then the heavy hitters' written (or added, in C) over
    // zeros; a 16-bit output narrowed after every heavy hitter's result is checked to fit
    // (docs/half-precision.md §3). The other elements are zeroed, or left as they are.
    ref::count_sketch_estimates(codec, message.data() + envelope::size, s.estimates);
    std::vector<std::size_t> kept;
    ref::for_each_heavy_hitter(std::span<const C>(s.estimates), codec.heavy_hitter_count(n), s.keys,
                               [&](std::size_t i) { kept.push_back(i); });
    const auto result = [&](std::size_t i) { return accumulate ? C{widen(out[i])} + s.estimates[i] : s.estimates[i]; };
    if constexpr (half_precision<O>)
      for (const std::size_t i : kept) detail::require_narrows<O>(i, result(i));
    if (!accumulate) std::fill(out.begin(), out.end(), O{0});
    for (const std::size_t i : kept) out[i] = ref::to_output<O>(result(i));
  }

  static void estimate(const count_sketch<T>& codec, const reference_executor&, std::span<const std::byte> message,
                       std::span<C> out, std::span<std::byte>, const decode_limits& limits) {
    namespace ref = detail::reference;
    (void)detail::count_sketch_checked(codec, message, out.size(), limits);
    ref::count_sketch_estimates(codec, message.data() + envelope::size, out);
  }

  static std::size_t heavy_hitters(const count_sketch<T>& codec, const reference_executor&,
                                   std::span<const std::byte> message, std::uint64_t n,
                                   std::span<std::uint64_t> indices, std::span<std::byte> ws,
                                   const decode_limits& limits) {
    namespace ref = detail::reference;
    (void)detail::count_sketch_checked(codec, message, n, limits);
    const std::uint64_t k = codec.heavy_hitter_count(n);
    detail::require_heavy_hitter_room(indices, k);
    workspace_arena arena(ws);
    const scratch s = carve(arena, n);
    if (n == 0) return 0;
    ref::count_sketch_estimates(codec, message.data() + envelope::size, s.estimates);
    std::size_t written = 0;
    ref::for_each_heavy_hitter(std::span<const C>(s.estimates), k, s.keys,
                               [&](std::size_t i) { indices[written++] = i; });
    return written;
  }

  static void accumulate_encoded(const count_sketch<T>& codec, const reference_executor&, std::span<std::byte> acc,
                                 std::span<const std::byte> other) {
    namespace ref = detail::reference;
    // docs/wire-format.md §16.2: both messages checked (other against acc's n), the same key, every
    // sum finite; only then are the cells added.
    const envelope mine =
        detail::count_sketch_checked(codec, std::span<const std::byte>(acc), parse_envelope(acc).elements, {});
    const envelope theirs = detail::count_sketch_checked(codec, other, mine.elements, {});
    detail::require(mine.key == theirs.key, errc::step_mismatch,
                    "messages of different steps or tensors cannot be summed");
    std::byte* const a = acc.data() + envelope::size;
    const std::byte* const b = other.data() + envelope::size;
    const std::uint64_t cells = codec.rows() * codec.columns();
    for (std::uint64_t m = 0; m < cells; ++m)
      detail::require(is_finite(ref::load_value<C>(a, m) + ref::load_value<C>(b, m)), errc::non_finite_input,
                      "a summed cell overflows the value type");
    for (std::uint64_t m = 0; m < cells; ++m)
      ref::store_value(a, m, ref::load_value<C>(a, m) + ref::load_value<C>(b, m));
  }
};

}  // namespace gradcomp
