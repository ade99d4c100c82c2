#pragma once
/// @file
/// The 16-bit floating-point value types gradcomp takes as gradients: `bf16` (bfloat16: 1 sign, 8
/// exponent and 7 mantissa bits, float32's range) and `fp16` (IEEE-754 binary16: 1, 5 and 10 bits,
/// largest finite 65504), with exact widening to float32 and round-to-nearest-even narrowing from
/// it (docs/half-precision.md §1).
///
/// Both are a 16-bit pattern and nothing else: trivially copyable, standard layout, 2 bytes,
/// aligned to 2, so a buffer of `__nv_bfloat16` / `__half`, of PyTorch's `at::BFloat16` / `at::Half`
/// or of C++23's `std::bfloat16_t` / `std::float16_t` is viewed as one of these by a pointer cast
/// (the same bits). Every conversion is integer arithmetic on the bit pattern, so it gives the same
/// bits on every compiler, flag set (-O levels, -march, FMA contraction) and on the device, and
/// is `constexpr`.
///
/// Narrowing rounds to nearest, ties to even (IEEE's default, as `__float2bfloat16_rn`,
/// `__float2half_rn` and F16C's `vcvtps2ph` with rounding mode 0 do); a finite float32 beyond the
/// type's largest finite value plus half an ulp becomes ±Inf (callers that must not produce Inf
/// check with `narrows_finite`); NaN stays NaN (quiet, its sign and top payload bits kept);
/// fp16 results below its normal range are subnormal or ±0, rounded the same way.

#include <cstdint>
#include <type_traits>

#include <gradcomp/core/config.hpp>

namespace gradcomp {

/// bfloat16: the upper 16 bits of a float32 (1 sign, 8 exponent, 7 mantissa bits).
struct bf16 {
  std::uint16_t bits;  ///< The bit pattern.
};

/// IEEE-754 binary16 (1 sign, 5 exponent, 10 mantissa bits; largest finite 65504).
struct fp16 {
  std::uint16_t bits;  ///< The bit pattern.
};

static_assert(sizeof(bf16) == 2 && alignof(bf16) == 2 && sizeof(fp16) == 2 && alignof(fp16) == 2,
              "the 16-bit value types are bare 16-bit patterns");

namespace detail {

/// The bits of a float32, in constant expressions and device code alike.
GRADCOMP_HOST_DEVICE constexpr std::uint32_t float_bits_of(float x) noexcept {
  return __builtin_bit_cast(std::uint32_t, x);
}

/// The float32 of a bit pattern.
GRADCOMP_HOST_DEVICE constexpr float float_of_bits(std::uint32_t u) noexcept { return __builtin_bit_cast(float, u); }

}  // namespace detail

/// The float32 of a bf16, exactly (its bits are the float32's upper half).
GRADCOMP_HOST_DEVICE constexpr float widen(bf16 x) noexcept {
  return detail::float_of_bits(static_cast<std::uint32_t>(x.bits) << 16);
}

/// The float32 of an fp16, exactly (subnormals included; NaN stays NaN with its payload).
GRADCOMP_HOST_DEVICE constexpr float widen(fp16 x) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(x.bits & 0x8000u) << 16;
  const std::uint32_t exponent = (x.bits >> 10) & 0x1fu;
  const std::uint32_t mantissa = x.bits & 0x3ffu;
  if (exponent == 0x1fu) return detail::float_of_bits(sign | 0x7f800000u | mantissa << 13);  // ±Inf, NaN
  if (exponent != 0) return detail::float_of_bits(sign | (exponent + 112u) << 23 | mantissa << 13);
  // ±0 and subnormals m·2^-24: the integer m converted and scaled by a power of two, both exact
  // (the operands and the result are normal floats, so flush-to-zero modes do not touch them).
  const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
  return detail::float_of_bits(sign | detail::float_bits_of(magnitude));
}

/// float and double widen to themselves, so generic code can write `widen(x)` for any gradient.
GRADCOMP_HOST_DEVICE constexpr float widen(float x) noexcept { return x; }
/// float and double widen to themselves.
GRADCOMP_HOST_DEVICE constexpr double widen(double x) noexcept { return x; }

namespace detail {

/// bf16 bits of a float32, rounded to nearest even.
GRADCOMP_HOST_DEVICE constexpr std::uint16_t bf16_bits_rn(float x) noexcept {
  const std::uint32_t u = float_bits_of(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>(u >> 16 | 0x0040u);  // NaN, quieted
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/// fp16 bits of a float32, rounded to nearest even.
GRADCOMP_HOST_DEVICE constexpr std::uint16_t fp16_bits_rn(float x) noexcept {
  const std::uint32_t u = float_bits_of(x);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | (a >> 13 & 0x3ffu));  // NaN, quieted
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // ≥ 65520 (or Inf): ±Inf
  if (a >= 0x38800000u) {  // normal: rebias the exponent (127 → 15), round away 13 mantissa bits
    const std::uint32_t r = a - 0x38000000u;
    return static_cast<std::uint16_t>(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
  }
  if (a <= 0x33000000u) return sign;  // at most 2^-25, half the smallest subnormal: ±0 (the tie is even)
  // Subnormal result: the float32 is m·2^(e − 150) with m the 24-bit significand; in units of
  // 2^-24 it is m·2^(e − 126), e ≤ 112, so shift m right by 126 − e (14 to 24) with rounding.
  const std::uint32_t m = (a & 0x7fffffu) | 0x800000u;
  const std::uint32_t shift = 126u - (a >> 23);
  const std::uint32_t kept = m >> shift;
  const std::uint32_t rest = m & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1);
  const bool up = rest > half || (rest == half && (kept & 1u) != 0);
  return static_cast<std::uint16_t>(sign | (kept + (up ? 1u : 0u)));  // a carry gives 0x0400, the smallest normal
}

}  // namespace detail

/// A 16-bit value type from a float32, rounded to nearest even (`narrow<bf16>(x)`, `narrow<fp16>(x)`);
/// float narrows to itself.
template <class T>
GRADCOMP_HOST_DEVICE constexpr T narrow(float x) noexcept {
  static_assert(std::is_same_v<T, bf16> || std::is_same_v<T, fp16> || std::is_same_v<T, float>,
                "narrow<T> makes a bf16, an fp16 or a float");
  if constexpr (std::is_same_v<T, bf16>) return bf16{detail::bf16_bits_rn(x)};
  else if constexpr (std::is_same_v<T, fp16>)
    return fp16{detail::fp16_bits_rn(x)};
  else
    return x;
}

/// The 16-bit value whose widening is bit for bit the float32 `x`, when there is one
/// (`narrows_exactly<T>(x)`): every finite value, ±Inf and NaN of T, a NaN's payload and quiet bit
/// included, comes back from `widen` unchanged. A lossless codec's decoder gives back a 16-bit
/// gradient this way. For any other x the result is unspecified; float gives x itself.
template <class T>
GRADCOMP_HOST_DEVICE constexpr T exact_narrow(float x) noexcept {
  static_assert(std::is_same_v<T, bf16> || std::is_same_v<T, fp16> || std::is_same_v<T, float>,
                "exact_narrow<T> makes a bf16, an fp16 or a float");
  const std::uint32_t u = detail::float_bits_of(x);
  if constexpr (std::is_same_v<T, bf16>) {
    return bf16{static_cast<std::uint16_t>(u >> 16)};
  } else if constexpr (std::is_same_v<T, fp16>) {
    if ((u & 0x7fffffffu) > 0x7f800000u)  // NaN: the payload's top 10 bits as they are, not quieted
      return fp16{static_cast<std::uint16_t>(((u >> 16) & 0x8000u) | 0x7c00u | ((u >> 13) & 0x3ffu))};
    return fp16{detail::fp16_bits_rn(x)};
  } else {
    return x;
  }
}

/// Whether the float32 `x` is, bit for bit, the widening of a T (always for float).
template <class T>
GRADCOMP_HOST_DEVICE constexpr bool narrows_exactly(float x) noexcept {
  return detail::float_bits_of(widen(exact_narrow<T>(x))) == detail::float_bits_of(x);
}

/// Whether a finite float32 stays finite when narrowed to T (for fp16: |x| < 65520; for bf16:
/// below float32's largest finite value's rounding threshold; always for float).
template <class T>
GRADCOMP_HOST_DEVICE constexpr bool narrows_finite(float x) noexcept {
  if constexpr (std::is_same_v<T, bf16>) return (detail::bf16_bits_rn(x) & 0x7fffu) < 0x7f80u;
  else if constexpr (std::is_same_v<T, fp16>)
    return (detail::fp16_bits_rn(x) & 0x7fffu) < 0x7c00u;
  else
    return true;
}

}  // namespace gradcomp
