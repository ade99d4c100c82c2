#pragma once
/// @file
/// MurmurHash3_x86_32 of runs of consecutive 32-bit keys on the CPU: the scalar reference
/// (core/murmur3.hpp) and an AVX2 twin that hashes eight keys at once with the same integer
/// arithmetic, so both write the same words.

#include <cstddef>
#include <cstdint>

#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/murmur3.hpp>

#if defined(GRADCOMP_HAVE_AVX2)
#  include <immintrin.h>
#endif

namespace gradcomp::detail::cpu {

namespace murmur3_detail {

#if defined(GRADCOMP_HAVE_AVX2)
GRADCOMP_TARGET_AVX2 inline __m256i rotate_left(__m256i x, int r) noexcept {
  return _mm256_or_si256(_mm256_slli_epi32(x, r), _mm256_srli_epi32(x, 32 - r));
}

/// murmur3_32 of eight keys with one seed.
GRADCOMP_TARGET_AVX2 inline __m256i hash8(__m256i key, __m256i seed) noexcept {
  __m256i k = _mm256_mullo_epi32(key, _mm256_set1_epi32(static_cast<int>(0xcc9e2d51u)));
  k = rotate_left(k, 15);
  k = _mm256_mullo_epi32(k, _mm256_set1_epi32(0x1b873593));
  __m256i h = rotate_left(_mm256_xor_si256(seed, k), 13);
  h = _mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32(h, 2), h), _mm256_set1_epi32(static_cast<int>(0xe6546b64u)));
  h = _mm256_xor_si256(h, _mm256_set1_epi32(4));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(0x85ebca6bu)));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(0xc2b2ae35u)));
  return _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
}

/// The whole groups of eight of a run; returns how many keys it hashed.
GRADCOMP_TARGET_AVX2 inline std::size_t hash_run_avx2(std::uint32_t first, std::size_t count, std::uint32_t seed,
                                                      std::uint32_t* out) noexcept {
  const __m256i seeds = _mm256_set1_epi32(static_cast<int>(seed));
  const __m256i eight = _mm256_set1_epi32(8);
  __m256i key = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(first)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  std::size_t m = 0;
  for (; m + 8 <= count; m += 8) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + m), hash8(key, seeds));
    key = _mm256_add_epi32(key, eight);
  }
  return m;
}
#endif

}  // namespace murmur3_detail

/// out[m] = murmur3_32(first + m, seed) for m < count; the keys must not wrap (first + count ≤ 2^32).
/// With `avx2` (the caller checked `cpu_executor::avx2()`) eight keys are hashed at a time.
inline void murmur3_32_run(std::uint32_t first, std::size_t count, std::uint32_t seed, std::uint32_t* out,
                           bool avx2) noexcept {
  std::size_t m = 0;
#if defined(GRADCOMP_HAVE_AVX2)
  if (avx2) m = murmur3_detail::hash_run_avx2(first, count, seed, out);
#endif
  (void)avx2;
  for (; m < count; ++m) out[m] = murmur3_32(first + static_cast<std::uint32_t>(m), seed);
}

}  // namespace gradcomp::detail::cpu
