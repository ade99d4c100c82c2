#pragma once
/// @file
/// Steps every reference backend shares: rejecting a gradient that holds NaN or ±Inf, the largest
/// magnitude of a block, and reading or writing the i-th value of a byte array (messages are
/// byte arrays, so values in them may be unaligned).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include <gradcomp/core/error.hpp>
#include <gradcomp/core/float_bits.hpp>

namespace gradcomp::detail::reference {

/// Throws `non_finite_input` naming the first value of `grad` that is NaN or ±Inf (every codec
/// rejects them: docs/design.md §6).
template <gradient_value T>
void require_finite(std::span<const T> grad) {
  for (std::uint64_t i = 0; i < grad.size(); ++i)
    require(is_finite(grad[i]), errc::non_finite_input,
            [&] { return "gradient value " + std::to_string(i) + " is NaN or Inf"; });
}

/// max |x_i| over x[begin, end) of finite values (+0 for a block of zeros of either sign).
template <gradient_value T>
[[nodiscard]] T max_magnitude(std::span<const T> x, std::uint64_t begin, std::uint64_t end) noexcept {
  T largest{0};
  for (std::uint64_t i = begin; i < end; ++i) largest = std::fmax(largest, std::fabs(x[i]));
  return largest;
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

}  // namespace gradcomp::detail::reference
