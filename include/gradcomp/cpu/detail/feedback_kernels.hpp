#pragma once
/// @file
/// The float32 element steps of the float32 uniform quantizer's fused error-feedback and LoCo steps
/// on the CPU (cpu/uniform_feedback.hpp), each with an AVX2 kernel and a scalar twin computing the same IEEE
/// operations in the same order (so the same bits as the reference loops): the compensated
/// gradient (with its largest magnitude), error feedback's decay of the new residual, LoCo's
/// moving average of the error and its 8-bit quantization. Products are rounded on their own
/// (`mul_rn`, `rounded`), under any compiler flags. Error feedback's new residual comes with the
/// codes (cpu/detail/uniform_kernels.hpp).
/// LoCo's old errors are dequantized as code·scale; a reset reads them as zero. Each function
/// takes any count: the AVX2 kernel does the whole vectors, the scalar twin the rest.

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <gradcomp/core/cpu_executor.hpp>
#include <gradcomp/core/rounded_product.hpp>
#include <gradcomp/cpu/detail/uniform_kernels.hpp>
#include <gradcomp/quantize/uniform_math.hpp>

#if defined(GRADCOMP_HAVE_AVX2)
#  include <immintrin.h>
#endif

namespace gradcomp::detail::cpu {

namespace kernel_detail {

#if defined(GRADCOMP_HAVE_AVX2)
/// The largest of eight lanes of magnitude keys.
GRADCOMP_TARGET_AVX2 inline std::uint32_t largest_lane(__m256i keys) noexcept {
  alignas(32) std::uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), keys);
  return *std::max_element(lanes, lanes + 8);
}

GRADCOMP_TARGET_AVX2 inline std::uint32_t add_max_avx2(const float* a, const float* b, std::uint64_t count,
                                                       float* sum) noexcept {
  const __m256i mask = _mm256_set1_epi32(0x7fffffff);
  __m256i largest = _mm256_setzero_si256();
  for (std::uint64_t i = 0; i < count; i += 8) {
    const __m256 v = _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));
    _mm256_storeu_ps(sum + i, v);
    largest = _mm256_max_epi32(largest, _mm256_and_si256(_mm256_castps_si256(v), mask));
  }
  return largest_lane(largest);
}

/// code·scale of eight int8 codes (rounded: it feeds a sum).
GRADCOMP_TARGET_AVX2 inline __m256 dequant8_avx2(const std::int8_t* codes, __m256 scale) noexcept {
  const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes)));
  return rounded(_mm256_mul_ps(_mm256_cvtepi32_ps(q), scale));
}

GRADCOMP_TARGET_AVX2 inline void compensate_avx2(const float* g, const std::int8_t* codes, float scale,
                                                 std::uint64_t count, float* h) noexcept {
  const __m256 s = _mm256_set1_ps(scale);
  for (std::uint64_t i = 0; i < count; i += 8)
    _mm256_storeu_ps(h + i, _mm256_add_ps(_mm256_loadu_ps(g + i), dequant8_avx2(codes + i, s)));
}

GRADCOMP_TARGET_AVX2 inline void blend_avx2(const float* h, const std::int8_t* codes, float scale, float beta,
                                            float keep, std::uint64_t count, float* v) noexcept {
  const __m256 s = _mm256_set1_ps(scale);
  const __m256 b = _mm256_set1_ps(beta);
  const __m256 k = _mm256_set1_ps(keep);
  for (std::uint64_t i = 0; i < count; i += 8) {
    const __m256 old = dequant8_avx2(codes + i, s);
    const __m256 fresh = _mm256_sub_ps(_mm256_loadu_ps(h + i), _mm256_loadu_ps(v + i));
    _mm256_storeu_ps(v + i, _mm256_add_ps(rounded(_mm256_mul_ps(b, old)), rounded(_mm256_mul_ps(k, fresh))));
  }
}

GRADCOMP_TARGET_AVX2 inline void quantize_error8_avx2(const float* v, float step, std::uint64_t count,
                                                      std::int8_t* codes) noexcept {
  const __m256 s = _mm256_set1_ps(step);
  for (std::uint64_t i = 0; i < count; i += 32) {
    __m256i q[4];
    for (int k = 0; k < 4; ++k) q[k] = _mm256_cvtps_epi32(_mm256_div_ps(_mm256_loadu_ps(v + i + 8 * k), s));
    // |v/s| ≤ 127·(1 + 2^-23) rounds into [−127, 127]: the saturating packs are exact here.
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i),
                        _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  }
}

GRADCOMP_TARGET_AVX2 inline void scale_avx2(float* x, float factor, std::uint64_t count) noexcept {
  const __m256 f = _mm256_set1_ps(factor);
  for (std::uint64_t i = 0; i < count; i += 8)
    _mm256_storeu_ps(x + i, rounded(_mm256_mul_ps(f, _mm256_loadu_ps(x + i))));
}
#endif

}  // namespace kernel_detail

/// h[i] = g[i] + e[i] for i < count; returns the bits of max |h[i]| (0 when count is 0; at
/// least `float_traits<float>::infinity_key` when some h[i] is NaN or ±Inf).
[[nodiscard]] inline std::uint32_t ef_compensate(const float* g, const float* e, std::uint64_t count, float* h,
                                                 bool avx2) noexcept {
  std::uint64_t i = 0;
  std::uint32_t largest = 0;
#if defined(GRADCOMP_HAVE_AVX2)
  if (avx2) {
    i = count / 8 * 8;
    largest = kernel_detail::add_max_avx2(g, e, i, h);
  }
#endif
  (void)avx2;
  for (; i < count; ++i) {
    h[i] = g[i] + e[i];
    largest = std::max(largest, kernel_detail::magnitude_bits(h[i]));
  }
  return largest;
}

/// r[i] = β·r[i] for i < count, each product rounded on its own: error feedback's decay of the
/// new residual r (as `decayed_residual`, feedback/error_feedback.hpp).
inline void ef_decay(float* r, std::uint64_t count, float beta, bool avx2) noexcept {
  std::uint64_t i = 0;
#if defined(GRADCOMP_HAVE_AVX2)
  if (avx2) {
    i = count / 8 * 8;
    kernel_detail::scale_avx2(r, beta, i);
  }
#endif
  (void)avx2;
  for (; i < count; ++i) r[i] = mul_rn(beta, r[i]);
}

/// h[i] = g[i] + codes[i]·scale for i < count.
inline void loco_compensate(const float* g, const std::int8_t* codes, float scale, std::uint64_t count, float* h,
                            bool avx2) noexcept {
  std::uint64_t i = 0;
#if defined(GRADCOMP_HAVE_AVX2)
  if (avx2) {
    i = count / 8 * 8;
    kernel_detail::compensate_avx2(g, codes, scale, i, h);
  }
#endif
  (void)avx2;
  for (; i < count; ++i) h[i] = g[i] + mul_rn(static_cast<float>(codes[i]), scale);
}

/// v[i] = β·codes[i]·scale + keep·(h[i] − v[i]) for i < count (v holds ĥ).
inline void loco_blend(const float* h, const std::int8_t* codes, float scale, float beta, float keep,
                       std::uint64_t count, float* v, bool avx2) noexcept {
  std::uint64_t i = 0;
#if defined(GRADCOMP_HAVE_AVX2)
  if (avx2) {
    i = count / 8 * 8;
    kernel_detail::blend_avx2(h, codes, scale, beta, keep, i, v);
  }
#endif
  (void)avx2;
  for (; i < count; ++i) v[i] = mul_rn(beta, static_cast<float>(codes[i]) * scale) + mul_rn(keep, h[i] - v[i]);
}

/// codes[i] = clamp(round_half_even(v[i] / step), −127, 127) for i < count (step > 0 and every
/// |v[i]| ≤ 127·step).
inline void loco_quantize_error(const float* v, float step, std::uint64_t count, std::int8_t* codes,
                                bool avx2) noexcept {
  std::uint64_t i = 0;
#if defined(GRADCOMP_HAVE_AVX2)
  if (avx2) {
    i = count / 32 * 32;
    kernel_detail::quantize_error8_avx2(v, step, i, codes);
  }
#endif
  (void)avx2;
  for (; i < count; ++i)
    codes[i] = static_cast<std::int8_t>(uniform_level(v[i] / step, 8, rounding::nearest_even, 0.0f));
}

}  // namespace gradcomp::detail::cpu
