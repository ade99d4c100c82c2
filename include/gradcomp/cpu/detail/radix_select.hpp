#pragma once
/// @file
/// Radix selection of the k-th largest magnitude key (CPU): histogram the key's top bits, find the
/// bucket that holds the k-th key, and descend into that bucket only. Used by exact top-k, by the
/// threshold sparsifier's exact refinement and by the dynamic sparsifier's exact threshold.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#if defined(__SSE2__)
#  include <emmintrin.h>
#endif

#include <gradcomp/core/float_bits.hpp>

namespace gradcomp::detail::cpu {

/// Bits resolved per radix pass.
inline constexpr int radix_digit_bits = 11;
/// Buckets per radix pass.
inline constexpr std::size_t radix_buckets = std::size_t{1} << radix_digit_bits;

/// Result of a selection: take every element whose key is above `key`, and the first `ties`
/// elements (lowest index first) whose key equals `key`.
template <class K>
struct kth_key {
  K key = 0;               ///< Key of the k-th largest element.
  std::uint64_t ties = 0;  ///< How many elements equal to `key` are taken (≥ 1 when k ≥ 1).
};

/// Bucket of a histogram (scanned from the top) that holds the `rank`-th largest key (rank ≥ 1),
/// and how many keys lie in higher buckets.
struct bucket_choice {
  std::size_t bucket = 0;    ///< Bucket holding the rank-th largest key.
  std::uint64_t above = 0;   ///< Keys in buckets above it.
};

/// Finds the bucket of the `rank`-th largest key in `histogram`; `rank` must not exceed its total.
[[nodiscard]] inline bucket_choice choose_bucket(std::span<const std::uint64_t> histogram,
                                                 std::uint64_t rank) noexcept {
  std::uint64_t above = 0;
  for (std::size_t b = histogram.size(); b-- > 0;) {
    if (above + histogram[b] >= rank) return {b, above};
    above += histogram[b];
  }
  return {0, above};
}

/// Selects the `rank`-th largest key (rank ≥ 1) among the keys whose top `known_bits` bits equal
/// `prefix`, resolving `radix_digit_bits` per pass over `for_each_key`, which must call its argument
/// once per key, in the same order every time. `key_bits` is the key width (15 for bf16 and fp16, 31 for float, 63 for
/// double); `histogram` needs `radix_buckets` entries.
template <class K, class ForEachKey>
[[nodiscard]] kth_key<K> select_kth_largest(ForEachKey&& for_each_key, int key_bits, std::uint64_t rank, K prefix,
                                            int known_bits, std::span<std::uint64_t> histogram) {
  while (known_bits < key_bits) {
    const int digit_bits = key_bits - known_bits < radix_digit_bits ? key_bits - known_bits : radix_digit_bits;
    const int shift = key_bits - known_bits - digit_bits;
    const auto digit_mask = static_cast<K>((K{1} << digit_bits) - 1);
    for (std::size_t b = 0; b < (std::size_t{1} << digit_bits); ++b) histogram[b] = 0;
    for_each_key([&](K key) {
      if ((key >> (shift + digit_bits)) == prefix) ++histogram[static_cast<std::size_t>((key >> shift) & digit_mask)];
    });
    const bucket_choice choice = choose_bucket(histogram.first(std::size_t{1} << digit_bits), rank);
    rank -= choice.above;
    prefix = static_cast<K>((static_cast<std::uint64_t>(prefix) << digit_bits) | choice.bucket);
    known_bits += digit_bits;
  }
  return {prefix, rank};
}

/// Number of 32-bit counters `magnitude_histogram` needs as scratch.
inline constexpr std::size_t histogram_scratch_counters = 4 * radix_buckets;

/// Histogram of the top `radix_digit_bits` of the magnitude keys of the n values `value_at(i)`,
/// i < n (one pass, four interleaved sub-histograms in `scratch` so that repeated buckets do not
/// serialise on one counter).
template <gradient_value T, class ValueAt>
void magnitude_histogram(std::size_t n, ValueAt&& value_at, std::span<std::uint64_t> histogram,
                         std::span<std::uint32_t> scratch) {
  constexpr int shift = float_traits<T>::magnitude_bits - radix_digit_bits;
  // Sub-histograms count in 32 bits; fold them into the 64-bit totals before they could overflow.
  constexpr std::size_t chunk = std::size_t{1} << 30;
  std::uint32_t* const h0 = scratch.first(histogram_scratch_counters).data();
  std::uint32_t* const h1 = h0 + radix_buckets;
  std::uint32_t* const h2 = h1 + radix_buckets;
  std::uint32_t* const h3 = h2 + radix_buckets;
  for (std::size_t b = 0; b < radix_buckets; ++b) histogram[b] = 0;
  for (std::size_t begin = 0; begin < n; begin += chunk) {
    const std::size_t end = n - begin < chunk ? n : begin + chunk;
    for (std::size_t c = 0; c < histogram_scratch_counters; ++c) h0[c] = 0;
    std::size_t i = begin;
    for (; i + 4 <= end; i += 4) {
      ++h0[magnitude_key<T>(value_at(i)) >> shift];
      ++h1[magnitude_key<T>(value_at(i + 1)) >> shift];
      ++h2[magnitude_key<T>(value_at(i + 2)) >> shift];
      ++h3[magnitude_key<T>(value_at(i + 3)) >> shift];
    }
    for (; i < end; ++i) ++h0[magnitude_key<T>(value_at(i)) >> shift];
    for (std::size_t b = 0; b < radix_buckets; ++b) histogram[b] += std::uint64_t{h0[b]} + h1[b] + h2[b] + h3[b];
  }
}

/// Histogram of the top `radix_digit_bits` of the magnitude keys of `values` (see above).
template <gradient_value T>
void magnitude_histogram(std::span<const T> values, std::span<std::uint64_t> histogram,
                         std::span<std::uint32_t> scratch) {
  const T* const v = values.data();
  magnitude_histogram<T>(
      values.size(), [v](std::size_t i) { return v[i]; }, histogram, scratch);
}

/// How many keys of a `magnitude_histogram` belong to NaN or ±Inf (the buckets at and above
/// +Inf's key hold nothing else).
template <gradient_value T>
[[nodiscard]] std::uint64_t non_finite_count(std::span<const std::uint64_t> histogram) noexcept {
  std::uint64_t count = 0;
  for (std::size_t b = float_traits<T>::infinity_key >> (float_traits<T>::magnitude_bits - radix_digit_bits);
       b < radix_buckets; ++b)
    count += histogram[b];
  return count;
}

/// Bit j of the result is set when |values[j]|'s key is at least `threshold`, for j < 16.
template <gradient_value T>
[[nodiscard]] inline std::uint32_t at_least_mask16(const T* values,
                                                   typename float_traits<T>::bits_type threshold) noexcept {
#if defined(__SSE2__)
  if constexpr (std::is_same_v<T, float>) {
    // Keys have no sign bit, so a signed 32-bit comparison orders them; four lanes at a time.
    const __m128i limit = _mm_set1_epi32(static_cast<int>(threshold) - 1);
    const __m128i magnitude = _mm_set1_epi32(0x7fffffff);
    std::uint32_t mask = 0;
    for (int q = 0; q < 4; ++q) {
      const __m128i bits = _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(values + 4 * q)), magnitude);
      mask |= static_cast<std::uint32_t>(_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(bits, limit)))) << (4 * q);
    }
    return mask;
  } else if constexpr (half_precision<T>) {
    // 16-bit keys below 2^15: a signed 16-bit comparison orders them; eight lanes at a time, the
    // two comparisons packed to bytes for one movemask.
    const __m128i limit = _mm_set1_epi16(static_cast<short>(static_cast<int>(threshold) - 1));
    const __m128i magnitude = _mm_set1_epi16(0x7fff);
    const __m128i low = _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(values)), magnitude);
    const __m128i high = _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(values + 8)), magnitude);
    return static_cast<std::uint32_t>(
        _mm_movemask_epi8(_mm_packs_epi16(_mm_cmpgt_epi16(low, limit), _mm_cmpgt_epi16(high, limit))));
  }
#endif
  std::uint32_t mask = 0;
  for (std::uint32_t j = 0; j < 16; ++j) mask |= std::uint32_t{magnitude_key(values[j]) >= threshold} << j;
  return mask;
}

/// Extra entries `collect_at_least` may write past the last index it reports.
inline constexpr std::size_t collect_slack = 2;

/// Writes, in ascending order, every index whose magnitude key is at least `threshold` into
/// `indices` (room for the hits plus `collect_slack`) and returns how many there are. The first two
/// hits of each block of 16 are written without branches (at 1% density almost no block has
/// more), so sparse hits cost no mispredictions.
template <gradient_value T, class Index>
[[nodiscard]] std::size_t collect_at_least(std::span<const T> values, typename float_traits<T>::bits_type threshold,
                                           Index* indices) {
  constexpr std::size_t block = 16;
  const std::size_t n = values.size();
  const T* const v = values.data();
  std::size_t count = 0;
  const auto take = [&](std::size_t base, std::uint32_t mask) {
    for (int slot = 0; slot < 2; ++slot) {
      indices[count] = static_cast<Index>(base + static_cast<std::size_t>(std::countr_zero(mask | 0x10000u)));
      count += mask != 0 ? 1u : 0u;
      mask &= mask - 1;
    }
    for (; mask != 0; mask &= mask - 1) [[unlikely]]
      indices[count++] = static_cast<Index>(base + static_cast<std::size_t>(std::countr_zero(mask)));
  };
  std::size_t i = 0;
  for (; i + block <= n; i += block) take(i, at_least_mask16(v + i, threshold));
  if (i < n) {
    T tail[block] = {};  // the last partial block, zero-padded; padding lanes are masked off
    std::copy(v + i, v + n, tail);
    take(i, at_least_mask16(tail, threshold) & ((std::uint32_t{1} << (n - i)) - 1));
  }
  return count;
}

/// Calls `f(i)` for every index whose magnitude key is at least `threshold`, in ascending order.
/// Works on blocks of 16 values: a mask of the block's hits, then one call per set bit, so sparse
/// hits cost no branch mispredictions per element.
template <gradient_value T, class F>
void for_each_at_least(std::span<const T> values, typename float_traits<T>::bits_type threshold, F&& f) {
  constexpr std::size_t block = 16;
  const std::size_t n = values.size();
  const T* const v = values.data();
  std::size_t i = 0;
  for (; i + block <= n; i += block) {
    for (std::uint32_t mask = at_least_mask16(v + i, threshold); mask != 0; mask &= mask - 1)
      f(i + static_cast<std::size_t>(std::countr_zero(mask)));
  }
  if (i == n) return;
  T tail[block] = {};  // the last partial block, zero-padded; padding lanes are masked off
  std::copy(v + i, v + n, tail);
  const std::uint32_t valid = (std::uint32_t{1} << (n - i)) - 1;
  for (std::uint32_t mask = at_least_mask16(tail, threshold) & valid; mask != 0; mask &= mask - 1)
    f(i + static_cast<std::size_t>(std::countr_zero(mask)));
}

}  // namespace gradcomp::detail::cpu
