#pragma once
/// @file
/// CPU backend of the dynamic sparsifier. a = g + R is never stored: each pass recomputes it
/// (the same IEEE addition, so the same bits), which leaves `out` and the state untouched until
/// the last pass and reads no more memory than storing a would.
///
/// Exact rule, tensors of 2^16 elements or more: a sample (64 consecutive values at the start of
/// each 256th of a, 16,384 keys) gives a key window [lo, hi) around its z/n-quantile (±(4 standard
/// deviations of the sample rank + 32) sample ranks). One pass over a, 16 values at a time with
/// SIMD comparisons, counts the keys below lo, notes NaN/±Inf and lists the keys in the window
/// (about 3% of n for f* = 0.8); when the window holds τ* (below ≤ z < below + listed), radix
/// selection over the list, starting below the bits lo and hi − 1 share, gives it exactly.
/// Otherwise (a misleading sample, or a window larger than the list), and for smaller tensors:
/// pass 1 histograms the top 11 bits of every |a| key (and finds NaN/±Inf) and picks the bucket b
/// holding the (n − z)-th largest key; pass 2 lists the keys of bucket b, and radix selection
/// over that list finds the exact key. When bucket b is larger than the list (heavy ties),
/// selection descends with further histogram passes over a instead. Every path gives the same τ*.
/// Table rule: Python's bisect_left loop, each probe a full counting pass over a.
/// The last pass writes ã and the residual, and counts what was kept.

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <gradcomp/core/backend.hpp>
#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/rounded_product.hpp>
#include <gradcomp/core/workspace.hpp>
#include <gradcomp/cpu/detail/radix_select.hpp>
#include <gradcomp/sparsify/dynamic.hpp>

#if defined(__SSE2__)
#  include <emmintrin.h>
#endif

namespace gradcomp {

/// The dynamic sparsifier on the CPU. A 16-bit gradient's values are widened as a = g + R is
/// formed: a, the residuals, ã and the threshold are float32 (C).
template <gradient_value T>
struct backend<dynamic_sparsifier<T>, cpu_executor> {
  using C = compute_type<T>;  ///< The type of a, the residuals and ã.
  using sparsifier = dynamic_sparsifier<T>;
  using state_type = dynamic_state<C>;
  using key_type = typename float_traits<C>::bits_type;
  static constexpr int key_bits = float_traits<C>::magnitude_bits;
  static constexpr int first_shift = key_bits - detail::cpu::radix_digit_bits;

  /// Keys the bucket list holds: an eighth of n (a bucket of N(0, σ) data at f* = 0.8 holds about
  /// 9%), or all of a small tensor.
  [[nodiscard]] static std::uint64_t list_capacity(std::uint64_t n) noexcept {
    return std::max<std::uint64_t>(n / 8, std::min<std::uint64_t>(n, 65536));
  }

  /// Tensors of at least this many elements try a sampled key window before the histogram.
  static constexpr std::uint64_t sampled_min_n = std::uint64_t{1} << 16;
  static constexpr std::size_t sample_chunks = 256;  ///< Chunks of a read for the sample.
  static constexpr std::size_t sample_chunk = 64;    ///< Consecutive values per chunk.
  static constexpr std::size_t sample_size = sample_chunks * sample_chunk;

  struct scratch {
    std::span<std::uint64_t> histogram;
    std::span<std::uint32_t> sub_histograms;
    std::span<key_type> list;    ///< Keys of one window: capacity plus room for one block.
    std::span<key_type> sample;  ///< Sampled keys (empty below `sampled_min_n`).
  };

  static scratch carve(workspace_arena& arena, std::uint64_t n) {
    scratch s;
    s.histogram = arena.take<std::uint64_t>(detail::cpu::radix_buckets);
    s.sub_histograms = arena.take<std::uint32_t>(detail::cpu::histogram_scratch_counters);
    s.list = arena.take<key_type>(static_cast<std::size_t>(list_capacity(n)) + 16);
    s.sample = arena.take<key_type>(n >= sampled_min_n ? sample_size : 0);
    return s;
  }

  static std::size_t workspace_bytes(const sparsifier&, const cpu_executor&, std::uint64_t n) {
    workspace_arena arena = workspace_arena::measure();
    carve(arena, n);
    return arena.bytes_needed();
  }

  static C threshold(const sparsifier& sp, const cpu_executor&, std::span<const T> a, std::span<std::byte> ws) {
    const T* const v = a.data();
    return from_bits<C>(threshold_key(
        sp, a.size(), [v](std::size_t i) { return C{widen(v[i])}; }, ws));
  }

  static dynamic_result<C> sparsify(const sparsifier& sp, const cpu_executor&, state_type& state,
                                    std::uint64_t tensor_id, std::span<const T> grad, std::span<C> out,
                                    std::span<std::byte> ws) {
    const std::size_t n = grad.size();
    const auto found = detail::find_dynamic_residual(state.residuals, tensor_id, n, out.size());
    const bool known = found != state.residuals.end();
    const T* const g = grad.data();
    key_type tau = 0;
    if (known) {
      const C* const r = found->second.data();
      tau = threshold_key(
          sp, n, [g, r](std::size_t i) { return C{widen(g[i])} + r[i]; }, ws);
    } else {
      // A new id's residual is n zeros: a = g + 0, exactly as the stored zeros will give next step.
      tau = threshold_key(
          sp, n, [g](std::size_t i) { return C{widen(g[i])} + C{0}; }, ws);
    }
    // Nothing can fail past this point but the allocation of a new id's residual, which changes
    // nothing if it throws.
    std::vector<C>& residual =
        known ? found->second : state.residuals.emplace(tensor_id, std::vector<C>(n, C{0})).first->second;
    const std::uint64_t kept = apply(grad, residual, out, tau);
    ++state.steps;
    const double zero_fraction = n == 0 ? 0.0 : static_cast<double>(n - kept) / static_cast<double>(n);
    return {from_bits<C>(tau), kept, zero_fraction};
  }

  static std::size_t save_state(const sparsifier& sp, const cpu_executor&, const state_type& state,
                                std::span<std::byte> bytes) {
    return sp.write_saved_state(state, bytes);
  }

  static void load_state(const sparsifier& sp, const cpu_executor&, std::span<const std::byte> bytes,
                         state_type& state) {
    state = sp.read_saved_state(bytes);
  }

 private:
  /// τ* of the n values `value_at(i)` as a magnitude key (+Inf's key keeps nothing, 0 keeps all).
  template <class ValueAt>
  static key_type threshold_key(const sparsifier& sp, std::size_t n, ValueAt&& value_at, std::span<std::byte> ws) {
    if (sp.params().mode == dynamic_threshold_mode::tagc_table)
      return detail::dynamic_table_key<C>(sp.params().zero_fraction, n, value_at);
    workspace_arena arena(ws);
    const scratch s = carve(arena, n);
    const std::uint64_t z = sp.zeroed_count(n);
    if (n >= sampled_min_n && z < n) {
      const sampled_window window = sample_window(n, z, value_at, s);
      const window_pass w = collect_window(n, value_at, window.lo, window.hi, s.list);
      if (w.non_finite) {
        std::uint64_t count = 0;
        for (std::size_t i = 0; i < n; ++i) count += is_finite<C>(value_at(i)) ? 0u : 1u;
        detail::require_dynamic_finite(count, n);
      }
      // τ* is the (z − below)-th smallest key of the window (0-based) when the window holds it.
      if (!w.overflow && w.below <= z && z - w.below < w.count) {
        // Every key in [lo, hi) shares the top bits that lo and hi − 1 share: selection starts below them.
        const int known =
            key_bits - static_cast<int>(std::bit_width(static_cast<key_type>(window.lo ^ (window.hi - 1))));
        return select_in_list(s, w.count, w.count - (z - w.below),
                              static_cast<key_type>(window.lo >> (key_bits - known)), known);
      }
    }
    detail::cpu::magnitude_histogram<C>(n, value_at, s.histogram, s.sub_histograms);
    detail::require_dynamic_finite(detail::cpu::non_finite_count<C>(s.histogram), n);
    if (z == n) return float_traits<C>::infinity_key;

    // The z-th smallest key (0-based) is the (n − z)-th largest. The chosen bucket ends at or
    // below +Inf's key, since the histogram holds no NaN or ±Inf.
    const detail::cpu::bucket_choice choice = detail::cpu::choose_bucket(s.histogram, n - z);
    const std::uint64_t rank = n - z - choice.above;
    const auto bucket = static_cast<key_type>(choice.bucket);
    if (s.histogram[choice.bucket] <= list_capacity(n)) {
      const window_pass w = collect_window(n, value_at, static_cast<key_type>(bucket << first_shift),
                                           static_cast<key_type>((bucket + 1) << first_shift), s.list);
      return select_in_list(s, w.count, rank, bucket, detail::cpu::radix_digit_bits);
    }
    return detail::cpu::select_kth_largest<key_type>(
               [&](auto&& visit) {
                 for (std::size_t i = 0; i < n; ++i) visit(magnitude_key<C>(value_at(i)));
               },
               key_bits, rank, bucket, detail::cpu::radix_digit_bits, s.histogram)
        .key;
  }

  /// The rank-th largest of the first `count` listed keys, all of which start with `prefix`.
  static key_type select_in_list(const scratch& s, std::size_t count, std::uint64_t rank, key_type prefix,
                                 int known_bits) {
    const key_type* const list = s.list.data();
    return detail::cpu::select_kth_largest<key_type>(
               [&](auto&& visit) {
                 for (std::size_t j = 0; j < count; ++j) visit(list[j]);
               },
               key_bits, rank, prefix, known_bits, s.histogram)
        .key;
  }

  /// A key window [lo, hi) that probably holds τ*.
  struct sampled_window {
    key_type lo = 0;
    key_type hi = 0;
  };

  /// Reads the sample (chunks of `sample_chunk` values at the start of each n/`sample_chunks`-th of
  /// a) and returns the keys around the sample's z/n-quantile: ±(4 standard deviations of the
  /// sample rank + 32) sample ranks, open to 0 or +Inf's key at either end.
  template <class ValueAt>
  static sampled_window sample_window(std::size_t n, std::uint64_t z, ValueAt&& value_at, const scratch& s) {
    const std::size_t stride = n / sample_chunks;
    key_type* const sample = s.sample.data();
    for (std::size_t c = 0; c < sample_chunks; ++c)
      for (std::size_t j = 0; j < sample_chunk; ++j)
        sample[c * sample_chunk + j] = magnitude_key<C>(value_at(c * stride + j));
    const double p = static_cast<double>(z) / static_cast<double>(n);
    // Products rounded apart from the sums (`mul_rn`), so the window is the same under any flags.
    const double middle = mul_rn(p, static_cast<double>(sample_size));
    const double margin = mul_rn(4.0, std::sqrt(static_cast<double>(sample_size) * p * (1.0 - p))) + 32.0;
    // The ascending rank-th sampled key (0-based) is the (sample_size − rank)-th largest.
    const auto sampled = [&](std::size_t rank) {
      return detail::cpu::select_kth_largest<key_type>(
                 [&](auto&& visit) {
                   for (std::size_t j = 0; j < sample_size; ++j) visit(sample[j]);
                 },
                 key_bits, sample_size - rank, key_type{0}, 0, s.histogram)
          .key;
    };
    sampled_window w{0, float_traits<C>::infinity_key};
    if (middle - margin > 0.0) w.lo = std::min(sampled(static_cast<std::size_t>(middle - margin)), w.hi);
    if (middle + margin < static_cast<double>(sample_size - 1)) {
      const key_type top = sampled(static_cast<std::size_t>(middle + margin));
      if (top < w.hi) w.hi = static_cast<key_type>(top + 1);
    }
    return w;
  }

  /// What one pass of `collect_window` found.
  struct window_pass {
    std::uint64_t below = 0;       ///< Keys below the window.
    bool non_finite = false;       ///< NaN or ±Inf seen.
    std::size_t count = 0;         ///< Keys listed (all the window's, unless `overflow`).
    bool overflow = false;         ///< The window held more keys than the list.
  };

  /// Set bits of a 16-bit mask, by table: the baseline x86-64 target has no POPCNT instruction.
  [[nodiscard]] static std::uint32_t bits_set16(std::uint32_t mask) noexcept {
    static constexpr std::array<std::uint8_t, 256> table = [] {
      std::array<std::uint8_t, 256> t{};
      for (unsigned b = 0; b < 256; ++b) t[b] = static_cast<std::uint8_t>(std::popcount(b));
      return t;
    }();
    return std::uint32_t{table[mask & 0xffu]} + table[(mask >> 8) & 0xffu];
  }

  /// One pass over a in blocks of 16: counts the keys below `lo`, notes NaN/±Inf, and lists the
  /// keys in [lo, hi) (hi at most +Inf's key) while the list has room for a whole block. The first
  /// two hits of a block are written without branches, so sparse hits cost no mispredictions. For
  /// float with SSE2, full blocks count and note in vector registers (one load per four keys); the
  /// last partial block, and double, go through the scalar masks. Both give the same result.
  template <class ValueAt>
  static window_pass collect_window(std::size_t n, ValueAt&& value_at, key_type lo, key_type hi,
                                    std::span<key_type> list) {
    constexpr std::size_t block = 16;
    window_pass w;
    key_type* const out = list.data();
    const auto list_hits = [&](const C* v, std::uint32_t in) {
      if (w.count + block > list.size()) {
        w.overflow = w.overflow || in != 0;
        return;
      }
      for (int slot = 0; slot < 2; ++slot) {
        out[w.count] = magnitude_key(v[std::countr_zero(in | 0x8000u)]);
        w.count += in != 0 ? 1u : 0u;
        in &= in - 1;
      }
      for (; in != 0; in &= in - 1) [[unlikely]]
        out[w.count++] = magnitude_key(v[std::countr_zero(in)]);
    };
    const auto take = [&](const C* v, std::uint32_t valid) {
      const std::uint32_t at_least_lo = detail::cpu::at_least_mask16(v, lo) & valid;
      w.below += bits_set16(valid & ~at_least_lo);
      w.non_finite = w.non_finite || (detail::cpu::at_least_mask16(v, float_traits<C>::infinity_key) & valid) != 0;
      list_hits(v, at_least_lo & ~detail::cpu::at_least_mask16(v, hi));
    };
    std::size_t i = 0;
#if defined(__SSE2__)
    if constexpr (std::is_same_v<C, float>) {
      // Keys have no sign bit, so signed 32-bit comparisons order them. Lane counters of keys
      // below lo are flushed every 2^24 blocks, long before they could overflow.
      const __m128i magnitude = _mm_set1_epi32(0x7fffffff);
      const __m128i lo_key = _mm_set1_epi32(static_cast<int>(lo));
      const __m128i lo_less_one = _mm_set1_epi32(static_cast<int>(lo) - 1);
      const __m128i hi_key = _mm_set1_epi32(static_cast<int>(hi));
      const __m128i finite_max = _mm_set1_epi32(static_cast<int>(float_traits<C>::infinity_key) - 1);
      __m128i non_finite = _mm_setzero_si128();
      while (i + block <= n) {
        __m128i below = _mm_setzero_si128();
        const std::size_t end = i + std::min<std::size_t>((n - i) / block, std::size_t{1} << 24) * block;
        for (; i < end; i += block) {
          C v[block];
          for (std::size_t j = 0; j < block; ++j) v[j] = value_at(i + j);
          std::uint32_t in = 0;
          for (int q = 0; q < 4; ++q) {
            const __m128i key = _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + 4 * q)), magnitude);
            below = _mm_sub_epi32(below, _mm_cmpgt_epi32(lo_key, key));
            non_finite = _mm_or_si128(non_finite, _mm_cmpgt_epi32(key, finite_max));
            const __m128i inside = _mm_and_si128(_mm_cmpgt_epi32(key, lo_less_one), _mm_cmpgt_epi32(hi_key, key));
            in |= static_cast<std::uint32_t>(_mm_movemask_ps(_mm_castsi128_ps(inside))) << (4 * q);
          }
          list_hits(v, in);
        }
        alignas(16) std::uint32_t lanes[4];
        _mm_store_si128(reinterpret_cast<__m128i*>(lanes), below);
        w.below += std::uint64_t{lanes[0]} + lanes[1] + lanes[2] + lanes[3];
      }
      w.non_finite = w.non_finite || _mm_movemask_epi8(non_finite) != 0;
    }
#endif
    for (; i + block <= n; i += block) {
      C v[block];
      for (std::size_t j = 0; j < block; ++j) v[j] = value_at(i + j);
      take(v, 0xffffu);
    }
    if (i < n) {
      C v[block] = {};  // the last partial block, zero-padded; padding lanes are masked off
      for (std::size_t j = 0; i + j < n; ++j) v[j] = value_at(i + j);
      take(v, (std::uint32_t{1} << (n - i)) - 1);
    }
    return w;
  }

  /// out = ã and residual = a − ã with a = grad + residual, element by element (`dynamic_split`).
  /// Returns the kept count.
  static std::uint64_t apply(std::span<const T> grad, std::vector<C>& residual, std::span<C> out, key_type tau) {
    const T* const g = grad.data();
    C* const r = residual.data();
    C* const o = out.data();
    std::uint64_t kept = 0;
    for (std::size_t i = 0; i < grad.size(); ++i)
      kept += dynamic_split(C{widen(g[i])} + r[i], tau, o[i], r[i]) ? 1u : 0u;
    return kept;
  }
};

}  // namespace gradcomp
