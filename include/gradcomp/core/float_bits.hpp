#pragma once
/// @file
/// Bit-level views of floating-point values: the order-preserving magnitude key used by radix
/// selection, and finiteness tests that keep working under `-ffast-math`.

#include <cstdint>
#include <cstring>
#include <type_traits>

#include <gradcomp/core/config.hpp>
#include <gradcomp/core/half_float.hpp>

namespace gradcomp {

/// Bit layout facts of a supported value type (`float`, `double`, `bf16`, `fp16`).
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

/// bfloat16 (core/half_float.hpp).
template <>
struct float_traits<bf16> {
  using bits_type = std::uint16_t;
  static constexpr int magnitude_bits = 15;
  static constexpr bits_type magnitude_mask = 0x7fffu;
  static constexpr bits_type infinity_key = 0x7f80u;
};

/// IEEE-754 binary16 (core/half_float.hpp).
template <>
struct float_traits<fp16> {
  using bits_type = std::uint16_t;
  static constexpr int magnitude_bits = 15;
  static constexpr bits_type magnitude_mask = 0x7fffu;
  static constexpr bits_type infinity_key = 0x7c00u;
};

/// The value types of gradients: `float`, `double`, and the 16-bit `bf16` and `fp16`
/// (docs/half-precision.md lists the codecs that take the 16-bit types so far).
template <class T>
concept gradient_value = requires { typename float_traits<T>::bits_type; };

/// The 16-bit gradient types, whose arithmetic is done in float32.
template <class T>
concept half_precision = std::is_same_v<T, bf16> || std::is_same_v<T, fp16>;

/// The type a codec computes a gradient of T in: float32 for the 16-bit types, T itself otherwise.
template <gradient_value T>
using compute_type = std::conditional_t<half_precision<T>, float, T>;

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
