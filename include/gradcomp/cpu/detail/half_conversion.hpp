#pragma once
/// @file
/// Runs of 16-bit values widened to float32 and float32 values narrowed back, for the CPU kernels
/// that read and write bf16 and fp16 gradients a cache-resident stage at a time (no float32 copy
/// of the whole gradient), and the decoders' checked store of results into a 16-bit output. Each value converts as core/half_float.hpp's `widen` and `narrow`
/// define, bit for bit; bf16 takes SSE2 (its widening is a 16-bit shift), fp16 the scalar
/// conversion.

#include <cstdint>
#include <string>
#include <type_traits>

#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/half_float.hpp>
#include <gradcomp/core/narrowing.hpp>

#if defined(__SSE2__)
#  include <emmintrin.h>
#endif

namespace gradcomp::detail::cpu {

/// wide[i] = widen(x[i]) for i < count.
template <gradient_value T>
  requires half_precision<T>
inline void widen_values(const T* x, std::uint64_t count, float* wide) noexcept {
  std::uint64_t i = 0;
#if defined(__SSE2__)
  if constexpr (std::is_same_v<T, bf16>) {
    const __m128i zero = _mm_setzero_si128();
    for (const std::uint64_t whole = count / 8 * 8; i < whole; i += 8) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(wide + i), _mm_unpacklo_epi16(zero, v));  // bits << 16
      _mm_storeu_si128(reinterpret_cast<__m128i*>(wide + i + 4), _mm_unpackhi_epi16(zero, v));
    }
  }
#endif
  for (; i < count; ++i) wide[i] = widen(x[i]);
}

/// x[0, count) in the compute type: x itself, or (a 16-bit T) its values widened into `wide`,
/// which must hold `count` values; for the kernels that code a gradient a chunk at a time.
template <gradient_value T>
[[nodiscard]] const compute_type<T>* widened_run(const T* x, std::uint64_t count, compute_type<T>* wide) noexcept {
  if constexpr (half_precision<T>) {
    widen_values(x, count, wide);
    return wide;
  } else {
    (void)count, (void)wide;
    return x;
  }
}

/// out[i] = narrow<T>(wide[i]) for i < count (round to nearest even).
template <gradient_value T>
  requires half_precision<T>
inline void narrow_values(const float* wide, std::uint64_t count, T* out) noexcept {
  std::uint64_t i = 0;
#if defined(__SSE2__)
  if constexpr (std::is_same_v<T, bf16>) {
    // (u + 0x7fff + bit 16 of u) >> 16, NaN quieted: 32-bit lanes, then the high halves packed.
    const __m128i bias = _mm_set1_epi32(0x7fff), one = _mm_set1_epi32(1), quiet = _mm_set1_epi32(0x00400000);
    const __m128i magnitude = _mm_set1_epi32(0x7fffffff), infinity = _mm_set1_epi32(0x7f800000);
    const auto round = [&](__m128i u) {
      const __m128i rounded = _mm_add_epi32(_mm_add_epi32(u, bias), _mm_and_si128(_mm_srli_epi32(u, 16), one));
      const __m128i nan = _mm_cmpgt_epi32(_mm_and_si128(u, magnitude), infinity);
      const __m128i kept = _mm_or_si128(u, quiet);
      // Arithmetic shift and pack with signed saturation would clip; shift right 16 logically, then
      // sign-extend by shifting left and arithmetic right so that packs keeps the 16 bits.
      const __m128i r = _mm_or_si128(_mm_and_si128(nan, kept), _mm_andnot_si128(nan, rounded));
      return _mm_srai_epi32(_mm_slli_epi32(_mm_srli_epi32(r, 16), 16), 16);
    };
    for (const std::uint64_t whole = count / 8 * 8; i < whole; i += 8) {
      const __m128i lo = round(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wide + i)));
      const __m128i hi = round(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wide + i + 4)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm_packs_epi32(lo, hi));
    }
  }
#endif
  for (; i < count; ++i) out[i] = narrow<T>(wide[i]);
}

/// Writes the results `for_each_result(use)` produces, calling `use(i, value)` in the compute type
/// for every element i, to `out`: as they are, or narrowed to out's 16-bit type after a first run
/// checks that none becomes ±Inf (docs/half-precision.md §3); `for_each_result` runs once or twice
/// and must produce the same results each time (it may read `out`).
/// @throws error `narrowing_overflow` naming the first result that would; `out` is then untouched.
template <class ForEachResult, gradient_value O>
void store_values(ForEachResult&& for_each_result, O* out) {
  if constexpr (half_precision<O>) {
    for_each_result([&](std::uint64_t i, float v) { require_narrows<O>(i, v); });
    for_each_result([&](std::uint64_t i, float v) { out[i] = narrow<O>(v); });
  } else {
    for_each_result([&](std::uint64_t i, O v) { out[i] = v; });
  }
}

}  // namespace gradcomp::detail::cpu
