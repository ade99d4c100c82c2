#pragma once
/// @file
/// The per-block and per-value arithmetic of the sign quantizer, shared by the reference, CPU and
/// CUDA backend so that all produce the same bytes. Conventions (block of c values x_0 … x_{c−1}, m
/// = max|x_i|):
///
///     float:  acc = Σ |x_i| in double, left to right in index order (exact terms, rounded sums)
///             scale = float(min(acc / c, m))           (division and min in double)
///     double: E = ilogb(m) (m > 0; scale = 0 when m = 0)
///             acc = Σ ldexp(|x_i|, −E) in double, left to right in index order
///             scale = min(ldexp(acc / c, E), m)
///     bit of x = IEEE sign bit of x (1 for negative values and for −0); a block whose scale is 0
///     stores bit 0 for every value
///     decoded value: +0 when scale = 0, else −scale for bit 1 and +scale for bit 0
///
/// The reduction order is part of the format: a parallel backend must reproduce the sequential
/// left-to-right sum (for instance by one thread per block). The double path scales by 2^−E so that
/// the sum can neither overflow (every term is below 2, c < 2^32) nor lose subnormal inputs; the
/// power-of-two scaling is exact, so on ordinary inputs it equals the plain sum. The clamp to m
/// keeps the rounded mean within the block's magnitudes (and finite).

#include <cstdint>

#include <gradcomp/core/config.hpp>
#include <gradcomp/core/float_bits.hpp>

#if !defined(__CUDA_ARCH__)
#  include <cmath>
#endif

namespace gradcomp {

namespace detail {
/// x·2^e, exactly unless the result over- or underflows.
GRADCOMP_HOST_DEVICE inline double scale_by_pow2(double x, int e) noexcept {
#if defined(__CUDA_ARCH__)
  return ::ldexp(x, e);
#else
  return std::ldexp(x, e);
#endif
}

/// Unbiased binary exponent of a finite x > 0 (subnormals included).
GRADCOMP_HOST_DEVICE inline int binary_exponent(double x) noexcept {
#if defined(__CUDA_ARCH__)
  return ::ilogb(x);
#else
  return std::ilogb(x);
#endif
}

/// Correctly rounded square root.
GRADCOMP_HOST_DEVICE inline double square_root(double x) noexcept {
#if defined(__CUDA_ARCH__)
  return ::sqrt(x);
#else
  return std::sqrt(x);
#endif
}
}  // namespace detail

/// IEEE sign bit of a value: 1 for negative values and −0, 0 otherwise (NaN never reaches here).
template <gradient_value T>
GRADCOMP_HOST_DEVICE inline std::uint8_t sign_bit_of(T value) noexcept {
  return static_cast<std::uint8_t>(to_bits(value) >> (sizeof(T) * 8 - 1));
}

/// A block's sum in double, term by term in index order (the documented order), for backends that
/// see the block's values one at a time. A value enters as `scaled(x)`: a float as it is, a double
/// times 2^−E (E = ilogb of the block's largest magnitude), so that the sum can neither overflow
/// nor lose subnormals.
template <gradient_value T>
struct block_sum {
  /// Whether the terms depend on the block's largest magnitude (double).
  static constexpr bool needs_max = sizeof(T) == 8;

  double acc = 0.0;  ///< The sum so far.
  int exponent = 0;  ///< E (double, m > 0).

  /// An empty sum for a block whose largest magnitude is `max_abs` (unused for float).
  GRADCOMP_HOST_DEVICE explicit block_sum(T max_abs) noexcept {
    if constexpr (needs_max)
      if (max_abs > T{0}) exponent = detail::binary_exponent(max_abs);
  }

  /// x as the sum's terms take it.
  [[nodiscard]] GRADCOMP_HOST_DEVICE double scaled(T x) const noexcept {
    if constexpr (sizeof(T) == 4) return static_cast<double>(x);
    else
      return detail::scale_by_pow2(x, -exponent);
  }
};

/// The sum behind a block's scale, Σ|x_i| (sign_block_scale is its loop).
template <gradient_value T>
struct sign_magnitude_sum : block_sum<T> {
  using block_sum<T>::block_sum;

  /// Adds the next value's term.
  GRADCOMP_HOST_DEVICE void add(T x) noexcept { this->acc += this->scaled(from_bits<T>(magnitude_key(x))); }

  /// The scale of the block once its `count` values are added (0 when `max_abs` is 0).
  [[nodiscard]] GRADCOMP_HOST_DEVICE T scale(std::uint64_t count, T max_abs) const noexcept {
    if (!(max_abs > T{0})) return T{0};
    if constexpr (sizeof(T) == 4) {
      double mean = this->acc / static_cast<double>(count);
      const auto m = static_cast<double>(max_abs);
      mean = mean < m ? mean : m;
      return static_cast<T>(mean);
    } else {
      const double mean = detail::scale_by_pow2(this->acc / static_cast<double>(count), this->exponent);
      return mean < max_abs ? mean : max_abs;
    }
  }
};

/// Scale of a block of `count` ≥ 1 finite values whose largest magnitude is `max_abs`: their mean
/// magnitude, summed in the documented order (this file's comment); bf16 and fp16 values as their
/// float32 widenings (docs/half-precision.md), the scale a float32.
template <gradient_value X>
GRADCOMP_HOST_DEVICE inline compute_type<X> sign_block_scale(const X* x, std::uint64_t count,
                                                             compute_type<X> max_abs) noexcept {
  using T = compute_type<X>;
  if (!(max_abs > T{0})) return T{0};
  sign_magnitude_sum<T> sum(max_abs);
  for (std::uint64_t i = 0; i < count; ++i) sum.add(widen(x[i]));
  return sum.scale(count, max_abs);
}

/// Decoded value of a bit under a block scale: +0 for a zero scale, else ±scale.
template <gradient_value T>
GRADCOMP_HOST_DEVICE inline T sign_decoded(std::uint8_t bit, T scale) noexcept {
  if (scale == T{0}) return T{0};
  return bit != 0 ? -scale : scale;
}

}  // namespace gradcomp
