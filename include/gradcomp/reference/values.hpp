#pragma once
/// @file
/// Steps every reference backend shares: rejecting a gradient that holds NaN or ±Inf, the largest
/// magnitude of a block, the inner message of error feedback's and LoCo's compensated values, and
/// reading or writing the i-th value of a byte array (messages are byte arrays, so values in them
/// may be unaligned).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>
#include <gradcomp/core/narrowing.hpp>
#include <gradcomp/core/wire_envelope.hpp>

namespace gradcomp::detail::reference {

/// Throws `non_finite_input` naming the first value of `grad` that is NaN or ±Inf (every codec
/// rejects them: docs/design.md §6).
template <gradient_value T>
void require_finite(std::span<const T> grad) {
  for (std::uint64_t i = 0; i < grad.size(); ++i)
    require(is_finite(grad[i]), errc::non_finite_input,
            [&] { return "gradient value " + std::to_string(i) + " is NaN or Inf"; });
}

/// max |x_i| over x[begin, end) of finite values (+0 for a block of zeros of either sign), in the
/// compute type (a bf16 or fp16 value widened to float32 exactly).
template <gradient_value T>
[[nodiscard]] compute_type<T> max_magnitude(std::span<const T> x, std::uint64_t begin, std::uint64_t end) noexcept {
  compute_type<T> largest{0};
  for (std::uint64_t i = begin; i < end; ++i) largest = std::fmax(largest, std::fabs(widen(x[i])));
  return largest;
}

/// Writes `results` (in the compute type) to `out`: as they are, or narrowed to out's 16-bit type
/// (round to nearest even) after checking that none becomes ±Inf.
/// @throws error `narrowing_overflow` naming the first that would; `out` is then untouched.
template <gradient_value C, gradient_value O>
void store_results(const std::vector<C>& results, std::span<O> out) {
  if constexpr (half_precision<O>) {
    for (std::uint64_t i = 0; i < results.size(); ++i) require_narrows<O>(i, results[i]);
    for (std::uint64_t i = 0; i < results.size(); ++i) out[i] = narrow<O>(results[i]);
  } else {
    for (std::uint64_t i = 0; i < results.size(); ++i) out[i] = results[i];
  }
}

/// v (in the compute type) as an O: rounded to nearest even for a 16-bit O, else as it is.
template <gradient_value O, class R>
[[nodiscard]] O to_output(R v) noexcept {
  if constexpr (half_precision<O>) return narrow<O>(v);
  else
    return static_cast<O>(v);
}

/// Value j of the array of T values starting at `at`.
template <gradient_value T>
[[nodiscard]] T load_value(const std::byte* at, std::uint64_t j) noexcept {
  T v;
  std::memcpy(&v, at + j * sizeof(T), sizeof v);
  return v;
}

/// Writes `v` as value j of the array of T values starting at `at`.
template <gradient_value T>
void store_value(std::byte* at, std::uint64_t j, T v) noexcept {
  std::memcpy(at + j * sizeof(T), &v, sizeof v);
}

/// The plain step of error feedback and LoCo around `inner` (docs/feedback.md §1, §8): its message
/// of the compensated values h (in the compute type R) into `out`, and that message decoded into
/// `decoded` as every receiver will decode it. A 16-bit gradient's h is rounded to its type T first
/// (nearest even, into `rounded`: the rounding then joins the error; an fp16 h beyond 65504
/// becomes ±Inf, which the inner codec rejects); for float and double `rounded` is unused and T = R.
/// @return the message's size.
template <class Inner, class E, gradient_value T, class R>
std::size_t encode_compensated(const Inner& inner, const E& e, std::span<const R> h, std::span<T> rounded,
                               std::span<std::byte> out, std::span<R> decoded, std::span<std::byte> inner_ws,
                               message_key key) {
  std::size_t bytes = 0;
  if constexpr (half_precision<T>) {
    for (std::size_t i = 0; i < h.size(); ++i) rounded[i] = narrow<T>(h[i]);
    bytes = inner.encode(e, std::span<const T>(rounded), out, inner_ws, key);
  } else {
    bytes = inner.encode(e, h, out, inner_ws, key);
  }
  inner.decode(e, std::span<const std::byte>(out.first(bytes)), decoded, inner_ws);
  return bytes;
}

}  // namespace gradcomp::detail::reference
