#pragma once
/// @file
/// Many consecutive blocks of a random_stream at once on the CPU: the words are exactly those of
/// random_stream::block (philox4x32_10), computed with SSE2 for eight counters at a time, AVX2 for
/// sixteen or AVX-512F for thirty-two where available, with a scalar twin otherwise.
///
/// SSE2 layout: each vector holds two counters, one per 64-bit slot, with the 32-bit word in the
/// low half of the slot. _mm_mul_epu32 multiplies exactly those low halves into the full 64-bit
/// product, so after a round the new c1 and c3 (the low product words) are the products themselves
/// (their high halves are ignored by every later use), and the new c0 and c2 need one shift.

#include <cstdint>
#include <cstring>

#include <gradcomp/core/philox.hpp>

#include <gradcomp/core/cpu_executor.hpp>

#if defined(__SSE2__) || defined(GRADCOMP_HAVE_AVX2)
#  include <immintrin.h>
#endif

namespace gradcomp::detail {

#if defined(__SSE2__)
/// The four counter words of two (SSE2) blocks, one per 64-bit slot.
struct philox_lanes_sse2 {
  __m128i c0, c1, c2, c3;
};

/// One Philox round of two blocks with round keys k0, k1.
inline void philox_round(philox_lanes_sse2& x, __m128i k0, __m128i k1) noexcept {
  const __m128i product0 = _mm_mul_epu32(x.c0, _mm_set1_epi32(static_cast<int>(0xD2511F53u)));  // hi0:lo0
  const __m128i product1 = _mm_mul_epu32(x.c2, _mm_set1_epi32(static_cast<int>(0xCD9E8D57u)));  // hi1:lo1
  x.c0 = _mm_xor_si128(_mm_xor_si128(_mm_shuffle_epi32(product1, 0xF5), x.c1), k0);
  x.c2 = _mm_xor_si128(_mm_xor_si128(_mm_shuffle_epi32(product0, 0xF5), x.c3), k1);
  x.c1 = product1;
  x.c3 = product0;
}

/// Stores the words of the two blocks: slot 0 first, then slot 1.
inline void philox_store(const philox_lanes_sse2& x, std::uint32_t* out) noexcept {
  const __m128i w01 = _mm_unpacklo_epi32(x.c0, x.c1);   // b0.w0 b0.w1 x x
  const __m128i w01h = _mm_unpackhi_epi32(x.c0, x.c1);  // b1.w0 b1.w1 x x
  const __m128i w23 = _mm_unpacklo_epi32(x.c2, x.c3);
  const __m128i w23h = _mm_unpackhi_epi32(x.c2, x.c3);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_unpacklo_epi64(w01, w23));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 4), _mm_unpacklo_epi64(w01h, w23h));
}

/// Blocks [first, first + count), count a multiple of 4, whose counters share word 1.
inline void philox_blocks_sse2(const random_stream& stream, std::uint64_t first, std::uint64_t count,
                               std::uint32_t* words) noexcept {
  const __m128i c1 = _mm_set1_epi32(static_cast<int>(stream.counter1(first)));
  const __m128i c2 = _mm_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(stream.step)));
  const __m128i c3 = _mm_set1_epi32(static_cast<int>(stream.tensor_id));
  const __m128i slots = _mm_set_epi32(0, 1, 0, 0);
  for (std::uint64_t k = 0; k < count; k += 4) {
    const __m128i base = _mm_add_epi32(_mm_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(first + k))), slots);
    philox_lanes_sse2 a{base, c1, c2, c3};
    philox_lanes_sse2 b{_mm_add_epi32(base, _mm_set_epi32(0, 2, 0, 2)), c1, c2, c3};
    std::uint32_t k0 = stream.key0(), k1 = stream.key1();
    for (int r = 0; r < 10; ++r, k0 += 0x9E3779B9u, k1 += 0xBB67AE85u) {
      const __m128i key0 = _mm_set1_epi32(static_cast<int>(k0));
      const __m128i key1 = _mm_set1_epi32(static_cast<int>(k1));
      philox_round(a, key0, key1);
      philox_round(b, key0, key1);
    }
    philox_store(a, words + 4 * k);
    philox_store(b, words + 4 * k + 8);
  }
}
#endif

#if defined(GRADCOMP_HAVE_AVX2)
/// The four counter words of four (AVX2) blocks, one per 64-bit slot.
struct philox_lanes_avx2 {
  __m256i c0, c1, c2, c3;
};

/// One Philox round of four blocks with round keys k0, k1.
GRADCOMP_TARGET_AVX2 inline void philox_round(philox_lanes_avx2& x, __m256i k0, __m256i k1) noexcept {
  const __m256i product0 = _mm256_mul_epu32(x.c0, _mm256_set1_epi32(static_cast<int>(0xD2511F53u)));
  const __m256i product1 = _mm256_mul_epu32(x.c2, _mm256_set1_epi32(static_cast<int>(0xCD9E8D57u)));
  x.c0 = _mm256_xor_si256(_mm256_xor_si256(_mm256_shuffle_epi32(product1, 0xF5), x.c1), k0);
  x.c2 = _mm256_xor_si256(_mm256_xor_si256(_mm256_shuffle_epi32(product0, 0xF5), x.c3), k1);
  x.c1 = product1;
  x.c3 = product0;
}

/// Stores the words of the four blocks in slot order.
GRADCOMP_TARGET_AVX2 inline void philox_store(const philox_lanes_avx2& x, std::uint32_t* out) noexcept {
  // Per 128-bit lane as in the SSE2 layout: lane 0 holds slots 0, 1 and lane 1 slots 2, 3.
  const __m256i w01 = _mm256_unpacklo_epi32(x.c0, x.c1);
  const __m256i w01h = _mm256_unpackhi_epi32(x.c0, x.c1);
  const __m256i w23 = _mm256_unpacklo_epi32(x.c2, x.c3);
  const __m256i w23h = _mm256_unpackhi_epi32(x.c2, x.c3);
  const __m256i even = _mm256_unpacklo_epi64(w01, w23);   // slots 0 and 2
  const __m256i odd = _mm256_unpacklo_epi64(w01h, w23h);  // slots 1 and 3
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_permute2x128_si256(even, odd, 0x20));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 8), _mm256_permute2x128_si256(even, odd, 0x31));
}

/// Blocks [first, first + count), count a multiple of 16, whose counters share word 1.
GRADCOMP_TARGET_AVX2 inline void philox_blocks_avx2(const random_stream& stream, std::uint64_t first,
                                                    std::uint64_t count, std::uint32_t* words) noexcept {
  const __m256i c1 = _mm256_set1_epi32(static_cast<int>(stream.counter1(first)));
  const __m256i c2 = _mm256_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(stream.step)));
  const __m256i c3 = _mm256_set1_epi32(static_cast<int>(stream.tensor_id));
  const __m256i slots = _mm256_setr_epi32(0, 0, 1, 0, 2, 0, 3, 0);
  for (std::uint64_t k = 0; k < count; k += 16) {
    const __m256i base =
        _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(first + k))), slots);
    const __m256i four = _mm256_setr_epi32(4, 0, 4, 0, 4, 0, 4, 0);
    philox_lanes_avx2 a{base, c1, c2, c3};
    philox_lanes_avx2 b{_mm256_add_epi32(a.c0, four), c1, c2, c3};
    philox_lanes_avx2 c{_mm256_add_epi32(b.c0, four), c1, c2, c3};
    philox_lanes_avx2 d{_mm256_add_epi32(c.c0, four), c1, c2, c3};
    std::uint32_t k0 = stream.key0(), k1 = stream.key1();
    for (int r = 0; r < 10; ++r, k0 += 0x9E3779B9u, k1 += 0xBB67AE85u) {
      const __m256i key0 = _mm256_set1_epi32(static_cast<int>(k0));
      const __m256i key1 = _mm256_set1_epi32(static_cast<int>(k1));
      philox_round(a, key0, key1);
      philox_round(b, key0, key1);
      philox_round(c, key0, key1);
      philox_round(d, key0, key1);
    }
    philox_store(a, words + 4 * k);
    philox_store(b, words + 4 * k + 16);
    philox_store(c, words + 4 * k + 32);
    philox_store(d, words + 4 * k + 48);
  }
}
#endif

#if defined(GRADCOMP_HAVE_AVX2)
/// The four counter words of eight (AVX-512) blocks, one per 64-bit slot.
struct philox_lanes_avx512 {
  __m512i c0, c1, c2, c3;
};

// The AVX-512 kernels use the zero-masked forms (all lanes selected) of the multiply, shuffle and
// unpack intrinsics: same results, but GCC 12's unmasked forms start from an "undefined" register
// that -Wmaybe-uninitialized reports.

/// One Philox round of eight blocks with round keys k0, k1.
GRADCOMP_TARGET_AVX512 inline void philox_round(philox_lanes_avx512& x, __m512i k0, __m512i k1) noexcept {
  constexpr auto all_words = static_cast<__mmask16>(0xFFFF);
  constexpr auto all_slots = static_cast<__mmask8>(0xFF);
  constexpr auto high_to_low = static_cast<_MM_PERM_ENUM>(0xF5);
  const __m512i product0 = _mm512_maskz_mul_epu32(all_slots, x.c0, _mm512_set1_epi32(static_cast<int>(0xD2511F53u)));
  const __m512i product1 = _mm512_maskz_mul_epu32(all_slots, x.c2, _mm512_set1_epi32(static_cast<int>(0xCD9E8D57u)));
  x.c0 = _mm512_xor_si512(_mm512_xor_si512(_mm512_maskz_shuffle_epi32(all_words, product1, high_to_low), x.c1), k0);
  x.c2 = _mm512_xor_si512(_mm512_xor_si512(_mm512_maskz_shuffle_epi32(all_words, product0, high_to_low), x.c3), k1);
  x.c1 = product1;
  x.c3 = product0;
}

/// Stores the words of the eight blocks in slot order.
GRADCOMP_TARGET_AVX512 inline void philox_store(const philox_lanes_avx512& x, std::uint32_t* out) noexcept {
  // Per 128-bit lane L as in the SSE2 layout: `even` holds block 2L, `odd` block 2L + 1.
  constexpr auto all_words = static_cast<__mmask16>(0xFFFF);
  constexpr auto all_slots = static_cast<__mmask8>(0xFF);
  const __m512i w01 = _mm512_maskz_unpacklo_epi32(all_words, x.c0, x.c1);
  const __m512i w01h = _mm512_maskz_unpackhi_epi32(all_words, x.c0, x.c1);
  const __m512i w23 = _mm512_maskz_unpacklo_epi32(all_words, x.c2, x.c3);
  const __m512i w23h = _mm512_maskz_unpackhi_epi32(all_words, x.c2, x.c3);
  const __m512i even = _mm512_maskz_unpacklo_epi64(all_slots, w01, w23);
  const __m512i odd = _mm512_maskz_unpacklo_epi64(all_slots, w01h, w23h);
  const __m512i first = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
  const __m512i second = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  _mm512_storeu_si512(out, _mm512_permutex2var_epi64(even, first, odd));
  _mm512_storeu_si512(out + 16, _mm512_permutex2var_epi64(even, second, odd));
}

/// Blocks [first, first + count), count a multiple of 32, whose counters share word 1.
GRADCOMP_TARGET_AVX512 inline void philox_blocks_avx512(const random_stream& stream, std::uint64_t first,
                                                        std::uint64_t count, std::uint32_t* words) noexcept {
  const __m512i c1 = _mm512_set1_epi32(static_cast<int>(stream.counter1(first)));
  const __m512i c2 = _mm512_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(stream.step)));
  const __m512i c3 = _mm512_set1_epi32(static_cast<int>(stream.tensor_id));
  const __m512i slots = _mm512_setr_epi32(0, 0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0, 7, 0);
  const __m512i eight = _mm512_setr_epi32(8, 0, 8, 0, 8, 0, 8, 0, 8, 0, 8, 0, 8, 0, 8, 0);
  for (std::uint64_t k = 0; k < count; k += 32) {
    const __m512i base =
        _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(first + k))), slots);
    philox_lanes_avx512 a{base, c1, c2, c3};
    philox_lanes_avx512 b{_mm512_add_epi32(a.c0, eight), c1, c2, c3};
    philox_lanes_avx512 c{_mm512_add_epi32(b.c0, eight), c1, c2, c3};
    philox_lanes_avx512 d{_mm512_add_epi32(c.c0, eight), c1, c2, c3};
    std::uint32_t k0 = stream.key0(), k1 = stream.key1();
    for (int r = 0; r < 10; ++r, k0 += 0x9E3779B9u, k1 += 0xBB67AE85u) {
      const __m512i key0 = _mm512_set1_epi32(static_cast<int>(k0));
      const __m512i key1 = _mm512_set1_epi32(static_cast<int>(k1));
      philox_round(a, key0, key1);
      philox_round(b, key0, key1);
      philox_round(c, key0, key1);
      philox_round(d, key0, key1);
    }
    philox_store(a, words + 4 * k);
    philox_store(b, words + 4 * k + 32);
    philox_store(c, words + 4 * k + 64);
    philox_store(d, words + 4 * k + 96);
  }
}
#endif

/// Writes the 4·count words of blocks [first_block, first_block + count) of `stream` to `words`
/// (word 4k + w is word w of block first_block + k), with the widest kernel `simd` allows (the
/// caller has checked that the CPU has it).
inline void philox_stream_words(const random_stream& stream, std::uint64_t first_block, std::uint64_t count,
                                std::uint32_t* words, cpu_simd simd = cpu_simd::baseline) noexcept {
  std::uint64_t k = 0;
  // The vector kernels hold counter word 1 fixed: true unless the run crosses a multiple of 2^32.
  const bool shared_high = count == 0 || (first_block >> 32) == ((first_block + count - 1) >> 32);
#if defined(GRADCOMP_HAVE_AVX2)
  if (simd >= cpu_simd::avx512 && shared_high) {
    k = count - count % 32;
    philox_blocks_avx512(stream, first_block, k, words);
  }
  if (simd == cpu_simd::avx2 && shared_high) {
    k = count - count % 16;
    philox_blocks_avx2(stream, first_block, k, words);
  }
#endif
  (void)simd;
#if defined(__SSE2__)
  if (k == 0 && shared_high) {
    k = count - count % 4;
    philox_blocks_sse2(stream, first_block, k, words);
  }
#endif
  (void)shared_high;
  for (std::uint32_t* out = words + 4 * k; k < count; ++k, out += 4) {
    const philox_block b = stream.block(first_block + k);
    std::memcpy(out, b.word, sizeof b.word);
  }
}

/// Extra halves a `philox_stream_halves` buffer holds beyond the count asked for.
inline constexpr std::uint64_t philox_halves_slack = 16;

/// The 16-bit halves [first, first + count) of `stream` (half i is half i mod 2 of word i/2, the low
/// half first), computed whole Philox blocks at a time into `buffer`, which holds count +
/// philox_halves_slack halves and is 4-byte aligned; returns where half `first` lies in it.
inline const std::uint16_t* philox_stream_halves(const random_stream& stream, std::uint64_t first, std::uint64_t count,
                                                 std::uint16_t* buffer, cpu_simd simd = cpu_simd::baseline) noexcept {
  const std::uint64_t first_block = first / 8;
  const std::uint64_t end_block = (first + count + 7) / 8;
  philox_stream_words(stream, first_block, end_block - first_block, reinterpret_cast<std::uint32_t*>(buffer), simd);
  return buffer + first % 8;
}

}  // namespace gradcomp::detail
