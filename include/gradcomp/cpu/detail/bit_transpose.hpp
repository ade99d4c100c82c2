#pragma once
/// @file
/// Transpose of a 32×32 bit matrix held as 32 words: afterwards bit i of word L is what bit L of
/// word i was. A baseline version (the five-stage butterfly of Hacker's Delight §7-3, portable)
/// and an AVX2 twin (byte gather and `vpmovmskb`), which write the same bits. The transpose is its
/// own inverse.

#include <cstdint>

#include <gradcomp/core/cpu_executor.hpp>

#if defined(GRADCOMP_HAVE_AVX2)
#  include <immintrin.h>
#endif

namespace gradcomp::detail::cpu {

/// Transposes the 32×32 bit matrix `m[0..32)` in place (row i = word i, column L = bit L).
inline void transpose32(std::uint32_t* m, bool avx2) noexcept;

namespace transpose_detail {

/// Butterfly stage J (16, 8, 4, 2, 1): swaps bit J of the row index with bit J of the column
/// index, i.e. the high J-bit half of each word k whose index has bit J clear with the low half of
/// word k + J (`Mask` selects the low halves).
template <unsigned J, std::uint32_t Mask>
inline void transpose_stage(std::uint32_t* m) noexcept {
  for (unsigned k0 = 0; k0 < 32; k0 += 2 * J) {
    for (unsigned k = k0; k < k0 + J; ++k) {
      const std::uint32_t t = ((m[k] >> J) ^ m[k + J]) & Mask;
      m[k + J] ^= t;
      m[k] ^= t << J;
    }
  }
}

/// The five stages commute; together they swap row and column (Hacker's Delight §7-3).
inline void transpose32_baseline(std::uint32_t* m) noexcept {
  transpose_stage<16, 0x0000FFFFu>(m);
  transpose_stage<8, 0x00FF00FFu>(m);
  transpose_stage<4, 0x0F0F0F0Fu>(m);
  transpose_stage<2, 0x33333333u>(m);
  transpose_stage<1, 0x55555555u>(m);
}

#if defined(GRADCOMP_HAVE_AVX2)
/// Gathers byte k of the 32 words into one register (byte i = byte k of word i), then reads
/// bit 7 − s of every byte with `vpmovmskb` after s byte-wise doublings: that mask is word 8k + 7 − s.
GRADCOMP_TARGET_AVX2 inline void transpose32_avx2(std::uint32_t* m) noexcept {
  // Within each 128-bit lane: dword e = byte e of the lane's four words.
  const __m256i bytes = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,  //
                                         0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  // Qword k = (byte k of words 0..3, byte k of words 4..7).
  const __m256i pairs = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  __m256i p[4];
  for (int r = 0; r < 4; ++r)
    p[r] = _mm256_permutevar8x32_epi32(
        _mm256_shuffle_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(m + 8 * r)), bytes), pairs);
  const __m256i t0 = _mm256_unpacklo_epi64(p[0], p[1]), t1 = _mm256_unpackhi_epi64(p[0], p[1]);
  const __m256i t2 = _mm256_unpacklo_epi64(p[2], p[3]), t3 = _mm256_unpackhi_epi64(p[2], p[3]);
  __m256i v[4] = {_mm256_permute2x128_si256(t0, t2, 0x20), _mm256_permute2x128_si256(t1, t3, 0x20),
                  _mm256_permute2x128_si256(t0, t2, 0x31), _mm256_permute2x128_si256(t1, t3, 0x31)};
  for (int k = 0; k < 4; ++k) {
    for (int s = 0; s < 8; ++s) {
      m[8 * k + 7 - s] = static_cast<std::uint32_t>(_mm256_movemask_epi8(v[k]));
      v[k] = _mm256_add_epi8(v[k], v[k]);
    }
  }
}
#endif

}  // namespace transpose_detail

inline void transpose32(std::uint32_t* m, bool avx2) noexcept {
#if defined(GRADCOMP_HAVE_AVX2)
  if (avx2) {
    transpose_detail::transpose32_avx2(m);
    return;
  }
#endif
  (void)avx2;
  transpose_detail::transpose32_baseline(m);
}

}  // namespace gradcomp::detail::cpu
