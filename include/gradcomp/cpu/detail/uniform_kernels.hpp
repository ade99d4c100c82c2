#pragma once
/// @file
/// The vectorised float32 kernels of the uniform quantizer's CPU backend (also used by the fused
/// error-feedback and LoCo paths): block maximum, 8-bit and 4-bit round-to-nearest codes, 8-bit
/// stochastic-rounding codes, 8-bit and 4-bit decoding, and error feedback's residual x − decoded
/// (from the codes, or with the 8-bit round-to-nearest codes in one pass). Each has a baseline
/// version (SSE2) and an AVX2 twin; without SSE2 none is compiled and the callers code every value
/// with the scalar arithmetic (`uniform_kernels_compiled`). All compute exactly the arithmetic of
/// quantize/uniform_math.hpp (t = x·inv in float, cvtps2dq/cvttps2dq round and truncate as
/// round_half_even and floor_to_int do), so every version writes the same bits. Every product that
/// feeds a sum or a difference passes through `rounded` (core/rounded_product.hpp), so that no
/// compiler flag fuses the two into a multiply-add. Counts are multiples of 32 values; the caller
/// handles the rest with the scalar code.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/rounded_product.hpp>
#include <gradcomp/quantize/uniform_math.hpp>

#if defined(__SSE2__) || defined(GRADCOMP_HAVE_AVX2)
#  include <immintrin.h>
#endif

namespace gradcomp::detail::cpu {

/// Values per kernel step; kernel counts are multiples of it.
inline constexpr std::uint64_t kernel_width = 32;

/// Whether the coding, decoding and residual kernels below are compiled: with SSE2 (the x86-64
/// baseline), and their AVX2 twins with GRADCOMP_HAVE_AVX2. Without them the callers
/// (cpu/detail/uniform_block_encoder.hpp) code and decode every value with the scalar arithmetic of
/// quantize/uniform_math.hpp, which reference/uniform.hpp specifies, and never call them.
inline constexpr bool uniform_kernels_compiled =
#if defined(__SSE2__)
    true;
#else
    false;
#endif

/// Bits of max |x| over x[0, count) (count a multiple of 32): the magnitude key, whose value at or
/// above the infinity key means NaN or Inf.
[[nodiscard]] inline std::uint32_t max_magnitude_key32(const float* x, std::uint64_t count, bool avx2) noexcept;
/// Bits of max |x| over bf16 values x[0, count) (count a multiple of 32): the 16-bit magnitude key,
/// whose value at or above 0x7f80 means NaN or Inf.
[[nodiscard]] inline std::uint16_t max_magnitude_key16(const bf16* x, std::uint64_t count, bool avx2) noexcept;
/// Codes rne(x·inv) + 127 of x[0, count) into codes[0, count); x float32, or bf16 widened in the
/// kernel's registers (the values t are the same as for the widened floats).
template <class X>
inline void encode8_rtn(const X* x, std::uint64_t count, float inv, std::uint8_t* codes, bool avx2) noexcept;
/// Codes rne(x·inv) + 7 of x[0, count), two per byte (even element in the low nibble).
inline void encode4_rtn(const float* x, std::uint64_t count, float inv, std::uint8_t* packed, bool avx2) noexcept;
/// Codes ⌊x·inv + u⌋ + 127 (clamped to [−127, 127] first), u = halves[i]·2^-16.
inline void encode8_sr(const float* x, std::uint64_t count, float inv, const std::uint16_t* halves, std::uint8_t* codes,
                       bool avx2) noexcept;
/// dense[i] (=, or += when `accumulate`) (codes[i] − 127)·s for 8-bit codes, or the nibble codes
/// minus 7 for 4-bit codes (packed as encode4_rtn writes them). With `streaming` (not with
/// `accumulate`; dense 32-byte aligned) the values are written with non-temporal stores.
template <int Bits>
inline void decode_codes(const std::uint8_t* codes, std::uint64_t count, float s, float* dense, bool accumulate,
                         bool streaming, bool avx2) noexcept;
/// encode8_rtn's codes of x[0, count) and, in the same pass, residual[i] = x[i] − (codes[i] − 127)·s:
/// x less the value decode_codes gives its code at step s (error feedback's new residual). With
/// `streaming` (residual `streamable`) the residual is written with non-temporal stores.
inline void encode8_rtn_residual(const float* x, std::uint64_t count, float inv, float s, std::uint8_t* codes,
                                 float* residual, bool streaming, bool avx2) noexcept;
/// residual[i] = x[i] − v[i], v[i] the value decode_codes gives code i at step s (8-bit, or 4-bit
/// packed). With `streaming` (residual `streamable`) the residual is written with non-temporal
/// stores.
template <int Bits>
inline void residual_of_codes(const std::uint8_t* codes, std::uint64_t count, float s, const float* x, float* residual,
                              bool streaming, bool avx2) noexcept;
/// Whether the residual kernels can stream into `residual`: 16-byte aligned, as every
/// std::vector<float> is on x86-64.
[[nodiscard]] inline bool streamable(const float* residual) noexcept {
  return reinterpret_cast<std::uintptr_t>(residual) % 16 == 0;
}
/// Whether any 8-bit code of codes[0, bytes) is 0xFF, or (Bits = 4) any nibble is 0xF: the one
/// code above the largest level 2L.
template <int Bits>
[[nodiscard]] inline bool any_code_all_ones(const std::uint8_t* codes, std::uint64_t bytes, bool avx2) noexcept;

namespace kernel_detail {

[[nodiscard]] inline std::uint32_t magnitude_bits(float v) noexcept {
  std::uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits & 0x7fffffffu;
}

#if defined(__SSE2__)
/// Four values from x as float32: loaded, or (bf16) widened by a 16-bit shift.
[[nodiscard]] inline __m128 load4(const float* x) noexcept { return _mm_loadu_ps(x); }
[[nodiscard]] inline __m128 load4(const bf16* x) noexcept {
  return _mm_castsi128_ps(
      _mm_unpacklo_epi16(_mm_setzero_si128(), _mm_loadl_epi64(reinterpret_cast<const __m128i*>(x))));
}

/// Codes i .. i + 15, one per byte: 8-bit codes as they are, 4-bit codes unpacked from 8 bytes (i even).
template <int Bits>
[[nodiscard]] inline __m128i load16_codes(const std::uint8_t* codes, std::uint64_t i) noexcept {
  if constexpr (Bits == 8) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i));
  } else {
    const __m128i nibble = _mm_set1_epi8(0x0f);
    const __m128i packed = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i / 2));
    return _mm_unpacklo_epi8(_mm_and_si128(packed, nibble), _mm_and_si128(_mm_srli_epi16(packed, 4), nibble));
  }
}

/// Calls put(j, values) for every j = i, i + 4, … < count (count a multiple of 16) with the
/// decoded values level·s of codes j .. j + 3.
template <int Bits, class Put>
inline void for_each_values4_sse2(const std::uint8_t* codes, std::uint64_t count, float s, Put&& put) noexcept {
  const __m128 step = _mm_set1_ps(s);
  const __m128i offset = _mm_set1_epi32(Bits == 8 ? 127 : 7);
  const __m128i zero = _mm_setzero_si128();
  for (std::uint64_t i = 0; i < count; i += 16) {
    const __m128i v = load16_codes<Bits>(codes, i);
    const __m128i lo = _mm_unpacklo_epi8(v, zero);
    const __m128i hi = _mm_unpackhi_epi8(v, zero);
    const __m128i q[4] = {_mm_unpacklo_epi16(lo, zero), _mm_unpackhi_epi16(lo, zero), _mm_unpacklo_epi16(hi, zero),
                          _mm_unpackhi_epi16(hi, zero)};
    for (int k = 0; k < 4; ++k)
      put(i + 4 * static_cast<std::uint64_t>(k),
          rounded(_mm_mul_ps(_mm_cvtepi32_ps(_mm_sub_epi32(q[k], offset)), step)));
  }
}

/// Stores four floats at `at` (16-byte aligned when `streaming`), with a non-temporal store or not.
inline void store4(float* at, __m128 v, bool streaming) noexcept {
  if (streaming) _mm_stream_ps(at, v);
  else
    _mm_storeu_ps(at, v);
}
#endif

#if defined(GRADCOMP_HAVE_AVX2)
GRADCOMP_TARGET_AVX2 inline std::uint16_t max_key16_avx2(const bf16* x, std::uint64_t count) noexcept {
  const __m256i mask = _mm256_set1_epi16(0x7fff);
  __m256i a = _mm256_setzero_si256(), b = _mm256_setzero_si256();
  // Keys are below 2^15, so the signed 16-bit maximum orders them as unsigned.
  for (std::uint64_t i = 0; i < count; i += 32) {
    a = _mm256_max_epi16(a, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), mask));
    b = _mm256_max_epi16(b, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 16)), mask));
  }
  // The largest of the 16 lanes by halving: 128-bit halves, 64-bit, 32-bit, then 16-bit neighbours.
  a = _mm256_max_epi16(a, b);
  __m128i m = _mm_max_epi16(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
  m = _mm_max_epi16(m, _mm_shuffle_epi32(m, 0x4e));
  m = _mm_max_epi16(m, _mm_shuffle_epi32(m, 0xb1));
  m = _mm_max_epi16(m, _mm_srli_epi32(m, 16));
  return static_cast<std::uint16_t>(_mm_cvtsi128_si32(m));
}

GRADCOMP_TARGET_AVX2 inline std::uint32_t max_key_avx2(const float* x, std::uint64_t count) noexcept {
  const __m256i mask = _mm256_set1_epi32(0x7fffffff);
  __m256i a = _mm256_setzero_si256(), b = _mm256_setzero_si256();
  for (std::uint64_t i = 0; i < count; i += 16) {
    a = _mm256_max_epi32(a, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), mask));
    b = _mm256_max_epi32(b, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 8)), mask));
  }
  a = _mm256_max_epi32(a, b);
  alignas(32) std::uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), a);
  return *std::max_element(lanes, lanes + 8);
}

/// rne(x[k]·scale) of 32 values as 32 bytes in order, saturated to [−128, 127] (exact where the
/// levels are within [−127, 127]).
GRADCOMP_TARGET_AVX2 inline __m256i round_pack32_avx2(const float* x, __m256 scale) noexcept {
  const __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), scale));
  const __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), scale));
  const __m256i q2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16), scale));
  const __m256i q3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 24), scale));
  // The packs work within 128-bit lanes; the permutation restores element order.
  const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
  return _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

GRADCOMP_TARGET_AVX2 inline void encode8_rtn_avx2(const float* x, std::uint64_t count, float inv,
                                                  std::uint8_t* codes) noexcept {
  const __m256 scale = _mm256_set1_ps(inv);
  const __m256i offset = _mm256_set1_epi8(127);
  for (std::uint64_t i = 0; i < count; i += 32)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i),
                        _mm256_add_epi8(round_pack32_avx2(x + i, scale), offset));
}

/// encode8_rtn_avx2 of bf16 values without a shuffle to widen them: in each 32-bit word of 16
/// values, the even value is the word shifted left by 16 and the odd one the word's high half; their
/// codes meet again as the two bytes of a 16-bit lane (even value first), and one pack and one
/// permutation restore the order.
GRADCOMP_TARGET_AVX2 inline void encode8_rtn_bf16_avx2(const bf16* x, std::uint64_t count, float inv,
                                                       std::uint8_t* codes) noexcept {
  const __m256 scale = _mm256_set1_ps(inv);
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  const __m256i offset = _mm256_set1_epi32(127);
  for (std::uint64_t i = 0; i < count; i += 32) {
    __m256i pairs[2];
    for (int h = 0; h < 2; ++h) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 16 * h));
      const __m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
      const __m256 odd = _mm256_castsi256_ps(_mm256_and_si256(v, high));
      // |t| ≤ 127·(1 + 2^-23) rounds into [−127, 127], so each code is in [0, 254].
      const __m256i code_even = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(even, scale)), offset);
      const __m256i code_odd = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(odd, scale)), offset);
      pairs[h] = _mm256_or_si256(code_even, _mm256_slli_epi32(code_odd, 8));
    }
    // The pack works within 128-bit lanes, giving the 8-value quarters 0, 2, 1, 3 (in units of 8).
    const __m256i packed = _mm256_packus_epi32(pairs[0], pairs[1]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i), _mm256_permute4x64_epi64(packed, 0xd8));
  }
}

GRADCOMP_TARGET_AVX2 inline void encode4_rtn_avx2(const float* x, std::uint64_t count, float inv,
                                                  std::uint8_t* packed) noexcept {
  const __m256 scale = _mm256_set1_ps(inv);
  const __m256i top = _mm256_set1_epi8(7);
  const __m256i bottom = _mm256_set1_epi8(-7);
  const __m256i offset = _mm256_set1_epi8(7);
  const __m256i low_byte = _mm256_set1_epi16(0x00ff);
  for (std::uint64_t i = 0; i < count; i += 32) {
    const __m256i q = _mm256_max_epi8(_mm256_min_epi8(round_pack32_avx2(x + i, scale), top), bottom);
    const __m256i c = _mm256_add_epi8(q, offset);  // 32 codes in [0, 14]
    // Each 16-bit lane holds an even code (low byte) and the next odd one (high byte).
    const __m256i pairs = _mm256_and_si256(_mm256_or_si256(c, _mm256_srli_epi16(c, 4)), low_byte);
    const __m256i bytes = _mm256_permute4x64_epi64(_mm256_packus_epi16(pairs, pairs), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(packed + i / 2), _mm256_castsi256_si128(bytes));
  }
}

GRADCOMP_TARGET_AVX2 inline void encode8_sr_avx2(const float* x, std::uint64_t count, float inv,
                                                 const std::uint16_t* halves, std::uint8_t* codes) noexcept {
  const __m256 scale = _mm256_set1_ps(inv);
  const __m256 unit = _mm256_set1_ps(1.0f / 65536.0f);
  const __m256i top = _mm256_set1_epi8(127);
  const __m256i bottom = _mm256_set1_epi8(-127);
  const __m256i offset = _mm256_set1_epi8(127);
  for (std::uint64_t i = 0; i < count; i += 32) {
    __m256i q[4];
    for (int k = 0; k < 4; ++k) {
      const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(halves + i + 8 * k)));
      const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(w), unit);
      const __m256 y = _mm256_add_ps(rounded(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * k), scale)), u);
      const __m256i truncated = _mm256_cvttps_epi32(y);
      // Subtract one where the truncation lies above y (all-ones mask = −1).
      q[k] =
          _mm256_add_epi32(truncated, _mm256_castps_si256(_mm256_cmp_ps(_mm256_cvtepi32_ps(truncated), y, _CMP_GT_OQ)));
    }
    __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    packed = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    // ⌊t + u⌋ ≤ 128 saturates to 127 and ≥ −128 to −128, which the clamp lifts to −127.
    const __m256i clamped = _mm256_max_epi8(_mm256_min_epi8(packed, top), bottom);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i), _mm256_add_epi8(clamped, offset));
  }
}

template <int Bits>
GRADCOMP_TARGET_AVX2 inline void decode_avx2(const std::uint8_t* codes, std::uint64_t count, float s, float* dense,
                                             bool accumulate, bool streaming) noexcept {
  const __m256 step = _mm256_set1_ps(s);
  const __m256i offset = _mm256_set1_epi32(Bits == 8 ? 127 : 7);
  for (std::uint64_t i = 0; i < count; i += 16) {
    const __m128i v = load16_codes<Bits>(codes, i);
    for (int half = 0; half < 2; ++half) {
      const __m256i q = _mm256_sub_epi32(_mm256_cvtepu8_epi32(half == 0 ? v : _mm_srli_si128(v, 8)), offset);
      __m256 value = rounded(_mm256_mul_ps(_mm256_cvtepi32_ps(q), step));
      float* const at = dense + i + 8 * half;
      if (accumulate) value = _mm256_add_ps(_mm256_loadu_ps(at), value);
      if (streaming) _mm256_stream_ps(at, value);
      else
        _mm256_storeu_ps(at, value);
    }
  }
}

/// Stores r at `at` (16-byte aligned when `Streaming`), streamed or not.
template <bool Streaming>
GRADCOMP_TARGET_AVX2 inline void store_residual(float* at, __m256 r) noexcept {
  if constexpr (Streaming) {
    _mm_stream_ps(at, _mm256_castps256_ps128(r));
    _mm_stream_ps(at + 4, _mm256_extractf128_ps(r, 1));
  } else {
    _mm256_storeu_ps(at, r);
  }
}

template <bool Streaming>
GRADCOMP_TARGET_AVX2 inline void encode8_rtn_residual_avx2(const float* x, std::uint64_t count, float inv, float s,
                                                           std::uint8_t* codes, float* residual) noexcept {
  const __m256 scale = _mm256_set1_ps(inv);
  const __m256 step = _mm256_set1_ps(s);
  const __m256i offset = _mm256_set1_epi8(127);
  for (std::uint64_t i = 0; i < count; i += 32) {
    __m256i q[4];
    for (int k = 0; k < 4; ++k) {
      const __m256 v = _mm256_loadu_ps(x + i + 8 * k);
      q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v, scale));
      // |t| ≤ 127·(1 + 2^-23) rounds into [−127, 127], so q is the level the code stores.
      store_residual<Streaming>(residual + i + 8 * k,
                                _mm256_sub_ps(v, rounded(_mm256_mul_ps(_mm256_cvtepi32_ps(q[k]), step))));
    }
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i),
                        _mm256_add_epi8(_mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)),
                                        offset));
  }
}

/// decode_avx2's arithmetic, each value subtracted from x (kept apart from decode_avx2, whose
/// plain loop compiles faster than a shared one taking a callback).
template <int Bits, bool Streaming>
GRADCOMP_TARGET_AVX2 inline void residual_of_codes_avx2(const std::uint8_t* codes, std::uint64_t count, float s,
                                                        const float* x, float* residual) noexcept {
  const __m256 step = _mm256_set1_ps(s);
  const __m256i offset = _mm256_set1_epi32(Bits == 8 ? 127 : 7);
  for (std::uint64_t i = 0; i < count; i += 16) {
    const __m128i v = load16_codes<Bits>(codes, i);
    for (int half = 0; half < 2; ++half) {
      const __m256i q = _mm256_sub_epi32(_mm256_cvtepu8_epi32(half == 0 ? v : _mm_srli_si128(v, 8)), offset);
      const __m256 value = rounded(_mm256_mul_ps(_mm256_cvtepi32_ps(q), step));
      store_residual<Streaming>(residual + i + 8 * half, _mm256_sub_ps(_mm256_loadu_ps(x + i + 8 * half), value));
    }
  }
}

template <int Bits>
GRADCOMP_TARGET_AVX2 inline bool any_all_ones_avx2(const std::uint8_t* codes, std::uint64_t whole) noexcept {
  const __m256i low = _mm256_set1_epi8(static_cast<char>(Bits == 8 ? 0xff : 0x0f));
  const __m256i high = _mm256_set1_epi8(static_cast<char>(Bits == 8 ? 0xff : 0xf0));
  __m256i found = _mm256_setzero_si256();
  for (std::uint64_t b = 0; b < whole; b += 32) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + b));
    found = _mm256_or_si256(found, _mm256_cmpeq_epi8(_mm256_and_si256(v, low), low));
    if constexpr (Bits == 4) found = _mm256_or_si256(found, _mm256_cmpeq_epi8(_mm256_and_si256(v, high), high));
  }
  return _mm256_movemask_epi8(found) != 0;
}
#endif

}  // namespace kernel_detail

inline std::uint32_t max_magnitude_key32(const float* x, std::uint64_t count, bool avx2) noexcept {
#if defined(GRADCOMP_HAVE_AVX2)
  if (avx2) return kernel_detail::max_key_avx2(x, count);
#endif
  (void)avx2;
  std::uint32_t largest = 0;
  std::uint64_t i = 0;
#if defined(__SSE2__)
  // Magnitude keys are below 2^31, so the signed 32-bit comparison orders them as unsigned.
  const __m128i mask = _mm_set1_epi32(0x7fffffff);
  __m128i a = _mm_setzero_si128(), b = _mm_setzero_si128();
  for (; i < count; i += 8) {
    const __m128i ka = _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)), mask);
    const __m128i kb = _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i + 4)), mask);
    const __m128i ga = _mm_cmpgt_epi32(ka, a);
    const __m128i gb = _mm_cmpgt_epi32(kb, b);
    a = _mm_or_si128(_mm_and_si128(ga, ka), _mm_andnot_si128(ga, a));
    b = _mm_or_si128(_mm_and_si128(gb, kb), _mm_andnot_si128(gb, b));
  }
  alignas(16) std::uint32_t lanes[8];
  _mm_store_si128(reinterpret_cast<__m128i*>(lanes), a);
  _mm_store_si128(reinterpret_cast<__m128i*>(lanes + 4), b);
  largest = *std::max_element(lanes, lanes + 8);
#endif
  for (; i < count; ++i) largest = std::max(largest, kernel_detail::magnitude_bits(x[i]));
  return largest;
}

inline std::uint16_t max_magnitude_key16(const bf16* x, std::uint64_t count, bool avx2) noexcept {
#if defined(GRADCOMP_HAVE_AVX2)
  if (avx2) return kernel_detail::max_key16_avx2(x, count);
#endif
  (void)avx2;
  std::uint16_t largest = 0;
  std::uint64_t i = 0;
#if defined(__SSE2__)
  const __m128i mask = _mm_set1_epi16(0x7fff);
  __m128i a = _mm_setzero_si128(), b = _mm_setzero_si128();
  for (; i < count; i += 16) {  // keys are below 2^15: the signed maximum orders them
    a = _mm_max_epi16(a, _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)), mask));
    b = _mm_max_epi16(b, _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i + 8)), mask));
  }
  alignas(16) std::uint16_t lanes[8];
  _mm_store_si128(reinterpret_cast<__m128i*>(lanes), _mm_max_epi16(a, b));
  largest = *std::max_element(lanes, lanes + 8);
#endif
  for (; i < count; ++i) largest = std::max(largest, static_cast<std::uint16_t>(x[i].bits & 0x7fffu));
  return largest;
}

#if defined(__SSE2__)
template <class X>
inline void encode8_rtn(const X* x, std::uint64_t count, float inv, std::uint8_t* codes, bool avx2) noexcept {
#  if defined(GRADCOMP_HAVE_AVX2)
  if (avx2) {
    if constexpr (std::is_same_v<X, bf16>) return kernel_detail::encode8_rtn_bf16_avx2(x, count, inv, codes);
    else
      return kernel_detail::encode8_rtn_avx2(x, count, inv, codes);
  }
#  endif
  (void)avx2;
  using kernel_detail::load4;
  const __m128 scale = _mm_set1_ps(inv);
  const __m128i offset = _mm_set1_epi8(127);
  for (std::uint64_t i = 0; i < count; i += 16) {
    const __m128i q0 = _mm_cvtps_epi32(_mm_mul_ps(load4(x + i), scale));
    const __m128i q1 = _mm_cvtps_epi32(_mm_mul_ps(load4(x + i + 4), scale));
    const __m128i q2 = _mm_cvtps_epi32(_mm_mul_ps(load4(x + i + 8), scale));
    const __m128i q3 = _mm_cvtps_epi32(_mm_mul_ps(load4(x + i + 12), scale));
    // |t| ≤ 127·(1 + 2^-23) rounds into [−127, 127]: the saturating packs are exact here.
    const __m128i q = _mm_packs_epi16(_mm_packs_epi32(q0, q1), _mm_packs_epi32(q2, q3));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), _mm_add_epi8(q, offset));
  }
}

inline void encode4_rtn(const float* x, std::uint64_t count, float inv, std::uint8_t* packed, bool avx2) noexcept {
#  if defined(GRADCOMP_HAVE_AVX2)
  if (avx2) return kernel_detail::encode4_rtn_avx2(x, count, inv, packed);
#  endif
  (void)avx2;
  const __m128 scale = _mm_set1_ps(inv);
  const __m128i top = _mm_set1_epi16(7);
  const __m128i bottom = _mm_set1_epi16(-7);
  const __m128i offset = _mm_set1_epi8(7);
  const __m128i low_byte = _mm_set1_epi16(0x00ff);
  for (std::uint64_t i = 0; i < count; i += 16) {
    const __m128i q0 = _mm_cvtps_epi32(_mm_mul_ps(_mm_loadu_ps(x + i), scale));
    const __m128i q1 = _mm_cvtps_epi32(_mm_mul_ps(_mm_loadu_ps(x + i + 4), scale));
    const __m128i q2 = _mm_cvtps_epi32(_mm_mul_ps(_mm_loadu_ps(x + i + 8), scale));
    const __m128i q3 = _mm_cvtps_epi32(_mm_mul_ps(_mm_loadu_ps(x + i + 12), scale));
    const __m128i a = _mm_max_epi16(_mm_min_epi16(_mm_packs_epi32(q0, q1), top), bottom);
    const __m128i b = _mm_max_epi16(_mm_min_epi16(_mm_packs_epi32(q2, q3), top), bottom);
    const __m128i c = _mm_add_epi8(_mm_packs_epi16(a, b), offset);  // 16 codes in [0, 14]
    // Each 16-bit lane holds an even code (low byte) and the next odd one (high byte).
    const __m128i pairs = _mm_and_si128(_mm_or_si128(c, _mm_srli_epi16(c, 4)), low_byte);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(packed + i / 2), _mm_packus_epi16(pairs, pairs));
  }
}

inline void encode8_sr(const float* x, std::uint64_t count, float inv, const std::uint16_t* halves, std::uint8_t* codes,
                       bool avx2) noexcept {
#  if defined(GRADCOMP_HAVE_AVX2)
  if (avx2) return kernel_detail::encode8_sr_avx2(x, count, inv, halves, codes);
#  endif
  (void)avx2;
  const __m128 scale = _mm_set1_ps(inv);
  const __m128 unit = _mm_set1_ps(1.0f / 65536.0f);
  const __m128i zero = _mm_setzero_si128();
  const __m128i top = _mm_set1_epi16(127);
  const __m128i bottom = _mm_set1_epi16(-127);
  const __m128i offset = _mm_set1_epi8(127);
  for (std::uint64_t i = 0; i < count; i += 16) {
    const __m128i h0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(halves + i));
    const __m128i h1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(halves + i + 8));
    const __m128i w[4] = {_mm_unpacklo_epi16(h0, zero), _mm_unpackhi_epi16(h0, zero), _mm_unpacklo_epi16(h1, zero),
                          _mm_unpackhi_epi16(h1, zero)};
    __m128i q[4];
    for (int k = 0; k < 4; ++k) {
      const __m128 u = _mm_mul_ps(_mm_cvtepi32_ps(w[k]), unit);
      const __m128 y = _mm_add_ps(rounded(_mm_mul_ps(_mm_loadu_ps(x + i + 4 * k), scale)), u);
      const __m128i truncated = _mm_cvttps_epi32(y);
      // Subtract one where the truncation lies above y (all-ones mask = −1).
      q[k] = _mm_add_epi32(truncated, _mm_castps_si128(_mm_cmpgt_ps(_mm_cvtepi32_ps(truncated), y)));
    }
    const __m128i a = _mm_max_epi16(_mm_min_epi16(_mm_packs_epi32(q[0], q[1]), top), bottom);
    const __m128i b = _mm_max_epi16(_mm_min_epi16(_mm_packs_epi32(q[2], q[3]), top), bottom);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), _mm_add_epi8(_mm_packs_epi16(a, b), offset));
  }
}

template <int Bits>
inline void decode_codes(const std::uint8_t* codes, std::uint64_t count, float s, float* dense, bool accumulate,
                         bool streaming, bool avx2) noexcept {
  static_assert(Bits == 8 || Bits == 4, "vectorised decoding exists for 8-bit and 4-bit codes");
#  if defined(GRADCOMP_HAVE_AVX2)
  if (avx2) return kernel_detail::decode_avx2<Bits>(codes, count, s, dense, accumulate, streaming);
#  endif
  (void)avx2;
  kernel_detail::for_each_values4_sse2<Bits>(codes, count, s, [&](std::uint64_t j, __m128 value) {
    if (accumulate) value = _mm_add_ps(_mm_loadu_ps(dense + j), value);
    kernel_detail::store4(dense + j, value, streaming);
  });
}

template <int Bits>
inline void residual_of_codes(const std::uint8_t* codes, std::uint64_t count, float s, const float* x, float* residual,
                              bool streaming, bool avx2) noexcept {
  static_assert(Bits == 8 || Bits == 4, "vectorised residuals exist for 8-bit and 4-bit codes");
#  if defined(GRADCOMP_HAVE_AVX2)
  if (avx2) {
    if (streaming) return kernel_detail::residual_of_codes_avx2<Bits, true>(codes, count, s, x, residual);
    return kernel_detail::residual_of_codes_avx2<Bits, false>(codes, count, s, x, residual);
  }
#  endif
  (void)avx2;
  kernel_detail::for_each_values4_sse2<Bits>(codes, count, s, [&](std::uint64_t j, __m128 value) {
    kernel_detail::store4(residual + j, _mm_sub_ps(_mm_loadu_ps(x + j), value), streaming);
  });
}

inline void encode8_rtn_residual(const float* x, std::uint64_t count, float inv, float s, std::uint8_t* codes,
                                 float* residual, bool streaming, bool avx2) noexcept {
#  if defined(GRADCOMP_HAVE_AVX2)
  if (avx2) {
    if (streaming) return kernel_detail::encode8_rtn_residual_avx2<true>(x, count, inv, s, codes, residual);
    return kernel_detail::encode8_rtn_residual_avx2<false>(x, count, inv, s, codes, residual);
  }
#  endif
  encode8_rtn(x, count, inv, codes, avx2);
  residual_of_codes<8>(codes, count, s, x, residual, streaming, avx2);
}

#endif

template <int Bits>
inline bool any_code_all_ones(const std::uint8_t* codes, std::uint64_t bytes, bool avx2) noexcept {
  static_assert(Bits == 8 || Bits == 4, "the byte-wise test exists for 8-bit and 4-bit codes");
  std::uint64_t b = 0;
  bool found = false;
#if defined(GRADCOMP_HAVE_AVX2)
  if (avx2) {
    b = bytes / 32 * 32;
    found = kernel_detail::any_all_ones_avx2<Bits>(codes, b);
  }
#endif
  (void)avx2;
#if defined(__SSE2__)
  const __m128i low = _mm_set1_epi8(static_cast<char>(Bits == 8 ? 0xff : 0x0f));
  const __m128i high = _mm_set1_epi8(static_cast<char>(Bits == 8 ? 0xff : 0xf0));
  __m128i any = _mm_setzero_si128();
  for (; bytes - b >= 16; b += 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + b));
    any = _mm_or_si128(any, _mm_cmpeq_epi8(_mm_and_si128(v, low), low));
    if constexpr (Bits == 4) any = _mm_or_si128(any, _mm_cmpeq_epi8(_mm_and_si128(v, high), high));
  }
  found = found || _mm_movemask_epi8(any) != 0;
#endif
  for (; b < bytes; ++b) {
    const unsigned x = codes[b];
    found = found || (Bits == 8 ? x == 0xffu : ((x & 0x0fu) == 0x0fu || (x & 0xf0u) == 0xf0u));
  }
  return found;
}

}  // namespace gradcomp::detail::cpu
