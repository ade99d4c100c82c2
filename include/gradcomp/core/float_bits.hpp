#pragma once
/// @file
/// Bit-level views of floating-point values: the order-preserving magnitude key used by radix
/// selection, and finiteness tests that keep working under `-ffast-math`.

#include <cstdint>
#include <cstring>

#include <gradcomp/core/config.hpp>

namespace gradcomp {

/// Bit layout facts of a supported value type (`float`, `double`).
template <class T>
struct float_traits;

/// IEEE-754 binary32.
template <>
struct float_traits<float> {
  using bits_type = std::uint32_t;                                  ///< Unsigned integer of the same width.
  static constexpr int magnitude_bits = 31;                         ///< Bits of |x|'s key (no sign).
  static constexpr bits_type magnitude_mask = 0x7fffffffu;          ///< Clears the sign bit.
  static constexpr bits_type infinity_key = 0x7f800000u;            ///< Key of +Inf; NaN keys are larger.
};

/// IEEE-754 binary64.
template <>
struct float_traits<double> {
  using bits_type = std::uint64_t;
  static constexpr int magnitude_bits = 63;
  static constexpr bits_type magnitude_mask = 0x7fffffffffffffffull;
  static constexpr bits_type infinity_key = 0x7ff0000000000000ull;
};

/// The value types gradcomp codecs accept.
template <class T>
concept gradient_value = requires { typename float_traits<T>::bits_type; };

/// Raw bits of a value.
template <gradient_value T>
GRADCOMP_HOST_DEVICE inline typename float_traits<T>::bits_type to_bits(T value) noexcept {
  typename float_traits<T>::bits_type bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

/// Value of raw bits.
template <gradient_value T>
GRADCOMP_HOST_DEVICE inline T from_bits(typename float_traits<T>::bits_type bits) noexcept {
  T value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

/// Order-preserving key of |value|: for finite a, b, |a| < |b| exactly when key(a) < key(b); +0 and
/// -0 share key 0; Inf and NaN keys are at least `float_traits<T>::infinity_key`.
template <gradient_value T>
GRADCOMP_HOST_DEVICE inline typename float_traits<T>::bits_type magnitude_key(T value) noexcept {
  return to_bits(value) & float_traits<T>::magnitude_mask;
}

/// True unless the value is NaN or ±Inf. A bit test, so `-ffast-math` cannot fold it away.
template <gradient_value T>
GRADCOMP_HOST_DEVICE inline bool is_finite(T value) noexcept {
  return magnitude_key(value) < float_traits<T>::infinity_key;
}

}  // namespace gradcomp
