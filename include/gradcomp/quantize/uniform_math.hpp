#pragma once
/// @file
/// The per-value arithmetic of the uniform quantizer, shared by the reference, CPU and CUDA backend
/// so that all produce the same codes bit for bit. Conventions (b = bits, L = levels):
///
///     L = 2^(b−1) − 1 for b ≥ 2, and L = 1 for b = 1 (levels −1 and +1 only)
///     block: m = max|h|, s = m / L (the decoded step; see uniform_step near the largest finite
///     values), inv = L / m
///     t = h · inv, or h / s when inv overflows; every block with s = 0 encodes q = 0 (b ≥ 2)
///     round to nearest even: q = rne(t); stochastic: q = ⌊t + u⌋, u uniform in [0, 1): for
///     element i, u = h·2^-16 with h the 16-bit half i mod 2 (low half first) of word ⌊i/2⌋ of the
///     stream keyed by (seed, step, tensor id, stochastic_rounding)
///     q is clamped to [−L, L]; b = 1 maps t < 0 to −1 and t ≥ 0 to +1 (stochastic: +1 with
///     probability (t + 1)/2); the stored code is q + L (b ≥ 2) or (q + 1)/2 (b = 1)
///     decoded value: q · s

#include <cstdint>

#include <gradcomp/core/config.hpp>
#include <gradcomp/core/float_bits.hpp>

#if defined(__SSE2__) && !defined(__CUDA_ARCH__)
#  include <emmintrin.h>
#endif
#if !defined(__CUDA_ARCH__)
#  include <cmath>
#endif

namespace gradcomp {

/// How a quantizer rounds scaled values to integer levels. Part of the wire parameters.
enum class rounding : std::uint8_t {
  nearest_even = 0,  ///< Deterministic round half to even.
  stochastic = 1,    ///< ⌊t + u⌋ with u from Philox keyed by (seed, step, tensor id, index): unbiased.
};

/// Largest level L of a b-bit symmetric quantizer (b ∈ {1, 2, 4, 8}).
GRADCOMP_HOST_DEVICE constexpr int uniform_levels(int bits) noexcept { return bits == 1 ? 1 : (1 << (bits - 1)) - 1; }

/// Step s of a block whose largest magnitude is m (finite, ≥ 0): m / L, lowered by as many ulps as
/// it takes (one, in practice) for L·s to stay finite when m is near the largest finite value.
template <class T>
GRADCOMP_HOST_DEVICE inline T uniform_step(T m, int bits) noexcept {
  const auto levels = static_cast<T>(uniform_levels(bits));
  T s = m / levels;
  while (!is_finite(s * levels)) s = from_bits<T>(to_bits(s) - 1);
  return s;
}

/// Round half to even of |t| < 2^31, identically on every backend (the x86 conversion uses the
/// default rounding mode, which -ffast-math does not change).
template <class T>
GRADCOMP_HOST_DEVICE inline int round_half_even(T t) noexcept {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == 4) return __float2int_rn(t);
  else
    return __double2int_rn(t);
#elif defined(__SSE2__)
  if constexpr (sizeof(T) == 4) return _mm_cvtss_si32(_mm_set_ss(t));
  else
    return _mm_cvtsd_si32(_mm_set_sd(t));
#else
  return static_cast<int>(std::nearbyint(t));
#endif
}

/// ⌊y⌋ of |y| < 2^31, by truncation and correction (no library call, the same on every backend).
template <class T>
GRADCOMP_HOST_DEVICE inline int floor_to_int(T y) noexcept {
  const int truncated = static_cast<int>(y);
  return static_cast<T>(truncated) > y ? truncated - 1 : truncated;
}

/// Integer level of the scaled value `t` for a b-bit quantizer; `u` ∈ [0, 1) is used only by
/// stochastic rounding.
template <class T>
GRADCOMP_HOST_DEVICE inline int uniform_level(T t, int bits, rounding mode, T u) noexcept {
  const int levels = uniform_levels(bits);
  if (bits == 1) {
    if (mode == rounding::nearest_even) return t < T{0} ? -1 : 1;
    return u < (t + T{1}) * T{0.5} ? 1 : -1;
  }
  int q = mode == rounding::nearest_even ? round_half_even(t) : floor_to_int(t + u);
  q = q > levels ? levels : q;
  return q < -levels ? -levels : q;
}

/// Stored code of level q.
GRADCOMP_HOST_DEVICE constexpr std::uint8_t uniform_code(int q, int bits) noexcept {
  return static_cast<std::uint8_t>(bits == 1 ? (q + 1) / 2 : q + uniform_levels(bits));
}

/// Level of stored code c (the inverse of uniform_code).
GRADCOMP_HOST_DEVICE constexpr int uniform_code_level(std::uint8_t c, int bits) noexcept {
  return bits == 1 ? 2 * int{c} - 1 : int{c} - uniform_levels(bits);
}

}  // namespace gradcomp
