#pragma once
/// @file
/// Many consecutive blocks of a random_stream at once on the CPU: the words are exactly those of
/// random_stream::block (philox4x32_10), computed with SSE2 for eight counters at a time where
/// available, with a scalar twin otherwise.
///
/// SSE2 layout: each vector holds two counters, one per 64-bit slot, with the 32-bit word in the
/// low half of the slot. _mm_mul_epu32 multiplies exactly those low halves into the full 64-bit
/// product, so after a round the new c1 and c3 (the low product words) are the products themselves
/// (their high halves are ignored by every later use), and the new c0 and c2 need one shift.

#include <cstdint>
#include <cstring>

#include <gradcomp/core/philox.hpp>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace gradcomp::detail {

/// Writes the 4·count words of blocks [first_block, first_block + count) of `stream` to `words`
/// (word 4k + w is word w of block first_block + k).
inline void philox_stream_words(const random_stream& stream, std::uint64_t first_block, std::uint64_t count,
                                std::uint32_t* words) noexcept {
  std::uint64_t k = 0;
#if defined(__SSE2__)
  constexpr int groups = 4;  // vectors of two counters processed together (eight blocks)
  const auto key0 = static_cast<std::uint32_t>(stream.seed);
  const auto key1 = static_cast<std::uint32_t>(stream.seed >> 32) ^ static_cast<std::uint32_t>(stream.step >> 32);
  __m128i round_key0[10];
  __m128i round_key1[10];
  for (int r = 0; r < 10; ++r) {
    round_key0[r] = _mm_set1_epi32(static_cast<int>(key0 + static_cast<std::uint32_t>(r) * 0x9E3779B9u));
    round_key1[r] = _mm_set1_epi32(static_cast<int>(key1 + static_cast<std::uint32_t>(r) * 0xBB67AE85u));
  }
  const __m128i multiplier0 = _mm_set1_epi32(static_cast<int>(0xD2511F53u));
  const __m128i multiplier1 = _mm_set1_epi32(static_cast<int>(0xCD9E8D57u));
  const auto purpose = std::uint32_t{static_cast<std::uint8_t>(stream.purpose)} << 24;
  const __m128i c2_init = _mm_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(stream.step)));
  const __m128i c3_init = _mm_set1_epi32(static_cast<int>(stream.tensor_id));
  for (; k + 2 * groups <= count; k += 2 * groups) {
    __m128i c0[groups], c1[groups], c2[groups], c3[groups];
    for (int g = 0; g < groups; ++g) {
      const std::uint64_t b0 = first_block + k + 2 * static_cast<std::uint64_t>(g);
      const std::uint64_t b1 = b0 + 1;
      c0[g] = _mm_set_epi32(0, static_cast<int>(static_cast<std::uint32_t>(b1)), 0,
                            static_cast<int>(static_cast<std::uint32_t>(b0)));
      c1[g] = _mm_set_epi32(0, static_cast<int>((static_cast<std::uint32_t>(b1 >> 32) & 0x00ffffffu) | purpose), 0,
                            static_cast<int>((static_cast<std::uint32_t>(b0 >> 32) & 0x00ffffffu) | purpose));
      c2[g] = c2_init;
      c3[g] = c3_init;
    }
    for (int r = 0; r < 10; ++r) {
      for (int g = 0; g < groups; ++g) {
        const __m128i product0 = _mm_mul_epu32(c0[g], multiplier0);  // hi0:lo0 per slot
        const __m128i product1 = _mm_mul_epu32(c2[g], multiplier1);  // hi1:lo1 per slot
        c0[g] = _mm_xor_si128(_mm_xor_si128(_mm_shuffle_epi32(product1, 0xF5), c1[g]), round_key0[r]);
        c2[g] = _mm_xor_si128(_mm_xor_si128(_mm_shuffle_epi32(product0, 0xF5), c3[g]), round_key1[r]);
        c1[g] = product1;
        c3[g] = product0;
      }
    }
    for (int g = 0; g < groups; ++g) {
      // Low halves of slot 0 are block b0's words, of slot 1 block b1's.
      const __m128i w01 = _mm_unpacklo_epi32(c0[g], c1[g]);  // b0.w0 b0.w1 x x
      const __m128i w01h = _mm_unpackhi_epi32(c0[g], c1[g]); // b1.w0 b1.w1 x x
      const __m128i w23 = _mm_unpacklo_epi32(c2[g], c3[g]);
      const __m128i w23h = _mm_unpackhi_epi32(c2[g], c3[g]);
      std::uint32_t* const out = words + 4 * (k + 2 * static_cast<std::uint64_t>(g));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_unpacklo_epi64(w01, w23));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 4), _mm_unpacklo_epi64(w01h, w23h));
    }
  }
#endif
  for (std::uint32_t* out = words + 4 * k; k < count; ++k, out += 4) {
    const philox_block b = stream.block(first_block + k);
    std::memcpy(out, b.word, sizeof b.word);
  }
}

}  // namespace gradcomp::detail
